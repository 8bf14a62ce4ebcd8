//! One file per hook family.

mod dev_queue;
