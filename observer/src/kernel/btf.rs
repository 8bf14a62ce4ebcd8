//! A small reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find
//! struct member offsets by name, so the kernel programs work on any kernel that has
//! BTF without compiled-in offsets (Rust eBPF gets no CO-RE relocations today).
//!
//! Format: <https://docs.kernel.org/bpf/btf.html>.

use std::collections::HashMap;

/// Errors reading BTF or finding a member in it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("BTF data is truncated or malformed: {0}")]
    Malformed(&'static str),
    #[error("BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("BTF struct `{0}` has no member `{1}`")]
    NoMember(String, String),
    #[error("BTF member path `{0}` indexes a type that is not an array")]
    NotArray(String),
}

const MAGIC: u16 = 0xeb9f;

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
    Pointer,
    Other,
}

/// Parsed BTF types, with structs findable by name.
pub struct Btf {
    strings: Vec<u8>,
    /// Indexed by type id; id 0 is `void`.
    types: Vec<Type>,
    structs: HashMap<String, u32>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(BtfError::Malformed("type section ends inside a type"))
}

impl Btf {
    /// Where the running kernel exposes its BTF.
    pub const SYS_FS: &'static str = "/sys/kernel/btf/vmlinux";

    /// Parses little-endian BTF as the kernel exposes it.
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        if data.len() < 24 {
            return Err(BtfError::Malformed("shorter than the BTF header"));
        }
        if u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let header_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_data = data
            .get(header_len + type_off..header_len + type_off + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = data
            .get(header_len + str_off..header_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();

        let mut btf = Btf {
            strings,
            types: vec![Type::Other],
            structs: HashMap::new(),
        };
        let mut at = 0;
        while at < types_data.len() {
            let name = u32_at(types_data, at)?;
            let info = u32_at(types_data, at + 4)?;
            let size_or_type = u32_at(types_data, at + 8)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                KIND_INT => {
                    at += 4;
                    Type::Sized(size_or_type)
                }
                KIND_PTR => Type::Pointer,
                KIND_ARRAY => {
                    let elem = u32_at(types_data, at)?;
                    let len = u32_at(types_data, at + 8)?;
                    at += 12;
                    Type::Array { elem, len }
                }
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let offset = u32_at(types_data, at + 8)?;
                        members.push(Member {
                            name: u32_at(types_data, at)?,
                            ty: u32_at(types_data, at + 4)?,
                            // With kind_flag the top 8 bits hold a bitfield size.
                            bit_offset: if kind_flag {
                                offset & 0x00ff_ffff
                            } else {
                                offset
                            },
                        });
                        at += 12;
                    }
                    if kind == KIND_STRUCT {
                        let id = btf.types.len() as u32;
                        let name = btf.string(name)?;
                        if !name.is_empty() {
                            btf.structs.entry(name.to_owned()).or_insert(id);
                        }
                    }
                    Type::Composite {
                        size: size_or_type,
                        members,
                    }
                }
                KIND_ENUM => {
                    at += 8 * vlen;
                    Type::Sized(size_or_type)
                }
                KIND_ENUM64 => {
                    at += 12 * vlen;
                    Type::Sized(size_or_type)
                }
                KIND_FLOAT => Type::Sized(size_or_type),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Type::Alias(size_or_type)
                }
                KIND_FWD | KIND_FUNC => Type::Other,
                KIND_FUNC_PROTO => {
                    at += 8 * vlen;
                    Type::Other
                }
                KIND_VAR | KIND_DECL_TAG => {
                    at += 4;
                    Type::Other
                }
                KIND_DATASEC => {
                    at += 12 * vlen;
                    Type::Other
                }
                _ => return Err(BtfError::Malformed("unknown type kind")),
            };
            btf.types.push(ty);
        }
        Ok(btf)
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
            Type::Pointer => Some(8),
            Type::Array { elem, len } => self.size_of(*elem).map(|size| size * len),
            Type::Alias(_) | Type::Other => None,
        }
    }

    /// Finds a member by name in a struct or union, looking through anonymous
    /// struct/union members as C does. Returns (bit offset, type id).
    fn member(&self, composite: u32, name: &str) -> Option<(u32, u32)> {
        let Type::Composite { members, .. } = self.resolve(composite) else {
            return None;
        };
        for member in members {
            let member_name = self.string(member.name).ok()?;
            if member_name == name {
                return Some((member.bit_offset, member.ty));
            }
            if member_name.is_empty()
                && let Some((inner, ty)) = self.member(member.ty, name)
            {
                return Some((member.bit_offset + inner, ty));
            }
        }
        None
    }

    /// Byte offset of `path` in struct `name`, e.g. `offset_of("nf_conn",
    /// "tuplehash[1].tuple")` or `offset_of("net", "ns.inum")`.
    pub fn offset_of(&self, name: &str, path: &str) -> Result<u32, BtfError> {
        let mut ty = *self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        let mut bits = 0u32;
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
            let (offset, member_ty) = self
                .member(ty, field)
                .ok_or_else(|| BtfError::NoMember(name.to_owned(), path.to_owned()))?;
            bits += offset;
            ty = member_ty;
            if let Some(index) = index {
                let Type::Array { elem, .. } = self.resolve(ty) else {
                    return Err(BtfError::NotArray(path.to_owned()));
                };
                let elem = *elem;
                let size = self
                    .size_of(elem)
                    .ok_or(BtfError::Malformed("array element has no size"))?;
                bits += index * size * 8;
                ty = elem;
            }
        }
        Ok(bits / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds BTF with: 1 = int (4 bytes), 2 = struct inner { int a; int b; },
    /// 3 = array of 2 inner, 4 = struct outer { int x; union { int y; }; inner arr[2]; },
    /// 5 = anonymous union { int y; }.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0b\0outer\0x\0y\0arr\0";
        let s = |name: &str| -> u32 {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut types: Vec<u32> = Vec::new();
        // 1: int
        types.extend([s("int"), KIND_INT << 24, 4, 32]);
        // 2: struct inner
        types.extend([s("inner"), (KIND_STRUCT << 24) | 2, 8]);
        types.extend([s("a"), 1, 0, s("b"), 1, 32]);
        // 3: array inner[2]
        types.extend([0, KIND_ARRAY << 24, 0, 2, 1, 2]);
        // 4: struct outer
        types.extend([s("outer"), (KIND_STRUCT << 24) | 3, 24]);
        types.extend([s("x"), 1, 0, 0, 5, 32, s("arr"), 3, 64]);
        // 5: union { int y; }
        types.extend([0, (KIND_UNION << 24) | 1, 4]);
        types.extend([s("y"), 1, 0]);
        let type_bytes: Vec<u8> = types.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut data = Vec::new();
        data.extend(MAGIC.to_le_bytes());
        data.extend([1u8, 0]);
        for v in [
            24u32,
            0,
            type_bytes.len() as u32,
            type_bytes.len() as u32,
            strings.len() as u32,
        ] {
            data.extend(v.to_le_bytes());
        }
        data.extend(type_bytes);
        data.extend(strings);
        data
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_arrays() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.offset_of("outer", "x"), Ok(0));
        assert_eq!(btf.offset_of("outer", "y"), Ok(4));
        assert_eq!(btf.offset_of("outer", "arr[0].a"), Ok(8));
        assert_eq!(btf.offset_of("outer", "arr[1].b"), Ok(20));
        assert_eq!(btf.offset_of("inner", "b"), Ok(4));
    }

    #[test]
    fn missing_names_are_errors() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(
            btf.offset_of("nope", "x"),
            Err(BtfError::NoStruct("nope".into()))
        );
        assert_eq!(
            btf.offset_of("outer", "z"),
            Err(BtfError::NoMember("outer".into(), "z".into()))
        );
        assert_eq!(
            btf.offset_of("outer", "x[1]"),
            Err(BtfError::NotArray("x[1]".into()))
        );
    }

    #[test]
    fn truncated_data_is_an_error_not_a_panic() {
        let data = sample();
        for len in [0, 10, 24, 40, data.len() - 1] {
            assert!(Btf::parse(&data[..len]).is_err(), "length {len}");
        }
    }
}
