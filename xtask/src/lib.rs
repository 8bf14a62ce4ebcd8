//! Developer tasks for observer (`cargo xtask ...`). The library part is the lab, which
//! observer's root integration tests also use (see [`lab`]).

pub mod lab;
