//! The kernel side as user space sees it: offsets read from BTF, the programs loaded and
//! attached (`capture`), and their ring-buffer events decoded.

pub mod btf;
pub mod capture;
pub mod decode;
pub mod offsets;
