//! Field access to a connection's shared `ConnState`, and what is read from it by more
//! than one module (`conn` accounts a connection, `dns` copies its messages: both import
//! this, neither imports the other).
//!
//! A connection's packets run on several CPUs at once, so fields are read and written
//! one by one through `load!`/`store!` (volatile, so the compiler neither merges nor
//! caches them).

use observer_common::{conn::ConnState, dns::DNS_PORT};

pub(crate) use observer_common::{load, store};

/// Whether the connection's client dialed the DNS port.
#[inline(always)]
pub fn is_dns(state: *const ConnState) -> bool {
    // SAFETY: `state` points at a live map value or this CPU's scratch slot; the port is
    // written once, before the entry is inserted.
    unsafe { core::ptr::read_volatile(&raw const (*state).original.dst.port) == DNS_PORT }
}
