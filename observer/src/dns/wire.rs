//! A DNS message's header and first question (RFC 1035 4.1), from at most its first few
//! hundred bytes. Every length is checked against the bytes there are: malformed,
//! truncated or hostile input (compression loops, lengths past the end, oversized
//! labels) is an error, never a panic or an endless loop.

/// The header's size.
pub const HEADER: usize = 12;
/// Longest name on the wire (RFC 1035 2.3.4), length bytes included.
const MAX_NAME: usize = 255;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("{got} bytes, shorter than a DNS header")]
    ShortHeader { got: usize },
    #[error("no question (qdcount 0)")]
    NoQuestion,
    #[error("the question runs past the {len} bytes there are")]
    PastEnd { len: usize },
    #[error("a name longer than 255 bytes")]
    NameTooLong,
    #[error("a compression pointer that does not point back (loop or forward jump)")]
    PointerLoop,
    #[error("reserved label type {0:#04x}")]
    LabelType(u8),
}

/// What observer reads of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub id: u16,
    /// QR: a response (true) or a query.
    pub response: bool,
    /// RCODE (low 4 bits of the header's second flags byte); 0 in queries.
    pub rcode: u8,
    /// The first question's name, ASCII lower-cased, dot-separated, without the trailing
    /// dot ("." for the root); bytes outside `[!-~]` as `\DDD`, dots and backslashes inside labels as `\.` and `\\`.
    pub name: String,
    pub qtype: u16,
}

/// Decodes a message (UDP: the whole payload; TCP: what follows its 2-byte length).
pub fn decode(bytes: &[u8]) -> Result<Message, WireError> {
    if bytes.len() < HEADER {
        return Err(WireError::ShortHeader { got: bytes.len() });
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let response = bytes[2] & 0x80 != 0;
    let rcode = bytes[3] & 0x0f;
    let qdcount = u16::from_be_bytes([bytes[4], bytes[5]]);
    if qdcount == 0 {
        return Err(WireError::NoQuestion);
    }
    let (name, end) = read_name(bytes, HEADER)?;
    let fixed = bytes
        .get(end..end + 4)
        .ok_or(WireError::PastEnd { len: bytes.len() })?;
    Ok(Message {
        id,
        response,
        rcode,
        name,
        qtype: u16::from_be_bytes([fixed[0], fixed[1]]),
    })
}

/// Reads the name starting at `start`; returns it and the offset after it (after the
/// first pointer, when it is compressed). Each pointer must point before the label that
/// holds it, so a name is read in at most `bytes.len()` steps.
fn read_name(bytes: &[u8], start: usize) -> Result<(String, usize), WireError> {
    let past_end = || WireError::PastEnd { len: bytes.len() };
    let mut name = String::new();
    let mut at = start;
    // Where the question continues after the name: set at the first pointer.
    let mut after = None;
    // Pointers must go strictly backwards from here.
    let mut limit = start;
    let mut wire_len = 1;
    loop {
        let len = *bytes.get(at).ok_or_else(past_end)? as usize;
        match len & 0xc0 {
            0x00 => {}
            0xc0 => {
                let low = *bytes.get(at + 1).ok_or_else(past_end)? as usize;
                let target = ((len & 0x3f) << 8) | low;
                if target >= limit {
                    return Err(WireError::PointerLoop);
                }
                after.get_or_insert(at + 2);
                limit = target;
                at = target;
                continue;
            }
            // 0x40 and 0x80: extended and reserved label types, which also bound a
            // label to 63 bytes (RFC 1035 2.3.4, RFC 6891).
            _ => return Err(WireError::LabelType(len as u8)),
        }
        if len == 0 {
            break;
        }
        wire_len += len + 1;
        if wire_len > MAX_NAME {
            return Err(WireError::NameTooLong);
        }
        let label = bytes.get(at + 1..at + 1 + len).ok_or_else(past_end)?;
        if !name.is_empty() {
            name.push('.');
        }
        push_label(&mut name, label);
        at += 1 + len;
    }
    if name.is_empty() {
        name.push('.');
    }
    Ok((name, after.unwrap_or(at + 1)))
}

/// Appends a label in presentation format (RFC 4343 escapes), lower-cased.
fn push_label(name: &mut String, label: &[u8]) {
    for &byte in label {
        match byte {
            b'.' | b'\\' => {
                name.push('\\');
                name.push(byte as char);
            }
            b'!'..=b'~' => name.push(byte.to_ascii_lowercase() as char),
            _ => name.push_str(&format!("\\{byte:03}")),
        }
    }
}

/// The mnemonic of a query type (RFC 3597's `TYPEnnn` for the others).
pub fn qtype_name(qtype: u16) -> String {
    let known = match qtype {
        1 => "A",
        2 => "NS",
        5 => "CNAME",
        6 => "SOA",
        12 => "PTR",
        15 => "MX",
        16 => "TXT",
        28 => "AAAA",
        33 => "SRV",
        41 => "OPT",
        64 => "SVCB",
        65 => "HTTPS",
        255 => "ANY",
        _ => return format!("TYPE{qtype}"),
    };
    known.to_owned()
}

/// The mnemonic of a response code (RFC 1035, 2136); `RCODEn` for the others.
pub fn rcode_name(rcode: u8) -> String {
    let known = match rcode {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        _ => return format!("RCODE{rcode}"),
    };
    known.to_owned()
}

/// Builds messages (tests and benches): a header with one question, and for responses
/// no records (what observer reads lies before them).
pub fn build(id: u16, response: bool, rcode: u8, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + name.len() + 6);
    out.extend_from_slice(&id.to_be_bytes());
    out.push(if response { 0x81 } else { 0x01 });
    out.push(if response { 0x80 | rcode } else { 0 });
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out
}
