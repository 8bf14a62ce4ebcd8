//! The BTF reader against hand-built type sections.

use super::*;

/// Builds BTF type by type, for tests here and in `offsets`.
#[derive(Default)]
pub struct Builder {
    strings: Vec<u8>,
    types: Vec<u32>,
    count: u32,
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            strings: vec![0],
            ..Builder::default()
        }
    }

    fn name(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let at = self.strings.len() as u32;
        self.strings.extend(name.as_bytes());
        self.strings.push(0);
        at
    }

    fn push(&mut self, words: &[u32]) -> u32 {
        self.types.extend(words);
        self.count += 1;
        self.count
    }

    pub fn int(&mut self, name: &str, bytes: u32) -> u32 {
        let name = self.name(name);
        self.push(&[name, KIND_INT << 24, bytes, bytes * 8])
    }

    pub fn pointer(&mut self) -> u32 {
        self.push(&[0, KIND_PTR << 24, 0])
    }

    pub fn pointer_to(&mut self, target: u32) -> u32 {
        self.push(&[0, KIND_PTR << 24, target])
    }

    pub fn typedef(&mut self, name: &str, target: u32) -> u32 {
        let name = self.name(name);
        self.push(&[name, KIND_TYPEDEF << 24, target])
    }

    /// A prototype with `params` unnamed parameters of type `ty`.
    pub fn func_proto(&mut self, params: u32, ty: u32) -> u32 {
        let mut words = vec![0, (KIND_FUNC_PROTO << 24) | params, 0];
        for _ in 0..params {
            words.extend([0, ty]);
        }
        self.push(&words)
    }

    /// A 4-byte enum with (name, value) enumerators.
    pub fn enumeration(&mut self, name: &str, values: &[(&str, u32)]) -> u32 {
        let mut words = vec![self.name(name), (KIND_ENUM << 24) | values.len() as u32, 4];
        for (member, value) in values {
            words.extend([self.name(member), *value]);
        }
        self.push(&words)
    }

    /// A struct with (name, type, bit offset) members.
    pub fn structure(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
        let mut words = vec![
            self.name(name),
            (KIND_STRUCT << 24) | members.len() as u32,
            size,
        ];
        for (member, ty, bits) in members {
            words.extend([self.name(member), *ty, *bits]);
        }
        self.push(&words)
    }

    pub fn finish(&self) -> Vec<u8> {
        let type_bytes: Vec<u8> = self.types.iter().flat_map(|v| v.to_le_bytes()).collect();
        header(type_bytes.len() as u32, self.strings.len() as u32)
            .into_iter()
            .chain(type_bytes)
            .chain(self.strings.iter().copied())
            .collect()
    }
}

/// A BTF header for these section lengths (types first, then strings).
fn header(type_len: u32, str_len: u32) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend(MAGIC.to_le_bytes());
    data.extend([1u8, 0]);
    for v in [24u32, 0, type_len, type_len, str_len] {
        data.extend(v.to_le_bytes());
    }
    data
}

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

#[test]
fn a_name_used_twice_resolves_to_the_struct_with_the_members() {
    let mut b = Builder::new();
    let int = b.int("int", 4);
    let byte = b.int("u8", 1);
    // An empty declaration, an older layout without `b`, and the real one.
    b.structure("conn", 0, &[]);
    b.structure("conn", 1, &[("a", byte, 0)]);
    b.structure("conn", 8, &[("a", int, 0), ("b", int, 32)]);
    let btf = Btf::parse(&b.finish()).unwrap();
    assert_eq!(
        btf.fields("conn", &["a", "b"]),
        Ok((
            8,
            vec![Field { offset: 0, size: 4 }, Field { offset: 4, size: 4 }]
        ))
    );
    // Only `a`: two layouts have it and disagree.
    assert_eq!(
        btf.fields("conn", &["a"]).unwrap_err().to_string(),
        "BTF has 2 different structs `conn` with members a: cannot tell which one the kernel uses"
    );
    // A second, identical definition is no ambiguity.
    b.structure("conn", 8, &[("a", int, 0), ("b", int, 32)]);
    let btf = Btf::parse(&b.finish()).unwrap();
    assert_eq!(btf.offset_of("conn", "b"), Ok(4));
    // Two complete layouts that both have every member, differently placed.
    b.structure("conn", 8, &[("b", int, 0), ("a", int, 32)]);
    let btf = Btf::parse(&b.finish()).unwrap();
    assert!(matches!(
        btf.fields("conn", &["a", "b"]),
        Err(BtfError::Ambiguous { count: 2, .. })
    ));
    assert_eq!(
        btf.fields("conn", &["c"]),
        Err(BtfError::NoMember("conn".into(), "c".into()))
    );
}

#[test]
fn widths_come_with_offsets_and_bitfields_are_refused() {
    let mut b = Builder::new();
    let int = b.int("int", 4);
    let short = b.int("u16", 2);
    let pointer = b.pointer();
    b.structure(
        "s",
        16,
        &[("p", pointer, 0), ("n", short, 64), ("i", int, 96)],
    );
    let mut data = b.finish();
    let btf = Btf::parse(&data).unwrap();
    assert_eq!(
        btf.fields("s", &["p", "n", "i"]).unwrap().1,
        [
            Field { offset: 0, size: 8 },
            Field { offset: 8, size: 2 },
            Field {
                offset: 12,
                size: 4
            }
        ]
    );
    // The same struct with kind_flag set and `n` a 3-bit bitfield.
    let info_at = 24 + 4 * 4 + 4 * 4 + 3 * 4 + 4;
    data[info_at + 3] |= 0x80;
    data[24 + 4 * 4 + 4 * 4 + 3 * 4 + 12 + 12 + 8 + 3] = 3;
    let btf = Btf::parse(&data).unwrap();
    assert_eq!(
        btf.fields("s", &["n"]),
        Err(BtfError::Bitfield("s".into(), "n".into()))
    );
    assert_eq!(btf.offset_of("s", "i"), Ok(12));
}

#[test]
fn input_that_is_not_btf_is_refused_from_its_header() {
    let zero = std::fs::File::open("/dev/zero").unwrap();
    assert_eq!(
        Btf::read(zero).err().unwrap().to_string(),
        "not BTF (starts with 00 00, not BTF's magic 9f eb)"
    );
    let elf = Btf::read(&b"\x7fELF\x02\x01\x01"[..]).err().unwrap();
    assert!(elf.to_string().starts_with("not BTF (an ELF file"), "{elf}");
    let short = Btf::read(&[0x9f, 0xeb, 1][..]).err().unwrap();
    assert_eq!(
        short.to_string(),
        "not BTF (3 bytes, shorter than BTF's 24-byte header)"
    );
    let mut big_endian = sample();
    big_endian.swap(0, 1);
    assert!(matches!(
        Btf::read(&big_endian[..]),
        Err(BtfError::NotBtf(why)) if why.starts_with("big-endian")
    ));
    // A header that declares 3 GiB: refused before reading on.
    let huge = header(3 << 30, 8);
    assert_eq!(
        Btf::read(huge.as_slice().chain(std::io::repeat(0))).err(),
        Some(BtfError::TooLarge(24 + (3 << 30) + 8))
    );
    // Real BTF followed by endless bytes: only what the header declares is read.
    let data = sample();
    let btf = Btf::read(data.as_slice().chain(std::io::repeat(0xff))).unwrap();
    assert_eq!(btf.offset_of("outer", "arr[1].b"), Ok(20));
    // A file that ends early.
    assert_eq!(
        Btf::read(&data[..data.len() - 1]).err(),
        Some(BtfError::Malformed("string section out of bounds"))
    );
}

#[test]
fn enumerators_and_tracepoint_arguments_are_found_by_name() {
    let mut b = Builder::new();
    let int = b.int("int", 4);
    b.enumeration(
        "skb_drop_reason",
        &[
            ("SKB_NOT_DROPPED_YET", 0),
            ("SKB_DROP_REASON_NETFILTER_DROP", 11),
        ],
    );
    // kfree_skb as Linux 6.18 has it: private data, skb, location, reason, rx_sk.
    let proto = b.func_proto(5, int);
    let pointer = b.pointer_to(proto);
    b.typedef("btf_trace_kfree_skb", pointer);
    let btf = Btf::parse(&b.finish()).unwrap();
    assert_eq!(
        btf.enum_value("skb_drop_reason", "SKB_DROP_REASON_NETFILTER_DROP"),
        Some(11)
    );
    assert_eq!(btf.enum_value("skb_drop_reason", "NO_SUCH"), None);
    assert_eq!(btf.enum_value("no_such_enum", "SKB_NOT_DROPPED_YET"), None);
    assert_eq!(btf.tracepoint_args("kfree_skb"), Some(4));
    assert_eq!(btf.tracepoint_args("net_dev_queue"), None);
}
