//! The kernel side as user space sees it: offsets read from BTF, the programs loaded
//! (`load`) and attached (`attach`), the runtime handle on them (`capture`), and their
//! ring-buffer events decoded; `host` says what this process may do on this kernel
//! (capabilities, kernel release). `netfilter` loads and links the forwarding program
//! at the netfilter hooks (an extension of aya), `node_links` in which namespaces;
//! `flowtables` finds the nftables flowtables that hide flows from both hooks.

pub mod attach;
pub mod batch;
pub mod btf;
pub mod capture;
pub mod conn_table;
pub mod decode;
pub mod flowtables;
pub mod host;
pub mod load;
pub mod mapped_array;
pub mod netfilter;
pub mod node_links;
pub mod offsets;
