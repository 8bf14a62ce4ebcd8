//! Field access to a connection's shared `ConnState`, and what is read from it by more
//! than one module (`conn` accounts a connection, `dns` copies its messages: both import
//! this, neither imports the other).
//!
//! A connection's packets run on several CPUs at once, so fields are read and written
//! one by one through `load!`/`store!` (volatile, so the compiler neither merges nor
//! caches them).

use observer_common::{conn::ConnState, dns::DNS_PORT};

/// Reads one field of a `*const/*mut ConnState`: `load!(state.field[index])`.
macro_rules! load {
    ($state:ident . $field:ident $([$index:expr])?) => {
        // SAFETY: `$state` points at a live map value (or this CPU's scratch slot or a
        // ring-buffer slot); the field is plain data, aligned within the repr(C) struct.
        unsafe { core::ptr::read_volatile(&raw const (*$state).$field $([$index])?) }
    };
}

/// Writes one field of a `*mut ConnState`: `store!(state.field[index], value)`. A store
/// of a field's own width never touches its neighbours.
macro_rules! store {
    ($state:ident . $field:ident $([$index:expr])?, $value:expr) => {
        let value = $value;
        // SAFETY: as in `load!`; the pointer is writable (a map value or scratch slot).
        unsafe { core::ptr::write_volatile(&raw mut (*$state).$field $([$index])?, value) }
    };
}

pub(crate) use {load, store};

/// Whether the connection's client dialed the DNS port.
#[inline(always)]
pub fn is_dns(state: *const ConnState) -> bool {
    // SAFETY: `state` points at a live map value or this CPU's scratch slot; the port is
    // written once, before the entry is inserted.
    unsafe { core::ptr::read_volatile(&raw const (*state).original.dst.port) == DNS_PORT }
}
