//! Names connections, in two independent ways:
//! - [`services`]: which Kubernetes Service a connection went to, from kube-proxy's
//!   rules (iptables-save, nft JSON) read per network namespace and kept current by
//!   watching them change.
//! - [`pods`]: which pod owns an address, from the container runtime's sandbox bundles
//!   and, where none names a namespace, the hostnames of the processes in it.
//!
//! Both take text from the node; [`printable`] makes it safe to show.

pub mod pods;
pub mod printable;
pub mod services;
