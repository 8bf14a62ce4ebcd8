//! One file per hook family.

mod dev_queue;
mod local_delivery;
