//! What this process may do on this kernel: its effective capabilities (named, so an
//! error can say which one is missing) and the kernel release (the ring buffer needs 5.8).

/// A Linux capability observer needs (numbers from linux/capability.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    NetAdmin = 12,
    SysChroot = 18,
    SysPtrace = 19,
    SysAdmin = 21,
    SysResource = 24,
    Perfmon = 38,
    Bpf = 39,
}

impl Cap {
    pub fn name(self) -> &'static str {
        match self {
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::SysChroot => "CAP_SYS_CHROOT",
            Cap::SysPtrace => "CAP_SYS_PTRACE",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::SysResource => "CAP_SYS_RESOURCE",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }
}

/// A set of effective capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps(pub u64);

impl Caps {
    /// This process's effective set (`CapEff` in /proc/self/status); empty if unreadable.
    pub fn effective() -> Caps {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Caps(
            status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
                .unwrap_or(0),
        )
    }

    pub fn has(self, cap: Cap) -> bool {
        self.0 & (1 << cap as u32) != 0
    }

    /// The capabilities of `needed` this set lacks, named and joined with "and".
    pub fn missing(self, needed: &[Cap]) -> Option<String> {
        let names: Vec<&str> = needed
            .iter()
            .filter(|cap| !self.has(**cap))
            .map(|cap| cap.name())
            .collect();
        (!names.is_empty()).then(|| names.join(" and "))
    }

    /// What loading and attaching the kernel programs needs that this set lacks:
    /// CAP_SYS_ADMIN alone, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (the cgroup hook).
    pub fn missing_for_capture(self) -> Option<String> {
        let split = [Cap::Bpf, Cap::Perfmon, Cap::NetAdmin];
        if self.has(Cap::SysAdmin) {
            None
        } else if split.iter().all(|cap| !self.has(*cap)) {
            Some("CAP_SYS_ADMIN (or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN)".to_owned())
        } else {
            self.missing(&split)
                .map(|names| format!("{names} (or CAP_SYS_ADMIN)"))
        }
    }
}

/// `(major, minor)` of a kernel release such as `6.1.0-18-cloud-amd64`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()?;
    Some((major, minor))
}

/// The oldest kernel with everything observer uses (the BPF ring buffer came in 5.8).
pub const MIN_KERNEL: (u32, u32) = (5, 8);

/// One sentence when `release` is older than [`MIN_KERNEL`]; an unreadable release is
/// left for the kernel itself to judge.
pub fn too_old(release: &str) -> Option<String> {
    let version = parse_release(release)?;
    (version < MIN_KERNEL).then(|| {
        format!(
            "observer needs Linux {}.{} or newer (it reports through a BPF ring buffer); this kernel is {release}",
            MIN_KERNEL.0, MIN_KERNEL.1
        )
    })
}

/// This kernel's release (`uname -r`).
pub fn kernel_release() -> Option<String> {
    nix::sys::utsname::uname()
        .ok()
        .map(|uts| uts.release().to_string_lossy().into_owned())
}

/// Lifts the locked-memory limit: kernels before 5.11 charge BPF maps to it. Best
/// effort (raising it needs CAP_SYS_RESOURCE); newer kernels ignore the limit.
pub fn raise_memlock() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
    let _ = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert_eq!(parse_release("6.1.0-18-cloud-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.10.0-28-cloud-amd64"), Some((5, 10)));
        assert_eq!(parse_release("6.18.0"), Some((6, 18)));
        assert_eq!(parse_release("5.8-rc1"), Some((5, 8)));
        assert_eq!(parse_release("4.19.0+"), Some((4, 19)));
        assert_eq!(parse_release("2.6.78"), Some((2, 6)));
        assert_eq!(parse_release("garbage"), None);
        assert_eq!(too_old("5.8.0"), None);
        assert_eq!(too_old("5.10.0-28-cloud-amd64"), None);
        assert_eq!(too_old("garbage"), None);
        assert_eq!(
            too_old("5.4.0-150-generic").as_deref(),
            Some(
                "observer needs Linux 5.8 or newer (it reports through a BPF ring buffer); this kernel is 5.4.0-150-generic"
            )
        );
        assert!(too_old("2.6.78").is_some());
    }

    #[test]
    fn capabilities() {
        let set = |caps: &[Cap]| Caps(caps.iter().map(|c| 1u64 << *c as u32).sum());
        assert_eq!(set(&[Cap::SysAdmin]).missing_for_capture(), None);
        assert_eq!(
            set(&[Cap::Bpf, Cap::Perfmon, Cap::NetAdmin]).missing_for_capture(),
            None
        );
        assert_eq!(
            set(&[Cap::SysPtrace]).missing_for_capture().as_deref(),
            Some("CAP_SYS_ADMIN (or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN)")
        );
        assert_eq!(
            set(&[Cap::Bpf]).missing_for_capture().as_deref(),
            Some("CAP_PERFMON and CAP_NET_ADMIN (or CAP_SYS_ADMIN)")
        );
        assert_eq!(
            set(&[])
                .missing(&[Cap::SysAdmin, Cap::SysChroot])
                .as_deref(),
            Some("CAP_SYS_ADMIN and CAP_SYS_CHROOT")
        );
        assert_eq!(set(&[Cap::SysPtrace]).missing(&[Cap::SysPtrace]), None);
    }
}
