//! The release artifacts (`cargo xtask dist`, found through OBSERVER_DIST), and the
//! static binary run alone in an otherwise empty root directory, the way it runs in a
//! scratch image or copied into a kind node: only /proc, /sys and /run are bound in.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/dist/` as `cargo xtask test` passes it.
pub fn dist_dir() -> PathBuf {
    let dir = std::env::var_os("OBSERVER_DIST").map(PathBuf::from).expect(
        "OBSERVER_DIST is not set: run the suite with `cargo xtask test` (it runs `cargo xtask dist` first), or set OBSERVER_DIST=target/dist after `cargo xtask dist`",
    );
    assert!(
        dir.join("SHA256SUMS").is_file(),
        "{} holds no dist build",
        dir.display()
    );
    dir
}

/// The static binary for this machine's architecture.
pub fn static_binary() -> PathBuf {
    dist_dir().join(format!("observer-linux-{}", std::env::consts::ARCH))
}

/// A directory holding only `/observer` and the mount points proc, sys, run.
pub struct EmptyRoot {
    dir: tempfile::TempDir,
}

impl EmptyRoot {
    pub fn new() -> EmptyRoot {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(static_binary(), dir.path().join("observer")).unwrap();
        for mount_point in ["proc", "sys", "run"] {
            std::fs::create_dir(dir.path().join(mount_point)).unwrap();
        }
        EmptyRoot { dir }
    }

    /// The root's path as seen from outside it.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `/observer` chrooted into the root, in a mount namespace of its own (gone with the
    /// process) with /proc, /sys and /run bound in. With `keep`, the capability bounding
    /// set holds only those capabilities, so root runs /observer with just them.
    pub fn command(&self, keep: Option<&[u32]>) -> Command {
        let cstr = |path: &Path| CString::new(path.as_os_str().as_bytes()).unwrap();
        let root = cstr(self.path());
        let binds: Vec<(CString, CString)> = ["/proc", "/sys", "/run"]
            .iter()
            .map(|dir| {
                let inside = self.path().join(dir.trim_start_matches('/'));
                (cstr(Path::new(dir)), cstr(&inside))
            })
            .collect();
        let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let drop: Vec<u32> = match keep {
            Some(keep) => (0..=last_cap).filter(|cap| !keep.contains(cap)).collect(),
            None => Vec::new(),
        };
        let mut command = Command::new("/observer");
        // The node's tools are this machine's: the test process stands in for the node's
        // init (this sandbox's PID 1 is a supervisor no process may look into).
        command.env("OBSERVER_HOST_PID", std::process::id().to_string());
        let enter = move || -> std::io::Result<()> {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            // SAFETY: plain system calls on NUL-terminated strings made before fork; the
            // child is single-threaded and allocates nothing here.
            unsafe {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                // Nothing mounted here propagates back to the host.
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                for (source, target) in &binds {
                    check(libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                }
                check(libc::chroot(root.as_ptr()))?;
                check(libc::chdir(c"/".as_ptr()))?;
                for cap in &drop {
                    check(libc::prctl(
                        libc::PR_CAPBSET_DROP,
                        *cap as libc::c_ulong,
                        0,
                        0,
                        0,
                    ))?;
                }
            }
            Ok(())
        };
        // SAFETY: `enter` only makes async-signal-safe system calls (see above).
        unsafe {
            command.pre_exec(enter);
        }
        command
    }
}
