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

/// Decodes one ring-buffer record of either kind onto the end of `conns` or `dns`,
/// checking its kind and length first (a record too short to hold a kind is a length
/// error). Each record is copied once, from the ring buffer into its vector.
pub fn push_kernel_event(
    bytes: &[u8],
    conns: &mut Vec<ConnEvent>,
    dns: &mut Vec<DnsEvent>,
) -> Result<(), DecodeError> {
    match bytes
        .get(..4)
        .map(|kind| u32::from_ne_bytes([kind[0], kind[1], kind[2], kind[3]]))
    {
        Some(EVENT_DNS) => push_decoded(bytes, dns),
        Some(EVENT_OPEN | EVENT_CLOSE) | None => push_decoded(bytes, conns),
        Some(kind) => Err(DecodeError::Kind(kind)),
    }
}

/// A `#[repr(C)]` type of plain data that every bit pattern is a valid value of.
///
/// # Safety
/// Only for such types.
unsafe trait PlainData: Sized {}

// SAFETY: both are `#[repr(C)]` integers and byte arrays (asserted in observer-common).
unsafe impl PlainData for ConnEvent {}
// SAFETY: as above.
unsafe impl PlainData for DnsEvent {}
// SAFETY: as above.
unsafe impl PlainData for RejectEvent {}

fn push_decoded<T: PlainData>(bytes: &[u8], out: &mut Vec<T>) -> Result<(), DecodeError> {
    check_length::<T>(bytes)?;
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

/// Decodes one connection record, checking its length first.
pub fn conn_event(bytes: &[u8]) -> Result<ConnEvent, DecodeError> {
    decoded(bytes)
}

/// Decodes one rejected-flow report, checking its length and kind.
pub fn reject_event(bytes: &[u8]) -> Result<RejectEvent, DecodeError> {
    let event: RejectEvent = decoded(bytes)?;
    if event.kind != EVENT_REJECT {
        return Err(DecodeError::Kind(event.kind));
    }
    Ok(event)
}

fn decoded<T: PlainData>(bytes: &[u8]) -> Result<T, DecodeError> {
    check_length::<T>(bytes)?;
    // SAFETY: the length is checked above, `T` is plain data (every bit pattern is a
    // value), and `read_unaligned` has no alignment needs.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn check_length<T>(bytes: &[u8]) -> Result<(), DecodeError> {
    let expected = std::mem::size_of::<T>();
    if bytes.len() < expected {
        return Err(DecodeError::Length {
            got: bytes.len(),
            expected,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_record_and_rejects_short_ones() {
        let mut event = ConnEvent {
            kind: EVENT_OPEN,
            conntrack: 0xffff_8880_1234_5600,
            ..Default::default()
        };
        event.state.requests = 30;
        // SAFETY: viewing a POD struct as bytes for the test.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const event).cast::<u8>(),
                std::mem::size_of::<ConnEvent>(),
            )
        };
        // An unaligned copy, as ring-buffer records may be.
        let mut unaligned = vec![0u8; bytes.len() + 1];
        unaligned[1..].copy_from_slice(bytes);
        assert_eq!(conn_event(&unaligned[1..]), Ok(event));
        assert_eq!(
            conn_event(&bytes[..100]),
            Err(DecodeError::Length {
                got: 100,
                expected: 232
            })
        );
    }

    #[test]
    fn dispatches_on_the_kind_and_checks_each_length() {
        let mut event = DnsEvent {
            len: 3,
            conntrack: 7,
            ..Default::default()
        };
        event.payload[..3].copy_from_slice(b"abc");
        // SAFETY: viewing a POD struct as bytes for the test.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const event).cast::<u8>(),
                std::mem::size_of::<DnsEvent>(),
            )
        };
        let (mut conns, mut dns) = (Vec::new(), Vec::new());
        let mut unaligned = vec![0u8; bytes.len() + 1];
        unaligned[1..].copy_from_slice(bytes);
        assert_eq!(
            push_kernel_event(&unaligned[1..], &mut conns, &mut dns),
            Ok(())
        );
        assert_eq!(
            push_kernel_event(&bytes[..300], &mut conns, &mut dns),
            Err(DecodeError::Length {
                got: 300,
                expected: 336
            })
        );
        assert!(push_kernel_event(&[], &mut conns, &mut dns).is_err());
        let conn = ConnEvent {
            kind: EVENT_OPEN,
            conntrack: 0xffff_8880_1234_5600,
            ..Default::default()
        };
        // SAFETY: as above.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const conn).cast::<u8>(),
                std::mem::size_of::<ConnEvent>(),
            )
        };
        assert_eq!(push_kernel_event(bytes, &mut conns, &mut dns), Ok(()));
        assert_eq!(
            push_kernel_event(&bytes[..231], &mut conns, &mut dns),
            Err(DecodeError::Length {
                got: 231,
                expected: 232
            })
        );
        assert_eq!((conns, dns), (vec![conn], vec![event]));
    }

    /// A record of a kind the programs never send is refused, not read as a close.
    #[test]
    fn unknown_kinds_are_refused() {
        let (mut conns, mut dns) = (Vec::new(), Vec::new());
        for kind in [0, 4, u32::MAX] {
            let event = ConnEvent {
                kind,
                ..Default::default()
            };
            // SAFETY: viewing a POD struct as bytes for the test.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&raw const event).cast::<u8>(),
                    std::mem::size_of::<ConnEvent>(),
                )
            };
            assert_eq!(
                push_kernel_event(bytes, &mut conns, &mut dns),
                Err(DecodeError::Kind(kind))
            );
        }
        assert_eq!((conns.len(), dns.len()), (0, 0));
    }
}
