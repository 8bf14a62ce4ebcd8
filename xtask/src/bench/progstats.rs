//! Per-program kernel cost: `kernel.bpf_stats_enabled` makes the kernel sum each
//! program's run time and run count (`bpftool prog show` reports them). The programs
//! are the ones observer's process holds (`/proc/PID/fdinfo`'s `prog_id`), not those of
//! other observers on the machine.

use std::{collections::BTreeMap, process::Command};

use anyhow::{Context as _, bail};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Turns the kernel's BPF run-time statistics on; restores the old setting on drop.
pub struct StatsEnabled {
    before: String,
}

impl StatsEnabled {
    pub fn new() -> anyhow::Result<StatsEnabled> {
        let before = std::fs::read_to_string(STATS_SYSCTL).context("kernel.bpf_stats_enabled")?;
        std::fs::write(STATS_SYSCTL, "1").context("enabling kernel.bpf_stats_enabled")?;
        Ok(StatsEnabled { before })
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        let _ = std::fs::write(STATS_SYSCTL, self.before.trim());
    }
}

/// Run time and run count of one program so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Runs {
    pub ns: u64,
    pub count: u64,
}

impl Runs {
    /// Nanoseconds per run between two snapshots.
    pub fn per_run_since(&self, earlier: &Runs) -> f64 {
        let count = self.count.saturating_sub(earlier.count);
        self.ns.saturating_sub(earlier.ns) as f64 / count.max(1) as f64
    }

    pub fn count_since(&self, earlier: &Runs) -> u64 {
        self.count.saturating_sub(earlier.count)
    }
}

/// The BPF program ids process `pid` holds open.
pub fn program_ids(pid: u32) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let id = text
            .lines()
            .find_map(|line| line.strip_prefix("prog_id:"))
            .and_then(|id| id.trim().parse::<u32>().ok());
        ids.extend(id);
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Each program's name and counts now.
pub fn snapshot(ids: &[u32]) -> anyhow::Result<BTreeMap<String, Runs>> {
    let mut programs = BTreeMap::new();
    for id in ids {
        let out = Command::new("bpftool")
            .args(["prog", "show", "id", &id.to_string(), "-j"])
            .output()
            .context("bpftool")?;
        if !out.status.success() {
            bail!("bpftool prog show id {id} failed");
        }
        let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let name = info["name"].as_str().unwrap_or("?").to_owned();
        let runs = Runs {
            ns: info["run_time_ns"].as_u64().unwrap_or(0),
            count: info["run_cnt"].as_u64().unwrap_or(0),
        };
        programs.insert(name, runs);
    }
    Ok(programs)
}
