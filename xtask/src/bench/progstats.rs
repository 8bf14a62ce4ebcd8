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
    /// Nanoseconds per run (0 when it did not run).
    pub fn per_run(&self) -> f64 {
        self.ns as f64 / self.count.max(1) as f64
    }

    /// Nanoseconds per run between two snapshots.
    pub fn per_run_since(&self, earlier: &Runs) -> f64 {
        Runs {
            ns: self.ns.saturating_sub(earlier.ns),
            count: self.count_since(earlier),
        }
        .per_run()
    }

    pub fn count_since(&self, earlier: &Runs) -> u64 {
        self.count.saturating_sub(earlier.count)
    }
}

/// Each program's runs between two snapshots (programs in both).
pub fn since(
    later: &BTreeMap<String, Runs>,
    earlier: &BTreeMap<String, Runs>,
) -> BTreeMap<String, Runs> {
    later
        .iter()
        .filter_map(|(name, after)| {
            let before = earlier.get(name)?;
            let runs = Runs {
                ns: after.ns.saturating_sub(before.ns),
                count: after.count_since(before),
            };
            Some((name.clone(), runs))
        })
        .collect()
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

/// The empty program (`FloorPrograms`) on the hook of observer's program `name`
/// (bpftool's name, cut at 15 bytes). The tracepoint programs (`net_dev_queue`, its raw
/// fallback, `kfree_skb`'s, and the revalidation program run by test runs) take the raw
/// tracepoint's.
pub fn floor_of(name: &str) -> &'static str {
    match name {
        "local_delivery" => "floor_ingress",
        "dns_egress" => "floor_egress",
        _ => "floor_dev_queue",
    }
}

/// observer's programs' ns in `runs` (the empty programs' own runs left out), and what
/// the empty programs' ns per run in `floor` (`FloorPrograms`' runs, from the same
/// phase or a round of the same load), times observer's runs on each hook, come to.
pub fn against_floor(runs: &BTreeMap<String, Runs>, floor: &BTreeMap<String, Runs>) -> (f64, f64) {
    runs.iter()
        .filter(|(name, _)| !name.starts_with("floor_"))
        .fold((0.0, 0.0), |(own, floor_ns), (name, r)| {
            (
                own + r.ns as f64,
                floor_ns + r.count as f64 * floor_per_run(floor, floor_of(name)),
            )
        })
}

/// ns per run of the empty program `name` in `floor` (0 when it did not run).
pub fn floor_per_run(floor: &BTreeMap<String, Runs>, name: &str) -> f64 {
    floor.get(name).map_or(0.0, Runs::per_run)
}

/// Empty programs on observer's hooks (`empty_programs.py`): their ns per run is the
/// floor of `kernel.bpf_stats_enabled` on this machine, what running any program at all
/// costs there (the accounting's own clock reads included). Detached on drop.
pub struct FloorPrograms {
    child: std::process::Child,
    pub ids: Vec<u32>,
}

/// Which empty programs `empty_programs.py` attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorHooks<'a> {
    /// observer's three hooks today: `net_dev_queue` and both `cgroup_skb` directions.
    All,
    /// `net_dev_queue` alone.
    DevQueue,
    /// A netfilter program at POSTROUTING and LOCAL_IN of this network namespace (by
    /// `ip netns` name): the once-per-packet hook of Linux 6.4+ (issue 31).
    Netfilter(&'a str),
}

impl FloorPrograms {
    pub fn attach() -> anyhow::Result<FloorPrograms> {
        FloorPrograms::attach_on(FloorHooks::All)
    }

    pub fn attach_on(hooks: FloorHooks<'_>) -> anyhow::Result<FloorPrograms> {
        use std::io::{BufRead as _, Write as _};
        let cgroup =
            cgroup2_mount().context("no cgroup v2 mount for the empty cgroup_skb programs")?;
        let script = std::env::temp_dir().join("observer-bench-empty-programs.py");
        std::fs::File::create(&script)?.write_all(include_bytes!("empty_programs.py"))?;
        let mut command = match hooks {
            // A netfilter link belongs to the namespace of the process that makes it.
            FloorHooks::Netfilter(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, "python3"]);
                command
            }
            _ => Command::new("python3"),
        };
        let which = match hooks {
            FloorHooks::All => "all",
            FloorHooks::DevQueue => "dev_queue",
            FloorHooks::Netfilter(_) => "netfilter",
        };
        let mut child = command
            .arg(&script)
            .arg(&cgroup)
            .arg(which)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("python3 (empty BPF programs)")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("no stdout")?;
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let Some(ids) = line.trim().strip_prefix("ids ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the empty BPF programs did not attach (see the error above)");
        };
        let ids = ids
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        Ok(FloorPrograms { child, ids })
    }
}

impl Drop for FloorPrograms {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid
/// hosts), from /proc/self/mountinfo.
fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2")
            .then(|| before.split_whitespace().nth(4).map(Into::into))?
    })
}
