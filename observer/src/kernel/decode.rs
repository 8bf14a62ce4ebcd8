//! Decoding of what the kernel programs hand over: ring-buffer records, their length
//! and kind checked. What their fields mean is the model's (`model::tuple`).

use observer_common::conn::{ConnEvent, EVENT_CLOSE, EVENT_OPEN};
use observer_common::dns::{DnsEvent, EVENT_DNS};
use observer_common::reject::{EVENT_REJECT, RejectEvent};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("ring-buffer record of {got} bytes, expected {expected}")]
    Length { got: usize, expected: usize },
    #[error("ring-buffer record of unknown kind {0}")]
    Kind(u32),
}

/// A ring-buffer record type: plain data (every bit pattern is a value) whose first
/// field is its kind, a `u32`.
///
/// # Safety
/// Only for `#[repr(C)]` types of integers and byte arrays (their sizes are asserted in
/// observer-common) that begin with a `u32` kind.
pub unsafe trait KernelRecord: Sized {
    /// The kinds a record of this type may carry.
    const KINDS: &'static [u32];
}

// SAFETY: `#[repr(C)]` integers and byte arrays, `kind: u32` first (observer-common).
unsafe impl KernelRecord for ConnEvent {
    const KINDS: &'static [u32] = &[EVENT_OPEN, EVENT_CLOSE];
}
// SAFETY: as above.
unsafe impl KernelRecord for DnsEvent {
    const KINDS: &'static [u32] = &[EVENT_DNS];
}
// SAFETY: as above.
unsafe impl KernelRecord for RejectEvent {
    const KINDS: &'static [u32] = &[EVENT_REJECT];
}

/// Decodes one ring-buffer record onto the end of `out`, checking its length and kind
/// first. Each record is copied once, from the ring buffer into its vector.
pub fn push_record<T: KernelRecord>(bytes: &[u8], out: &mut Vec<T>) -> Result<(), DecodeError> {
    check::<T>(bytes)?;
    out.reserve(1);
    // SAFETY: `reserve` made room for one more element past `len`; the length of
    // `bytes` is checked above; `T` is plain data, so its bytes make a valid value once
    // copied (a byte copy has no alignment needs); `set_len` then covers exactly the
    // element written.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            out.as_mut_ptr().add(out.len()).cast::<u8>(),
            std::mem::size_of::<T>(),
        );
        out.set_len(out.len() + 1);
    }
    Ok(())
}

/// Decodes one ring-buffer record, checking its length and kind first.
pub fn record<T: KernelRecord>(bytes: &[u8]) -> Result<T, DecodeError> {
    check::<T>(bytes)?;
    // SAFETY: the length is checked above, `T` is plain data (every bit pattern is a
    // value), and `read_unaligned` has no alignment needs.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Checks that `bytes` hold a whole `T` of one of its kinds.
fn check<T: KernelRecord>(bytes: &[u8]) -> Result<(), DecodeError> {
    let expected = std::mem::size_of::<T>();
    if bytes.len() < expected {
        return Err(DecodeError::Length {
            got: bytes.len(),
            expected,
        });
    }
    // A `T` holds at least its 4-byte kind.
    let kind = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if !T::KINDS.contains(&kind) {
        return Err(DecodeError::Kind(kind));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A POD struct's bytes.
    fn bytes_of<T>(value: &T) -> &[u8] {
        // SAFETY: viewing a POD struct as bytes for the test.
        unsafe {
            std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
    }

    #[test]
    fn decodes_a_record_and_rejects_short_ones() {
        let mut event = ConnEvent {
            kind: EVENT_OPEN,
            conntrack: 0xffff_8880_1234_5600,
            ..Default::default()
        };
        event.state.requests = 30;
        let bytes = bytes_of(&event);
        // An unaligned copy, as ring-buffer records may be.
        let mut unaligned = vec![0u8; bytes.len() + 1];
        unaligned[1..].copy_from_slice(bytes);
        assert_eq!(record::<ConnEvent>(&unaligned[1..]), Ok(event));
        assert_eq!(
            record::<ConnEvent>(&bytes[..100]),
            Err(DecodeError::Length {
                got: 100,
                expected: 232
            })
        );
        assert!(record::<ConnEvent>(&[]).is_err());
    }

    #[test]
    fn pushes_each_kind_into_its_vector_and_checks_each_length() {
        let mut event = DnsEvent {
            len: 3,
            conntrack: 7,
            ..Default::default()
        };
        event.payload[..3].copy_from_slice(b"abc");
        let bytes = bytes_of(&event);
        let (mut conns, mut dns) = (Vec::<ConnEvent>::new(), Vec::<DnsEvent>::new());
        let mut unaligned = vec![0u8; bytes.len() + 1];
        unaligned[1..].copy_from_slice(bytes);
        assert_eq!(push_record(&unaligned[1..], &mut dns), Ok(()));
        assert_eq!(
            push_record(&bytes[..300], &mut dns),
            Err(DecodeError::Length {
                got: 300,
                expected: 336
            })
        );
        assert!(push_record(&[], &mut dns).is_err());
        let conn = ConnEvent {
            kind: EVENT_CLOSE,
            conntrack: 0xffff_8880_1234_5600,
            ..Default::default()
        };
        let bytes = bytes_of(&conn);
        assert_eq!(push_record(bytes, &mut conns), Ok(()));
        assert_eq!(
            push_record(&bytes[..231], &mut conns),
            Err(DecodeError::Length {
                got: 231,
                expected: 232
            })
        );
        assert_eq!((conns, dns), (vec![conn], vec![event]));
    }

    /// A record of a kind its ring never carries (another ring's, or garbage) is
    /// refused, not read as a close.
    #[test]
    fn unknown_kinds_are_refused() {
        let (mut conns, mut dns) = (Vec::<ConnEvent>::new(), Vec::<DnsEvent>::new());
        for kind in [0, EVENT_DNS, EVENT_REJECT, u32::MAX] {
            let event = ConnEvent {
                kind,
                ..Default::default()
            };
            assert_eq!(
                push_record(bytes_of(&event), &mut conns),
                Err(DecodeError::Kind(kind))
            );
        }
        let open = ConnEvent {
            kind: EVENT_OPEN,
            ..Default::default()
        };
        // A connection event is longer than a DNS record's kind check needs.
        let mut long = bytes_of(&open).to_vec();
        long.resize(std::mem::size_of::<DnsEvent>(), 0);
        assert_eq!(
            push_record(&long, &mut dns),
            Err(DecodeError::Kind(EVENT_OPEN))
        );
        let reject = RejectEvent {
            kind: EVENT_DNS,
            ..Default::default()
        };
        assert_eq!(
            record::<RejectEvent>(bytes_of(&reject)),
            Err(DecodeError::Kind(EVENT_DNS))
        );
        assert_eq!((conns.len(), dns.len()), (0, 0));
    }
}
