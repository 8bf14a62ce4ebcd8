//! A small reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find
//! struct member offsets by name, so the kernel programs work on any kernel that has
//! BTF without compiled-in offsets (Rust eBPF gets no CO-RE relocations today).
//!
//! Format: <https://docs.kernel.org/bpf/btf.html>.

use std::collections::HashMap;
use std::io::Read;

/// Errors reading BTF or finding a member in it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF ({0})")]
    NotBtf(String),
    #[error(
        "its header declares {0} bytes of types and strings, more than the {MAX_SIZE_MIB} MiB a kernel's BTF needs"
    )]
    TooLarge(u64),
    #[error("cannot read it: {0}")]
    Io(String),
    #[error("BTF data is truncated or malformed: {0}")]
    Malformed(&'static str),
    #[error(
        "this kernel lays out `{0}` unlike every kernel observer knows; its programs read it in one block"
    )]
    UnexpectedLayout(&'static str),
    #[error("BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("BTF struct `{0}` has no member `{1}`")]
    NoMember(String, String),
    #[error("BTF member path `{0}` indexes a type that is not an array")]
    NotArray(String),
    #[error(
        "BTF has {count} different structs `{name}` with members {paths}: cannot tell which one the kernel uses"
    )]
    Ambiguous {
        name: String,
        count: usize,
        paths: String,
    },
    #[error("BTF member `{0}.{1}` is a bitfield; observer's kernel programs read whole bytes")]
    Bitfield(String, String),
    #[error(
        "BTF member `{name}.{path}` is {found} bytes; observer's kernel programs read {expected}"
    )]
    Width {
        name: String,
        path: String,
        found: u32,
        expected: u32,
    },
}

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
const MAX_SIZE_MIB: u64 = 64;
/// vmlinux BTF is a few MiB (about 6 on Linux 6.18); anything far larger is not one.
const MAX_SIZE: u64 = MAX_SIZE_MIB << 20;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    /// Offset in bits from the start of the struct.
    bit_offset: u32,
    /// Width in bits of a bitfield member; 0 for a whole-byte member.
    bitfield_bits: u32,
}

/// Where a member is and how wide it is, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub offset: u32,
    pub size: u32,
}

#[derive(Clone, Debug)]
enum Type {
    /// Struct or union: size in bytes and members.
    Composite {
        size: u32,
        members: Vec<Member>,
    },
    Array {
        elem: u32,
        len: u32,
    },
    /// Typedef, const, volatile, restrict, type tag: refers to another type.
    Alias(u32),
    /// Any other type with a byte size (int, enum, float).
    Sized(u32),
    /// A pointer to the type with this id.
    Pointer(u32),
    /// A function prototype with this many parameters.
    FuncProto(u32),
    Other,
}

/// Parsed BTF types, with structs findable by name.
pub struct Btf {
    strings: Vec<u8>,
    /// Indexed by type id; id 0 is `void`.
    types: Vec<Type>,
    /// Every struct of each name: a name can occur more than once.
    structs: HashMap<String, Vec<u32>>,
    /// Typedefs by name (the type each names).
    typedefs: HashMap<String, u32>,
    /// The enumerators of each named enum: name offset in `strings`, value.
    enums: HashMap<String, Vec<(u32, i64)>>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(BtfError::Malformed("type section ends inside a type"))
}

/// Checks the header and returns the type and string sections.
fn sections(data: &[u8]) -> Result<(&[u8], &[u8]), BtfError> {
    declared_size(data)?;
    let header_len = u32_at(data, 4)? as usize;
    let type_off = u32_at(data, 8)? as usize;
    let type_len = u32_at(data, 12)? as usize;
    let str_off = u32_at(data, 16)? as usize;
    let str_len = u32_at(data, 20)? as usize;
    let types = data
        .get(header_len + type_off..header_len + type_off + type_len)
        .ok_or(BtfError::Malformed("type section out of bounds"))?;
    let strings = data
        .get(header_len + str_off..header_len + str_off + str_len)
        .ok_or(BtfError::Malformed("string section out of bounds"))?;
    Ok((types, strings))
}

/// Reads the `vlen` members of a struct or union at `*at` and moves `*at` past them.
fn members(
    data: &[u8],
    at: &mut usize,
    vlen: usize,
    kind_flag: bool,
) -> Result<Vec<Member>, BtfError> {
    let mut members = Vec::with_capacity(vlen);
    for _ in 0..vlen {
        let offset = u32_at(data, *at + 8)?;
        // With kind_flag the top 8 bits hold a bitfield size.
        let (bit_offset, bitfield_bits) = if kind_flag {
            (offset & 0x00ff_ffff, offset >> 24)
        } else {
            (offset, 0)
        };
        members.push(Member {
            name: u32_at(data, *at)?,
            ty: u32_at(data, *at + 4)?,
            bit_offset,
            bitfield_bits,
        });
        *at += 12;
    }
    Ok(members)
}

/// A kind whose trailing data observer skips: its type and how many bytes follow it.
fn plain_type(kind: u32, vlen: usize, size_or_type: u32) -> Result<(Type, usize), BtfError> {
    Ok(match kind {
        KIND_INT => (Type::Sized(size_or_type), 4),
        KIND_PTR => (Type::Pointer(size_or_type), 0),
        KIND_ENUM => (Type::Sized(size_or_type), 8 * vlen),
        KIND_ENUM64 => (Type::Sized(size_or_type), 12 * vlen),
        KIND_FLOAT => (Type::Sized(size_or_type), 0),
        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
            (Type::Alias(size_or_type), 0)
        }
        KIND_FWD | KIND_FUNC => (Type::Other, 0),
        KIND_FUNC_PROTO => (Type::FuncProto(vlen as u32), 8 * vlen),
        KIND_VAR | KIND_DECL_TAG => (Type::Other, 4),
        KIND_DATASEC => (Type::Other, 12 * vlen),
        _ => return Err(BtfError::Malformed("unknown type kind")),
    })
}

impl Btf {
    /// Where the running kernel exposes its BTF.
    pub const SYS_FS: &'static str = "/sys/kernel/btf/vmlinux";

    /// Reads BTF from a file or stream, looking at its header before reading the rest:
    /// input that is not BTF (even an endless one like `/dev/zero`) is refused after 24
    /// bytes, and no more than the header declares (at most 64 MiB) is read.
    pub fn read(input: impl Read) -> Result<Btf, BtfError> {
        Btf::parse(&Btf::read_data(input)?)
    }

    /// The bytes `read` parses, for other readers of the same BTF (aya's loader).
    pub fn read_data(mut input: impl Read) -> Result<Vec<u8>, BtfError> {
        let mut data = Vec::with_capacity(HEADER_LEN);
        (&mut input)
            .take(HEADER_LEN as u64)
            .read_to_end(&mut data)
            .map_err(|err| BtfError::Io(err.to_string()))?;
        let total = declared_size(&data)?;
        if total > MAX_SIZE {
            return Err(BtfError::TooLarge(total));
        }
        input
            .take(total - HEADER_LEN as u64)
            .read_to_end(&mut data)
            .map_err(|err| BtfError::Io(err.to_string()))?;
        Ok(data)
    }

    /// Parses little-endian BTF as the kernel exposes it.
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        let (types_data, strings) = sections(data)?;
        let mut btf = Btf {
            strings: strings.to_vec(),
            types: vec![Type::Other],
            structs: HashMap::new(),
            typedefs: HashMap::new(),
            enums: HashMap::new(),
        };
        let mut at = 0;
        while at < types_data.len() {
            let ty = btf.parse_type(types_data, &mut at)?;
            btf.types.push(ty);
        }
        Ok(btf)
    }

    /// Parses the type at `*at` and moves `*at` past it; registers named structs.
    fn parse_type(&mut self, data: &[u8], at: &mut usize) -> Result<Type, BtfError> {
        let name = u32_at(data, *at)?;
        let info = u32_at(data, *at + 4)?;
        let size_or_type = u32_at(data, *at + 8)?;
        *at += 12;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let kind_flag = info >> 31 == 1;
        match kind {
            KIND_ARRAY => {
                let elem = u32_at(data, *at)?;
                let len = u32_at(data, *at + 8)?;
                *at += 12;
                Ok(Type::Array { elem, len })
            }
            KIND_STRUCT | KIND_UNION => {
                let members = members(data, at, vlen, kind_flag)?;
                if kind == KIND_STRUCT {
                    self.register_struct(name)?;
                }
                Ok(Type::Composite {
                    size: size_or_type,
                    members,
                })
            }
            KIND_ENUM | KIND_ENUM64 => {
                let stride = if kind == KIND_ENUM { 8 } else { 12 };
                let signed = kind_flag;
                let mut values = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let entry = *at + i * stride;
                    let low = u32_at(data, entry + 4)?;
                    let value = if kind == KIND_ENUM {
                        if signed {
                            low as i32 as i64
                        } else {
                            low as i64
                        }
                    } else {
                        ((u32_at(data, entry + 8)? as i64) << 32) | low as i64
                    };
                    values.push((u32_at(data, entry)?, value));
                }
                *at += stride * vlen;
                let name = self.string(name)?;
                if !name.is_empty() {
                    self.enums.entry(name.to_owned()).or_insert(values);
                }
                Ok(Type::Sized(size_or_type))
            }
            _ => {
                if kind == KIND_TYPEDEF {
                    let name = self.string(name)?.to_owned();
                    self.typedefs.insert(name, size_or_type);
                }
                let (ty, trailing) = plain_type(kind, vlen, size_or_type)?;
                *at += trailing;
                Ok(ty)
            }
        }
    }

    /// The value of enumerator `member` of `enum name`, e.g. `enum_value("skb_drop_reason",
    /// "SKB_DROP_REASON_NETFILTER_DROP")`; `None` when either is not there.
    pub fn enum_value(&self, name: &str, member: &str) -> Option<i64> {
        self.enums
            .get(name)?
            .iter()
            .find(|(at, _)| self.string(*at).is_ok_and(|text| text == member))
            .map(|(_, value)| *value)
    }

    /// How many arguments tracepoint `name` passes its programs (`TP_PROTO`'s): from the
    /// `btf_trace_<name>` typedef, a pointer to a prototype whose first parameter is the
    /// tracepoint's private data. `None` when the kernel's BTF does not describe it.
    pub fn tracepoint_args(&self, name: &str) -> Option<u32> {
        let typedef = *self.typedefs.get(&format!("btf_trace_{name}"))?;
        let Type::Pointer(target) = self.resolve(typedef) else {
            return None;
        };
        match self.resolve(*target) {
            Type::FuncProto(params) => params.checked_sub(1),
            _ => None,
        }
    }

    /// Records that the struct about to be pushed (the next type id) has this name.
    fn register_struct(&mut self, name: u32) -> Result<(), BtfError> {
        let id = self.types.len() as u32;
        let name = self.string(name)?;
        if !name.is_empty() {
            self.structs.entry(name.to_owned()).or_default().push(id);
        }
        Ok(())
    }

    fn string(&self, offset: u32) -> Result<&str, BtfError> {
        let tail = self
            .strings
            .get(offset as usize..)
            .ok_or(BtfError::Malformed("string offset out of bounds"))?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).map_err(|_| BtfError::Malformed("string is not UTF-8"))
    }

    fn resolve(&self, mut id: u32) -> &Type {
        // Bounded: alias chains in real BTF are a few links long.
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(Type::Alias(target)) => id = *target,
                Some(ty) => return ty,
                None => return &Type::Other,
            }
        }
        &Type::Other
    }

    fn size_of(&self, id: u32) -> Option<u32> {
        match self.resolve(id) {
            Type::Composite { size, .. } | Type::Sized(size) => Some(*size),
            Type::Pointer(_) => Some(8),
            Type::Array { elem, len } => self.size_of(*elem).map(|size| size * len),
            Type::Alias(_) | Type::FuncProto(_) | Type::Other => None,
        }
    }

    /// Finds a member by name in a struct or union, looking through anonymous
    /// struct/union members as C does (a few levels deep: crafted BTF may loop).
    fn member(&self, composite: u32, name: &str, depth: u32) -> Option<(u32, &Member)> {
        let Type::Composite { members, .. } = self.resolve(composite) else {
            return None;
        };
        for member in members {
            let member_name = self.string(member.name).ok()?;
            if member_name == name {
                return Some((member.bit_offset, member));
            }
            if member_name.is_empty()
                && depth < 8
                && let Some((inner, found)) = self.member(member.ty, name, depth + 1)
            {
                return Some((member.bit_offset.saturating_add(inner), found));
            }
        }
        None
    }

    /// Where `path` is in the struct with type id `id` (called `name`), and its width.
    fn field_in(&self, id: u32, name: &str, path: &str) -> Result<Field, BtfError> {
        let mut ty = id;
        let mut bits = 0u32;
        let mut bitfield = false;
        for part in path.split('.') {
            let (field, index) = match part.split_once('[') {
                Some((field, rest)) => {
                    let index = rest
                        .trim_end_matches(']')
                        .parse::<u32>()
                        .map_err(|_| BtfError::NotArray(path.to_owned()))?;
                    (field, Some(index))
                }
                None => (part, None),
            };
            let (offset, member) = self
                .member(ty, field, 0)
                .ok_or_else(|| BtfError::NoMember(name.to_owned(), path.to_owned()))?;
            bits = bits.saturating_add(offset);
            ty = member.ty;
            bitfield = member.bitfield_bits != 0;
            if let Some(index) = index {
                let Type::Array { elem, .. } = self.resolve(ty) else {
                    return Err(BtfError::NotArray(path.to_owned()));
                };
                let elem = *elem;
                let size = self
                    .size_of(elem)
                    .ok_or(BtfError::Malformed("array element has no size"))?;
                bits = bits.saturating_add(index.saturating_mul(size).saturating_mul(8));
                ty = elem;
            }
        }
        if bitfield || !bits.is_multiple_of(8) {
            return Err(BtfError::Bitfield(name.to_owned(), path.to_owned()));
        }
        let size = self
            .size_of(ty)
            .ok_or(BtfError::Malformed("member type has no size"))?;
        Ok(Field {
            offset: bits / 8,
            size,
        })
    }

    /// The size of struct `name` and where each of `paths` is in it. When several
    /// structs have that name (BTF may hold more than one), the one that has every path
    /// is used; when more than one has them and they disagree, that is an error.
    pub fn fields(&self, name: &str, paths: &[&str]) -> Result<(u32, Vec<Field>), BtfError> {
        let ids = self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        let mut found: Vec<(u32, Vec<Field>)> = Vec::new();
        let mut first_error = None;
        for &id in ids {
            let fields: Result<Vec<Field>, BtfError> = paths
                .iter()
                .map(|path| self.field_in(id, name, path))
                .collect();
            match fields {
                Ok(fields) => {
                    let layout = (self.size_of(id).unwrap_or(0), fields);
                    if !found.contains(&layout) {
                        found.push(layout);
                    }
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        match found.len() {
            0 => Err(first_error.unwrap_or_else(|| BtfError::NoStruct(name.to_owned()))),
            1 => Ok(found.remove(0)),
            count => Err(BtfError::Ambiguous {
                name: name.to_owned(),
                count,
                paths: paths.join(", "),
            }),
        }
    }

    /// Byte offset of `path` in struct `name`, e.g. `offset_of("nf_conn",
    /// "tuplehash[1].tuple")` or `offset_of("net", "ns.inum")`.
    pub fn offset_of(&self, name: &str, path: &str) -> Result<u32, BtfError> {
        Ok(self.fields(name, &[path])?.1[0].offset)
    }
}

/// Checks the header (magic, version, lengths) and returns how many bytes the whole
/// BTF takes: header, types and strings.
fn declared_size(data: &[u8]) -> Result<u64, BtfError> {
    let not_btf = |why: String| Err(BtfError::NotBtf(why));
    if data.starts_with(b"\x7fELF") {
        return not_btf(
            "an ELF file; give the BTF itself, e.g. /sys/kernel/btf/vmlinux or the .BTF section of a vmlinux".to_owned(),
        );
    }
    if data.len() < HEADER_LEN {
        return not_btf(format!(
            "{} bytes, shorter than BTF's {HEADER_LEN}-byte header",
            data.len()
        ));
    }
    match u16::from_le_bytes([data[0], data[1]]) {
        MAGIC => {}
        magic if magic == MAGIC.swap_bytes() => {
            return not_btf("big-endian BTF; observer reads its own kernel's".to_owned());
        }
        _ => {
            return not_btf(format!(
                "starts with {:02x} {:02x}, not BTF's magic 9f eb",
                data[0], data[1]
            ));
        }
    }
    if data[2] != 1 {
        return not_btf(format!("version {}; observer reads version 1", data[2]));
    }
    let field = |at: usize| u32_at(data, at).map(u64::from);
    let header_len = field(4)?;
    if !(HEADER_LEN as u64..=4096).contains(&header_len) {
        return not_btf(format!("a header of {header_len} bytes"));
    }
    let types_end = field(8)? + field(12)?;
    let strings_end = field(16)? + field(20)?;
    Ok(header_len + types_end.max(strings_end))
}

#[cfg(test)]
pub(crate) mod tests;
