//! Netlink's framing, bounds-checked and without sockets: the messages of a datagram and
//! the attributes of a block (include/uapi/linux/netlink.h). Shared by the ctnetlink
//! reader (`conntrack::parse`) and nf_tables' announcements (`naming::services::nft_changes`). Never
//! panics on malformed input.

/// `NLMSG_HDRLEN`; `sizeof(struct nfgenmsg)`, which every nfnetlink message starts with.
pub const HEADER_LEN: usize = 16;
pub const NFGENMSG_LEN: usize = 4;
/// `NLA_TYPE_MASK`: the attribute type without the nested / byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// A message or attribute whose length does not fit the bytes left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrun {
    pub len: usize,
    pub left: usize,
}

/// One message: its type, flags and what follows the header.
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub body: &'a [u8],
}

/// The messages of one datagram. A header that does not fit ends the walk with an
/// error: nothing after it can be located.
pub struct Messages<'a>(pub &'a [u8]);

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, Overrun>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let left = self.0.len();
        let Some(header) = self.0.get(..HEADER_LEN) else {
            self.0 = &[];
            return Some(Err(Overrun {
                len: HEADER_LEN,
                left,
            }));
        };
        let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len < HEADER_LEN || len > left {
            self.0 = &[];
            return Some(Err(Overrun { len, left }));
        }
        let message = Message {
            kind: u16::from_ne_bytes([header[4], header[5]]),
            flags: u16::from_ne_bytes([header[6], header[7]]),
            body: &self.0[HEADER_LEN..len],
        };
        self.0 = self.0.get(align(len)..).unwrap_or_default();
        Some(Ok(message))
    }
}

/// Netlink attributes: (type without flag bits, value); an error ends the walk.
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), Overrun>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let left = self.0.len();
        let len = self
            .0
            .get(..2)
            .map_or(0, |h| u16::from_ne_bytes([h[0], h[1]]) as usize);
        let (Some(header), Some(value)) = (self.0.get(..4), self.0.get(4..len)) else {
            self.0 = &[];
            return Some(Err(Overrun { len, left }));
        };
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        self.0 = self.0.get(align(len)..).unwrap_or_default();
        Some(Ok((kind, value)))
    }
}

/// The value of the first attribute of type `wanted`, if there is one; `Err` when the
/// block is malformed before it.
pub fn find(attrs: &[u8], wanted: u16) -> Result<Option<&[u8]>, Overrun> {
    for attr in Attrs(attrs) {
        let (kind, value) = attr?;
        if kind == wanted {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// `NLMSG_ALIGN` / `NLA_ALIGN`: 4 bytes.
pub fn align(len: usize) -> usize {
    (len + 3) & !3
}
