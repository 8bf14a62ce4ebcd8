//! Attaching: each program of the loaded object to its hook, the optional ones with a
//! warning where the kernel refuses them.

use aya::{
    Ebpf,
    programs::{BtfTracePoint, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, RawTracePoint},
};

use crate::kernel::load::error_chain;
use crate::kernel::netfilter::{NetfilterError, NetfilterProgram};

/// The tracepoint the forwarding hook attaches to.
const DEV_QUEUE: &str = "net_dev_queue";

/// The program that finds connections whose conntrack entry is gone.
pub const REVALIDATE: &str = "revalidate";

/// What observer logs (debug) once the revalidation program loaded: one more program
/// than it attaches (`cargo xtask kernels` counts them).
pub const REVALIDATION_LOADED: &str = "the revalidation program loaded (run, not attached)";

/// Why one program would not load or attach.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("program {0} is missing from the object")]
    Missing(&'static str),
    #[error(
        "the kernel's own BTF, which {needed_by} needs, is not readable at /sys/kernel/btf/vmlinux ({error})"
    )]
    NoKernelBtf {
        needed_by: &'static str,
        error: String,
    },
    /// A program on a BTF tracepoint refused: said whole, for a warning.
    #[error("the kernel refused {program} ({})", error_chain(.error))]
    Refused {
        program: &'static str,
        error: aya::programs::ProgramError,
    },
    /// Any other program refused: the kernel's reason only.
    #[error("{}", error_chain(.0))]
    Program(aya::programs::ProgramError),
    #[error("cannot open {}: {error}", .path.display())]
    Cgroup {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
}

/// A hook observer cannot work without was refused.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("the kernel refused to attach to tracepoint {hook}: {reason}")]
    Tracepoint {
        hook: &'static str,
        reason: AttachError,
    },
    #[error(
        "--hook netfilter cannot work here: {0}; --hook dev-queue works on any kernel observer supports"
    )]
    Netfilter(NetfilterError),
    #[error(
        "--hook netfilter needs Linux 6.12 or later (this is {0}): before it, a netfilter link did not hold its network namespace, which could be freed under it (CVE-2024-50130); --hook dev-queue works on any kernel observer supports"
    )]
    NetfilterTooOld(String),
    #[error(
        "the netfilter program could be linked in no network namespace: {0}; --hook dev-queue watches every namespace"
    )]
    NoNamespace(String),
}

/// `--hook`: where the forwarding program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookChoice {
    /// The netfilter hooks where the kernel has them (6.4+), else `net_dev_queue`.
    Auto,
    Netfilter,
    DevQueue,
}

/// The first kernel where observer links netfilter programs: they exist since 6.4, but
/// until 6.12 a link did not hold its network namespace (commit 1230fe7ad397,
/// CVE-2024-50130), so a namespace deleted while linked left the link pointing at freed
/// memory.
pub const NETFILTER_SINCE: (u32, u32) = (6, 12);

/// Whether `attach_all` will try the netfilter hooks first (`--hook netfilter` fails
/// where the kernel is older, `auto` falls back to `net_dev_queue`).
pub fn netfilter_planned(choice: HookChoice, release: Option<(u32, u32)>) -> bool {
    choice == HookChoice::Netfilter || (choice == HookChoice::Auto && new_enough(release))
}

fn new_enough(release: Option<(u32, u32)>) -> bool {
    release.is_some_and(|release| release >= NETFILTER_SINCE)
}

/// Where the forwarding program runs.
#[derive(Debug)]
pub enum Forwarding {
    /// On the `net_dev_queue` tracepoint: every device a packet crosses, every
    /// namespace at once.
    DevQueue,
    /// Linked at the netfilter hooks of each node namespace (`kernel::netfilter`).
    Netfilter(NetfilterProgram),
}

/// What `attach_all` attached, and what works less well than it could.
pub struct Attached {
    pub hooks: u32,
    pub forwarding: Forwarding,
    /// One sentence each.
    pub warnings: Vec<String>,
    /// Why the revalidation program could not load; `None` when it loaded.
    pub revalidation_refused: Option<AttachError>,
}

/// Attaches every program, given the running kernel's BTF (or why it is unreadable):
/// the forwarding hook must attach, the others are said in warnings when refused.
pub fn attach_all(
    ebpf: &mut Ebpf,
    vmlinux: Result<&aya::Btf, &str>,
    forwarding: (HookChoice, &[u8], Option<(u32, u32)>),
) -> Result<Attached, HookError> {
    let mut warnings = Vec::new();
    let forwarding = attach_forwarding(ebpf, vmlinux, forwarding, &mut warnings)?;
    let mut hooks = 1;
    match attach_btf(ebpf, vmlinux, &NETFILTER_DROP) {
        Ok(()) => {
            log::debug!("skb:kfree_skb attached");
            hooks += 1;
        }
        Err(reason) => warnings.push(format!(
            "{reason}; connections rejected because a Service has no endpoints are not seen"
        )),
    }
    // The netfilter program sees every packet of a node namespace, its replies to
    // clients on the node itself and TCP DNS payload included: the socket-side programs
    // (which would cost every packet of every local socket a run) only where it does not.
    let socket_side = matches!(forwarding, Forwarding::DevQueue);
    match cgroup2_mount().filter(|_| socket_side) {
        Some(root) => {
            for (program, attach_type, hook) in [
                (
                    "local_delivery",
                    CgroupSkbAttachType::Ingress,
                    "cgroup_skb/ingress",
                ),
                ("dns_egress", CgroupSkbAttachType::Egress, "cgroup_skb/egress"),
            ] {
                attach_cgroup(ebpf, &root, program, attach_type)
                    .map_err(|reason| HookError::Tracepoint { hook, reason })?;
                hooks += 1;
            }
        }
        None if !socket_side => {}
        None => warnings.push(
            "no cgroup v2 hierarchy is mounted: replies to clients on the node itself (host network) are not counted, and DNS over TCP is not decoded"
                .to_owned(),
        ),
    }
    let revalidation_refused = load_revalidate(ebpf).err();
    match &revalidation_refused {
        Some(reason) => log::debug!(
            "the kernel refused the revalidation program ({reason}): conntrack's destroy events say when entries go"
        ),
        None => log::debug!("{REVALIDATION_LOADED}"),
    }
    Ok(Attached {
        hooks,
        forwarding,
        warnings,
        revalidation_refused,
    })
}

/// A program on a BTF tracepoint (the kernel's own BTF names its argument types).
struct BtfHook {
    /// Its name in the object.
    program: &'static str,
    tracepoint: &'static str,
    /// How sentences name it.
    described: &'static str,
}

/// `net_dev_queue` with `sk_buff` fields as plain loads.
const DEV_QUEUE_BTF: BtfHook = BtfHook {
    program: "net_dev_queue",
    tracepoint: DEV_QUEUE,
    described: "the BTF tracepoint program",
};

/// `skb:kfree_skb` (see observer-ebpf's `hooks/netfilter_drop.rs`).
const NETFILTER_DROP: BtfHook = BtfHook {
    program: "netfilter_drop",
    tracepoint: "kfree_skb",
    described: "the program on tracepoint skb:kfree_skb",
};

/// Loads and attaches `hook`'s program.
fn attach_btf(
    ebpf: &mut Ebpf,
    vmlinux: Result<&aya::Btf, &str>,
    hook: &BtfHook,
) -> Result<(), AttachError> {
    let btf = vmlinux.map_err(|error| AttachError::NoKernelBtf {
        needed_by: hook.described,
        error: error.to_owned(),
    })?;
    let refused = |error| AttachError::Refused {
        program: hook.described,
        error,
    };
    let program: &mut BtfTracePoint = ebpf
        .program_mut(hook.program)
        .ok_or(AttachError::Missing(hook.program))?
        .try_into()
        .map_err(refused)?;
    program.load(hook.tracepoint, btf).map_err(refused)?;
    program.attach().map_err(refused)?;
    Ok(())
}

/// Loads the forwarding program where `choice` says: the netfilter program on a kernel
/// that has netfilter programs (`release`, major and minor) unless `--hook dev-queue`,
/// else on `net_dev_queue`. `--hook auto` falls back to `net_dev_queue`, with a warning,
/// where the kernel refuses the netfilter program; `--hook netfilter` fails there.
fn attach_forwarding(
    ebpf: &mut Ebpf,
    vmlinux: Result<&aya::Btf, &str>,
    (choice, object, release): (HookChoice, &[u8], Option<(u32, u32)>),
    warnings: &mut Vec<String>,
) -> Result<Forwarding, HookError> {
    let new_enough = new_enough(release);
    if choice == HookChoice::Netfilter && !new_enough {
        let release = release.map_or("an unknown release".to_owned(), |(major, minor)| {
            format!("{major}.{minor}")
        });
        return Err(HookError::NetfilterTooOld(release));
    }
    if netfilter_planned(choice, release) {
        match NetfilterProgram::load(object, ebpf, vmlinux) {
            Ok(program) => {
                log::debug!("the forwarding program loaded as a netfilter program");
                return Ok(Forwarding::Netfilter(program));
            }
            Err(err) if choice == HookChoice::Netfilter => return Err(HookError::Netfilter(err)),
            Err(err) => warnings.push(format!(
                "the netfilter program could not be loaded ({err}); the forwarding program runs on net_dev_queue instead, at a higher cost per packet"
            )),
        }
    }
    attach_dev_queue(ebpf, vmlinux, warnings)?;
    Ok(Forwarding::DevQueue)
}

/// Attaches the forwarding hook to `net_dev_queue`: the BTF tracepoint program where
/// the kernel takes it, else the raw tracepoint program (fields through helper calls),
/// saying so in `warnings`.
fn attach_dev_queue(
    ebpf: &mut Ebpf,
    vmlinux: Result<&aya::Btf, &str>,
    warnings: &mut Vec<String>,
) -> Result<(), HookError> {
    let btf_refused = match attach_btf(ebpf, vmlinux, &DEV_QUEUE_BTF) {
        Ok(()) => {
            log::debug!("net_dev_queue attached as a BTF tracepoint");
            return Ok(());
        }
        Err(reason) => reason,
    };
    let program =
        raw_tracepoint(ebpf, "dev_queue_raw").map_err(|reason| HookError::Tracepoint {
            hook: DEV_QUEUE,
            reason,
        })?;
    program
        .attach(DEV_QUEUE)
        .map_err(|err| HookError::Tracepoint {
            hook: DEV_QUEUE,
            reason: AttachError::Program(err),
        })?;
    log::debug!("net_dev_queue attached as a raw tracepoint");
    warnings.push(format!(
        "{btf_refused}; the raw tracepoint program runs instead, at a higher cost per packet"
    ));
    Ok(())
}

/// Loads the raw tracepoint program `name`.
fn raw_tracepoint<'e>(
    ebpf: &'e mut Ebpf,
    name: &'static str,
) -> Result<&'e mut RawTracePoint, AttachError> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(name)
        .ok_or(AttachError::Missing(name))?
        .try_into()
        .map_err(AttachError::Program)?;
    program.load().map_err(AttachError::Program)?;
    Ok(program)
}

/// Loads the revalidation program (run, never attached).
fn load_revalidate(ebpf: &mut Ebpf) -> Result<(), AttachError> {
    raw_tracepoint(ebpf, REVALIDATE).map(|_| ())
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid systems), from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        // Fields: id parent major:minor root mount-point options ... - fstype source options
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2")
            .then(|| {
                before
                    .split_whitespace()
                    .nth(4)
                    .map(std::path::PathBuf::from)
            })
            .flatten()
    })
}

/// Attaches `program` to the cgroup v2 root `root`: `local_delivery` to ingress (every
/// packet delivered to a local socket), `dns_egress` to egress (every packet a local
/// socket sends).
fn attach_cgroup(
    ebpf: &mut Ebpf,
    root: &std::path::Path,
    program: &'static str,
    attach_type: CgroupSkbAttachType,
) -> Result<(), AttachError> {
    let cgroup = std::fs::File::open(root).map_err(|error| AttachError::Cgroup {
        path: root.to_owned(),
        error,
    })?;
    let program: &mut CgroupSkb = ebpf
        .program_mut(program)
        .ok_or(AttachError::Missing(program))?
        .try_into()
        .map_err(AttachError::Program)?;
    program.load().map_err(AttachError::Program)?;
    // A BPF link (kernel 5.7+) takes no flags and never displaces programs others
    // attached to the same cgroup.
    program
        .attach(cgroup, attach_type, CgroupAttachMode::Single)
        .map_err(AttachError::Program)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{HookChoice, netfilter_planned};

    #[test]
    fn the_netfilter_hooks_are_planned_where_they_will_be_tried() {
        let cases = [
            (HookChoice::Auto, Some((6, 12)), true),
            (HookChoice::Auto, Some((6, 11)), false),
            (HookChoice::Auto, None, false),
            (HookChoice::Netfilter, Some((6, 1)), true),
            (HookChoice::DevQueue, Some((6, 18)), false),
        ];
        for (choice, release, planned) in cases {
            assert_eq!(
                netfilter_planned(choice, release),
                planned,
                "{choice:?} {release:?}"
            );
        }
    }
}
