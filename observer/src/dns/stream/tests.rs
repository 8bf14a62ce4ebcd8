// One message per segment is a vector of one range, not a range to expand.
#![allow(clippy::single_range_in_vec_init)]

use super::*;

/// `messages` each with its 2-byte length.
fn framed(lengths: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend(std::iter::repeat_n(i as u8, len));
    }
    out
}

#[test]
fn one_message_per_segment() {
    let bytes = framed(&[30]);
    let first = frame(None, 100, 32, &bytes);
    assert_eq!(
        first,
        Framed {
            messages: vec![2..32],
            unread: 0,
            next: 132
        }
    );
    let second = frame(Some(132), 132, 32, &bytes);
    assert_eq!((second.messages, second.next), (vec![2..32], 164));
}

#[test]
fn several_messages_in_one_segment() {
    let bytes = framed(&[30, 40, 10]);
    let f = frame(Some(5), 5, bytes.len() as u32, &bytes);
    assert_eq!(f.messages, vec![2..32, 34..74, 76..86]);
    assert_eq!((f.unread, f.next), (0, 5 + 86));
}

#[test]
fn a_message_split_over_segments() {
    // A 300-byte message: the first segment holds its length and 98 bytes, of which the
    // kernel copied 64; the second segment continues it, then starts another.
    let whole = framed(&[300, 20]);
    let first = frame(None, 1, 100, &whole[..64]);
    assert_eq!(
        (first.messages, first.unread, first.next),
        (vec![2..64], 0, 303)
    );
    let second = frame(Some(303), 101, 224, &whole[100..]);
    // The other message starts at stream byte 303, 202 bytes into the second segment.
    assert_eq!(second.messages, vec![204..224]);
    assert_eq!(second.next, 325);
    // A segment wholly inside a message starts nothing.
    let inside = frame(Some(303), 101, 150, &whole[100..250]);
    assert_eq!(
        (inside.messages.len(), inside.unread, inside.next),
        (0, 0, 303)
    );
}

#[test]
fn a_length_past_the_copied_bytes_is_counted() {
    let bytes = framed(&[200, 30]);
    // 234 payload bytes, 100 copied: the second length (at 202) was not copied.
    let f = frame(Some(0), 0, 234, &bytes[..100]);
    assert_eq!((f.messages, f.unread, f.next), (vec![2..100], 1, 234));
    // The stream resumes at the next segment.
    assert_eq!(
        frame(Some(f.next), 234, 32, &framed(&[30])).messages,
        vec![2..32]
    );
}

#[test]
fn retransmissions_and_gaps() {
    let bytes = framed(&[30]);
    // A retransmission of a segment already framed.
    let again = frame(Some(132), 100, 32, &bytes);
    assert_eq!((again.messages.len(), again.next), (0, 132));
    // A segment after bytes never seen: resumed there.
    let after_gap = frame(Some(132), 500, 32, &bytes);
    assert_eq!((after_gap.messages, after_gap.next), (vec![2..32], 532));
    // A retransmission that also carries new bytes: the new message is read.
    let mut both = framed(&[30]);
    both.extend(framed(&[10]));
    let extended = frame(Some(132), 100, 44, &both);
    assert_eq!((extended.messages, extended.next), (vec![34..44], 144));
}

#[test]
fn sequence_numbers_wrap() {
    let bytes = framed(&[30, 10]);
    let start = u32::MAX - 10;
    let f = frame(None, start, 44, &bytes);
    assert_eq!(f.next, start.wrapping_add(44));
    assert_eq!(f.next, 33);
    let again = frame(Some(f.next), start, 44, &bytes);
    assert!(again.messages.is_empty());
}

#[test]
fn empty_messages_and_short_copies_end() {
    // Zero-length messages still advance; a segment shorter than its copy is cut.
    let f = frame(None, 0, 4, &[0, 0, 0, 0, 9, 9]);
    assert_eq!((f.messages, f.next), (vec![2..2, 4..4], 4));
}

#[test]
fn arbitrary_segments_stay_in_bounds() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let copied: Vec<u8> = (0..next() % 300).map(|_| next() as u8).collect();
        let segment = (next() % 600) as u32;
        let seq = next() as u32;
        let start = if next() % 2 == 0 {
            None
        } else {
            Some(seq.wrapping_add((next() % 700) as u32).wrapping_sub(50))
        };
        let f = frame(start, seq, segment, &copied);
        let len = copied.len().min(segment as usize);
        assert!(f.messages.iter().all(|r| r.start <= r.end && r.end <= len));
    }
}
