pub mod lab {}
