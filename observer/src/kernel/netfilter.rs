//! The forwarding hook as a netfilter program (`BPF_PROG_TYPE_NETFILTER`, Linux 6.4+):
//! a small extension of aya 0.14, which has neither the program type nor its link.
//!
//! The program (observer-ebpf's `hooks/forward_netfilter.rs`) sits in the same object as
//! the others, in a section aya's parser accepts but observer never asks aya to load.
//! Here the object is parsed again with aya's own parser (`aya-obj`, the version aya
//! uses), its map references are pointed at the maps aya created, and the program is
//! loaded and linked with `bpf(2)` directly:
//!
//! - `BPF_PROG_LOAD` with `prog_type` `BPF_PROG_TYPE_NETFILTER` and
//!   `expected_attach_type` `BPF_NETFILTER`;
//! - `BPF_LINK_CREATE` with `attach_type` `BPF_NETFILTER` and `link_create.netfilter`
//!   `{ pf, hooknum, priority, flags }` (include/uapi/linux/bpf.h). The kernel links it
//!   in the calling thread's network namespace (net/netfilter/nf_bpf_link.c,
//!   `bpf_nf_link_attach`), so a link per namespace is made from a thread inside it.
//!
//! A link lives as long as its descriptor; dropping it unhooks the program.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};

use aya::Ebpf;
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type};

/// The program's name in the object.
pub const PROGRAM: &str = "forward_netfilter";

/// Its name in the kernel (`bpftool prog`, `cargo xtask bench`): at most 15 bytes.
pub const KERNEL_NAME: &str = "forward_nf";

/// `NFPROTO_IPV4` and `NFPROTO_IPV6`.
const FAMILIES: [(u32, &str); 2] = [(2, "IPv4"), (10, "IPv6")];

/// `NF_INET_LOCAL_IN` and `NF_INET_POST_ROUTING`: every packet a namespace delivers to
/// itself or sends on (forwarded or its own), after every NAT decision.
const HOOKS: [u32; 2] = [1, 4];

/// Just before conntrack confirms: `NF_IP_PRI_CONNTRACK_CONFIRM` is `INT_MAX` (which a
/// link may not take), except IPv6's LOCAL_IN confirmation at `INT_MAX - 1`
/// (net/netfilter/nf_conntrack_proto.c, `ipv6_conntrack_ops`). A link may not share its
/// priority with any other hook of its namespace, family and hook (`-EBUSY`,
/// net/netfilter/core.c `nf_hook_entries_grow`), such as another observer's: the next
/// lower priorities are tried, down to `PRIORITIES` of them, all after every NAT hook.
fn first_priority(pf: u32, hooknum: u32) -> i32 {
    if pf == 10 && hooknum == 1 {
        i32::MAX - 2
    } else {
        i32::MAX - 1
    }
}

/// How many priorities below the first a link tries.
const PRIORITIES: i32 = 16;

/// How much of the verifier's log a refusal keeps (the log of a program this size is
/// a few MiB; a buffer too small for it fails the load).
const LOG_BYTES: usize = 16 << 20;

/// Why the netfilter program could not be loaded or linked.
#[derive(Debug, thiserror::Error)]
pub enum NetfilterError {
    #[error("cannot parse the object again: {0}")]
    Parse(#[from] aya_obj::ParseError),
    #[error("program {PROGRAM} is missing from the object")]
    Missing,
    #[error("map {0} of the object was not created")]
    MapMissing(String),
    #[error("cannot relocate the program: {0}")]
    Relocate(#[from] aya_obj::relocation::EbpfRelocationError),
    #[error("the kernel's BTF, which names the kernel functions it calls, is unreadable ({0})")]
    NoKernelBtf(String),
    #[error("the kernel has no function {0} for it to call")]
    NoKfunc(&'static str),
    #[error("the kernel refused to load it ({error}){}", verdict(.log))]
    Load { error: std::io::Error, log: String },
    #[error("the kernel refused to link it at netfilter hook {hooknum} for {family} ({error})")]
    Link {
        family: &'static str,
        hooknum: u32,
        error: std::io::Error,
    },
}

/// The verifier log's last line, when there is one.
fn verdict(log: &str) -> String {
    log.lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .map(|line| format!(": {}", line.trim()))
        .unwrap_or_default()
}

/// The loaded program, ready to be linked in namespaces.
#[derive(Debug)]
pub struct NetfilterProgram {
    fd: OwnedFd,
}

/// One namespace's links (both hooks, each family the namespace has); dropping them
/// unhooks the program there.
#[derive(Debug)]
pub struct Links {
    _links: Vec<OwnedFd>,
    pub families: Vec<&'static str>,
}

impl NetfilterProgram {
    /// Loads the program from `object` (the bytes aya loaded `ebpf` from), its map
    /// references pointed at `ebpf`'s maps and its kernel function calls at the
    /// functions of the running kernel's BTF `vmlinux`. Call before any map is taken out
    /// of `ebpf`.
    pub fn load(
        object: &[u8],
        ebpf: &Ebpf,
        vmlinux: Result<&aya::Btf, &str>,
    ) -> Result<NetfilterProgram, NetfilterError> {
        let mut obj = aya_obj::Object::parse(object)?;
        let created: Vec<(String, i32)> = ebpf
            .maps()
            .map(|(name, map)| (name.to_owned(), map_data(map).fd().as_fd().as_raw_fd()))
            .collect();
        let mut maps = Vec::new();
        for (name, definition) in &obj.maps {
            let fd = created
                .iter()
                .find(|(created, _)| created == name)
                .map(|(_, fd)| *fd)
                .ok_or_else(|| NetfilterError::MapMissing(name.clone()))?;
            maps.push((name.clone(), fd, definition.clone()));
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(index, _)| *index).collect();
        obj.relocate_maps(
            maps.iter()
                .map(|(name, fd, definition)| (name.as_str(), *fd, definition)),
            &text_sections,
        )?;
        obj.relocate_calls(&text_sections)?;
        let program = obj.programs.get(PROGRAM).ok_or(NetfilterError::Missing)?;
        let function = obj
            .functions
            .get(&program.function_key())
            .ok_or(NetfilterError::Missing)?;
        let mut instructions = function.instructions.clone();
        let vmlinux = vmlinux.map_err(|error| NetfilterError::NoKernelBtf(error.to_owned()))?;
        call_kfuncs(&mut instructions, |name| {
            vmlinux
                .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
                .ok()
        })?;
        let fd = load_program(&instructions, &program.license)?;
        Ok(NetfilterProgram { fd })
    }

    /// Links the program at both hooks of the calling thread's network namespace, for
    /// IPv4 and, where the namespace has it, IPv6. (Run it on a thread inside the
    /// namespace: `netns::run_in`.)
    pub fn link_here(&self) -> Result<Links, NetfilterError> {
        let mut links = Vec::new();
        let mut families = Vec::new();
        for (pf, family) in FAMILIES {
            if pf == 10 && !ipv6_here() {
                continue;
            }
            for hooknum in HOOKS {
                let link = link_at_free_priority(&self.fd, pf, hooknum).map_err(|error| {
                    NetfilterError::Link {
                        family,
                        hooknum,
                        error,
                    }
                })?;
                links.push(link);
            }
            families.push(family);
        }
        Ok(Links {
            _links: links,
            families,
        })
    }
}

/// `BPF_JMP | BPF_CALL`, and `bpf_insn.src_reg` of a kfunc call (include/uapi/linux/bpf.h).
const CALL: u8 = 0x85;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;

/// Rewrites each call of a placeholder helper number (`observer_common::kfunc::KFUNCS`)
/// into a call of the kernel function it stands for, by its type id in the kernel's
/// BTF (`id_of`; offset 0: vmlinux).
fn call_kfuncs(
    instructions: &mut [bpf_insn],
    id_of: impl Fn(&str) -> Option<u32>,
) -> Result<(), NetfilterError> {
    for (placeholder, name) in observer_common::kfunc::KFUNCS {
        let calls: Vec<&mut bpf_insn> = instructions
            .iter_mut()
            .filter(|insn| insn.code == CALL && insn.src_reg() == 0 && insn.imm == placeholder)
            .collect();
        if calls.is_empty() {
            continue;
        }
        let id = id_of(name).ok_or(NetfilterError::NoKfunc(name))?;
        for insn in calls {
            insn.set_src_reg(BPF_PSEUDO_KFUNC_CALL);
            insn.off = 0;
            insn.imm = id as i32;
        }
    }
    Ok(())
}

/// Whether the calling thread's namespace has IPv6 (a namespace with IPv6 disabled
/// still registers its hooks, but the lab and many nodes turn it off; linking there
/// is harmless, so only a missing IPv6 stack skips it).
fn ipv6_here() -> bool {
    std::path::Path::new("/proc/thread-self/net/if_inet6").exists()
}

/// The map's data: every kind of map holds one.
fn map_data(map: &aya::maps::Map) -> &aya::maps::MapData {
    use aya::maps::Map;
    match map {
        Map::Array(data)
        | Map::ArrayOfMaps(data)
        | Map::BloomFilter(data)
        | Map::CgroupArray(data)
        | Map::CgroupStorage(data)
        | Map::CgrpStorage(data)
        | Map::CpuMap(data)
        | Map::DevMap(data)
        | Map::DevMapHash(data)
        | Map::HashMap(data)
        | Map::HashOfMaps(data)
        | Map::InodeStorage(data)
        | Map::LpmTrie(data)
        | Map::LruHashMap(data)
        | Map::PerCpuArray(data)
        | Map::PerCpuCgroupStorage(data)
        | Map::PerCpuHashMap(data)
        | Map::PerCpuLruHashMap(data)
        | Map::PerfEventArray(data)
        | Map::ProgramArray(data)
        | Map::Queue(data)
        | Map::ReusePortSockArray(data)
        | Map::RingBuf(data)
        | Map::SockHash(data)
        | Map::SockMap(data)
        | Map::SkStorage(data)
        | Map::Stack(data)
        | Map::StackTraceMap(data)
        | Map::Unsupported(data)
        | Map::XskMap(data) => data,
    }
}

/// `BPF_PROG_LOAD` of a netfilter program; on a refusal, loaded again with the
/// verifier's log to say why.
fn load_program(instructions: &[bpf_insn], license: &CString) -> Result<OwnedFd, NetfilterError> {
    let error = match load_with_log(instructions, license, &mut []) {
        Ok(fd) => return Ok(fd),
        Err(error) => error,
    };
    let mut log = vec![0u8; LOG_BYTES];
    let _ = load_with_log(instructions, license, &mut log);
    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
    Err(NetfilterError::Load {
        error,
        log: String::from_utf8_lossy(&log[..end]).into_owned(),
    })
}

/// One `BPF_PROG_LOAD`, with the verifier's log in `log` unless it is empty.
fn load_with_log(
    instructions: &[bpf_insn],
    license: &CString,
    log: &mut [u8],
) -> std::io::Result<OwnedFd> {
    // SAFETY: `bpf_attr` is plain data; all-zero is its documented default.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the `BPF_PROG_LOAD` member of the union, the one this command reads.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_NETFILTER as u32;
    load.expected_attach_type = bpf_attach_type::BPF_NETFILTER as u32;
    load.insns = instructions.as_ptr() as u64;
    load.insn_cnt = instructions.len() as u32;
    load.license = license.as_ptr() as u64;
    for (slot, byte) in load.prog_name.iter_mut().zip(KERNEL_NAME.bytes()) {
        *slot = byte as _;
    }
    if !log.is_empty() {
        load.log_buf = log.as_mut_ptr() as u64;
        load.log_size = log.len() as u32;
        load.log_level = 1;
    }
    bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

/// Links `program` at the first free priority from `first_priority` down.
fn link_at_free_priority(program: &OwnedFd, pf: u32, hooknum: u32) -> std::io::Result<OwnedFd> {
    let first = first_priority(pf, hooknum);
    let mut tried = 0;
    loop {
        match link_create(program, pf, hooknum, first - tried) {
            Err(err) if err.raw_os_error() == Some(libc::EBUSY) && tried + 1 < PRIORITIES => {
                tried += 1;
            }
            result => return result,
        }
    }
}

/// `BPF_LINK_CREATE` of `program` at netfilter hook `hooknum` of family `pf` with
/// `priority`, in the calling thread's namespace.
fn link_create(
    program: &OwnedFd,
    pf: u32,
    hooknum: u32,
    priority: i32,
) -> std::io::Result<OwnedFd> {
    // SAFETY: `bpf_attr` is plain data; all-zero is its documented default.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the `BPF_LINK_CREATE` member of the union, the one this command
    // reads, and its `netfilter` member, the one `BPF_NETFILTER` reads.
    unsafe {
        attr.link_create.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
        attr.link_create.attach_type = bpf_attach_type::BPF_NETFILTER as u32;
        let netfilter = &mut attr.link_create.__bindgen_anon_3.netfilter;
        netfilter.pf = pf;
        netfilter.hooknum = hooknum;
        netfilter.priority = priority;
        netfilter.flags = 0;
    }
    bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// The `bpf(2)` system call for a command that returns a new descriptor.
fn bpf(command: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid, fully initialised `bpf_attr` of the size passed, and
    // every pointer in it (instructions, license, log) outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(imm: i32) -> bpf_insn {
        // SAFETY: `bpf_insn` is plain data.
        let mut insn: bpf_insn = unsafe { std::mem::zeroed() };
        insn.code = CALL;
        insn.imm = imm;
        insn
    }

    #[test]
    fn placeholder_calls_become_kfunc_calls() {
        let placeholder = observer_common::kfunc::DYNPTR_FROM_SKB;
        // A helper call (bpf_dynptr_read, 201) stays; the placeholder becomes the kfunc.
        let mut instructions = [call(201), call(placeholder), call(placeholder)];
        call_kfuncs(&mut instructions, |name| {
            (name == "bpf_dynptr_from_skb").then_some(63306)
        })
        .unwrap();
        let seen: Vec<(u8, i32)> = instructions
            .iter()
            .map(|insn| (insn.src_reg(), insn.imm))
            .collect();
        assert_eq!(seen, [(0, 201), (2, 63306), (2, 63306)]);
    }

    #[test]
    fn a_kernel_without_the_kfunc_is_one_sentence() {
        let mut instructions = [call(observer_common::kfunc::DYNPTR_FROM_SKB)];
        let error = call_kfuncs(&mut instructions, |_| None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the kernel has no function bpf_dynptr_from_skb for it to call"
        );
        // Without placeholders, nothing is looked up.
        call_kfuncs(&mut [call(201)], |_| panic!("looked up")).unwrap();
    }

    #[test]
    fn a_refusal_keeps_the_verifiers_last_line() {
        assert_eq!(
            super::verdict("0: (79) r1 = *(u64 *)(r1 +16)\ninvalid bpf_context access off=16\n\n"),
            ": invalid bpf_context access off=16"
        );
        assert_eq!(super::verdict(""), "");
    }
}
