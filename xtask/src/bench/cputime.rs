//! A process's CPU time, to the nanosecond where the kernel keeps it so.
//!
//! `/proc/PID/stat`'s utime + stime count clock ticks (10 ms here): over a 20 s round
//! that is 0.05% of a core per tick, as large as the differences the keep-alive figure
//! is after. Each thread's `/proc/PID/task/TID/schedstat` holds its time on a CPU in
//! nanoseconds (`sum_exec_runtime`, the same clock the tick figures are scaled to). A
//! thread that ended between two readings takes its time with it, so then the tick
//! figure stands.

use std::collections::BTreeMap;

use anyhow::Context as _;

/// What a process has run so far.
pub(super) struct CpuTime {
    /// utime + stime in seconds (clock ticks), dead threads included.
    ticks_seconds: f64,
    /// Nanoseconds on a CPU by live thread, where every thread's could be read.
    threads: Option<BTreeMap<u32, u64>>,
}

impl CpuTime {
    /// Reads `pid`'s CPU time now.
    pub(super) fn of(pid: u32) -> anyhow::Result<CpuTime> {
        Ok(CpuTime {
            ticks_seconds: ticks_seconds(pid)?,
            threads: threads_ns(pid).ok(),
        })
    }

    /// Seconds on a CPU since `before`: the threads' nanoseconds when every thread
    /// alive then is still alive, else the ticks.
    pub(super) fn seconds_since(&self, before: &CpuTime) -> f64 {
        precise_since(self.threads.as_ref(), before.threads.as_ref())
            .unwrap_or(self.ticks_seconds - before.ticks_seconds)
    }
}

/// The threads' nanoseconds since `before`, in seconds, or `None` when a thread of
/// `before` is gone (or either reading failed).
fn precise_since(
    now: Option<&BTreeMap<u32, u64>>,
    before: Option<&BTreeMap<u32, u64>>,
) -> Option<f64> {
    let (now, before) = (now?, before?);
    let mut ns = 0u64;
    for (tid, then) in before {
        ns += now.get(tid)?.checked_sub(*then)?;
    }
    ns += now
        .iter()
        .filter(|(tid, _)| !before.contains_key(tid))
        .map(|(_, ns)| ns)
        .sum::<u64>();
    Some(ns as f64 / 1e9)
}

/// Nanoseconds on a CPU of each of `pid`'s threads (schedstat's first field).
fn threads_ns(pid: u32) -> anyhow::Result<BTreeMap<u32, u64>> {
    let mut threads = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let tid: u32 = entry.file_name().to_string_lossy().parse()?;
        threads.insert(tid, schedstat_ns(&entry.path().join("schedstat"))?);
    }
    Ok(threads)
}

/// A thread's nanoseconds on a CPU: the first field of its `schedstat`.
fn schedstat_ns(path: &std::path::Path) -> anyhow::Result<u64> {
    let schedstat = std::fs::read_to_string(path)?;
    Ok(schedstat
        .split_whitespace()
        .next()
        .context("empty schedstat")?
        .parse()?)
}

/// User + system CPU seconds process `pid` used so far (/proc/PID/stat fields 14, 15).
fn ticks_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').context("/proc/PID/stat")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_alive_throughout_and_new_ones_count_to_the_nanosecond() {
        let before = BTreeMap::from([(1, 1_000), (2, 5_000)]);
        let now = BTreeMap::from([(1, 3_000), (2, 5_500), (3, 700)]);
        assert_eq!(precise_since(Some(&now), Some(&before)), Some(3_200e-9));
    }

    #[test]
    fn a_thread_gone_leaves_the_tick_figure() {
        let before = BTreeMap::from([(1, 1_000), (2, 5_000)]);
        let now = BTreeMap::from([(1, 3_000)]);
        assert_eq!(precise_since(Some(&now), Some(&before)), None);
        let time = |ticks_seconds, threads| CpuTime {
            ticks_seconds,
            threads: Some(threads),
        };
        let spent = time(0.03, now).seconds_since(&time(0.01, before));
        assert!((spent - 0.02).abs() < 1e-12, "{spent}");
    }

    #[test]
    fn a_running_thread_reads_to_the_nanosecond() {
        // This thread's own figure: reading the whole process fails when one of the
        // harness's other test threads ends between the listing and its read.
        let own = std::path::Path::new("/proc/thread-self/schedstat");
        let before = schedstat_ns(own).unwrap();
        // The kernel adds a running thread's time at its scheduler updates (ticks and
        // switches): 50 ms of work spans several at any HZ.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(50) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        let after = schedstat_ns(own).unwrap();
        assert!(after > before, "{before} -> {after}");
        assert!(after - before < 1_000_000_000, "{before} -> {after}");
    }
}
