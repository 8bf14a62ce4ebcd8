//! One file per hook family.

mod dev_queue;
mod dns_egress;
mod forward_netfilter;
mod local_delivery;
mod netfilter_drop;
mod revalidate;
