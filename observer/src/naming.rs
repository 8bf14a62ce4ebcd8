//! Names connections: maps a conntrack entry's network namespace (inode) to that
//! namespace's kube-proxy rules, read with `nsenter --net=<path> iptables-save` / `nft -j`.
//! On a kind host every node is a namespace reachable through its processes; inside a
//! node, the node's own namespace is the one to read.
//!
//! Reading rules costs a few processes, so re-reads are rate-limited per namespace: one
//! when the rules are older than `max_age`, and one when a lookup misses (unknown
//! address or a backend not in the rules) at most every `min_interval`. Rules that
//! cannot be read never stop capture: the connection gets `service: null` and the
//! namer emits one warning per namespace and cause.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::record::{EndpointShare, Frontend, Proto, ServiceRecord};
use crate::rules::ServiceMap;

/// How a connection is named in the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// `ns/name:port`, or `None` when no rule in the namespace matches.
    pub service: Option<String>,
    /// Whether the backend is still an endpoint in the rules; `None` with no service.
    pub endpoint_in_rules: Option<bool>,
}

/// Which parser a dump needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    IptablesSave,
    NftJson,
}

/// One command's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    /// The command, for messages (`iptables-save`, `nft -j list table ip kube-proxy`).
    pub command: String,
    pub format: DumpFormat,
    pub text: String,
}

/// What reading one namespace's rules produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dumps {
    pub dumps: Vec<Dump>,
    /// Non-fatal causes (a tool missing, one command failing); they become warnings when
    /// the namespace ends up with no Services.
    pub problems: Vec<String>,
}

/// Where rules come from; tests inject fixture text, production runs commands.
pub trait DumpSource: Send {
    /// Dumps of kube-proxy's rules in network namespace `netns` (an inode). `Err` names
    /// why nothing could be read at all.
    fn dump(&mut self, netns: u32) -> Result<Dumps, String>;
}

/// Parses and merges every dump. Parse errors are returned as messages naming the
/// command; the other dumps still count.
pub fn parse_dumps(dumps: &Dumps) -> (ServiceMap, Vec<String>) {
    let mut map = ServiceMap::default();
    let mut errors = Vec::new();
    for dump in &dumps.dumps {
        let parsed = match dump.format {
            DumpFormat::IptablesSave => ServiceMap::from_iptables_save(&dump.text),
            DumpFormat::NftJson => ServiceMap::from_nft_json(&dump.text),
        };
        match parsed {
            Ok(parsed) => map.merge(parsed),
            Err(err) => errors.push(format!("{}: {err}", dump.command)),
        }
    }
    (map, errors)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamerConfig {
    /// Rules older than this are re-read on the next lookup, to see endpoint changes.
    pub max_age: Duration,
    /// A lookup miss re-reads the rules at most this often per namespace.
    pub min_interval: Duration,
}

impl Default for NamerConfig {
    fn default() -> Self {
        NamerConfig {
            max_age: Duration::from_secs(10),
            min_interval: Duration::from_secs(2),
        }
    }
}

struct Space {
    map: ServiceMap,
    read_at: Instant,
}

type Published = (Vec<Frontend>, Vec<EndpointShare>);

pub struct Namer {
    config: NamerConfig,
    source: Box<dyn DumpSource>,
    spaces: HashMap<u32, Space>,
    published: HashMap<(u32, Proto, String), Published>,
    updates: Vec<ServiceRecord>,
    warnings: Vec<String>,
    warned: HashSet<(u32, String)>,
}

impl Namer {
    pub fn new(config: NamerConfig, source: Box<dyn DumpSource>) -> Self {
        Namer {
            config,
            source,
            spaces: HashMap::new(),
            published: HashMap::new(),
            updates: Vec::new(),
            warnings: Vec::new(),
            warned: HashSet::new(),
        }
    }

    /// Names one connection by what its client dialed and the backend conntrack chose.
    pub fn name(
        &mut self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
        now: Instant,
    ) -> Naming {
        let expired = self.spaces.get(&netns).is_none_or(|space| {
            now.saturating_duration_since(space.read_at) >= self.config.max_age
        });
        if expired {
            self.refresh(netns, now);
        }
        let mut naming = self.lookup(netns, proto, original_dst, backend);
        let missed = naming.endpoint_in_rules != Some(true);
        let may_reread = self.spaces.get(&netns).is_some_and(|space| {
            now.saturating_duration_since(space.read_at) >= self.config.min_interval
        });
        if missed && may_reread {
            self.refresh(netns, now);
            naming = self.lookup(netns, proto, original_dst, backend);
        }
        naming
    }

    fn lookup(
        &self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
    ) -> Naming {
        match self
            .spaces
            .get(&netns)
            .and_then(|space| space.map.lookup(proto, original_dst, backend))
        {
            Some((port, current)) => Naming {
                service: Some(port.name.clone()),
                endpoint_in_rules: Some(current),
            },
            None => Naming::default(),
        }
    }

    fn refresh(&mut self, netns: u32, now: Instant) {
        let map = match self.source.dump(netns) {
            Ok(dumps) => {
                let (map, errors) = parse_dumps(&dumps);
                for error in errors {
                    self.warn(netns, error);
                }
                if map.is_empty() {
                    for problem in dumps.problems {
                        self.warn(netns, problem);
                    }
                }
                map
            }
            Err(cause) => {
                self.warn(netns, cause);
                // Keep what was known: a transient failure should not un-name connections.
                match self.spaces.remove(&netns) {
                    Some(space) => space.map,
                    None => ServiceMap::default(),
                }
            }
        };
        for record in map.service_records(netns, Utc::now()) {
            let key = (netns, record.proto, record.service.clone());
            let content = (record.frontends.clone(), record.endpoints.clone());
            if self.published.get(&key) != Some(&content) {
                self.published.insert(key, content);
                self.updates.push(record);
            }
        }
        self.spaces.insert(netns, Space { map, read_at: now });
    }

    fn warn(&mut self, netns: u32, cause: String) {
        if self.warned.insert((netns, cause.clone())) {
            self.warnings.push(format!(
                "cannot name connections in netns {netns}: {cause}; records get service null"
            ));
        }
    }

    /// Services first seen, or whose frontends or endpoints changed, since the last call.
    pub fn take_service_updates(&mut self) -> Vec<ServiceRecord> {
        std::mem::take(&mut self.updates)
    }

    /// New warnings since the last call; each namespace and cause is reported once.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// A network namespace and a path that opens it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsInfo {
    pub inode: u32,
    pub path: PathBuf,
}

/// The inode that identifies the network namespace `path` refers to.
pub fn netns_inode(path: &Path) -> std::io::Result<u32> {
    let inode = std::fs::metadata(path)?.ino();
    u32::try_from(inode).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("inode {inode} does not fit 32 bits"),
        )
    })
}

/// Every network namespace reachable through `/run/netns/*` (named, listed first) or a
/// process's `/proc/PID/ns/net`, one path per namespace.
pub fn list_namespaces() -> Vec<NetnsInfo> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut consider = |path: PathBuf| {
        if let Ok(inode) = netns_inode(&path)
            && seen.insert(inode)
        {
            found.push(NetnsInfo { inode, path });
        }
    };
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        paths.into_iter().for_each(&mut consider);
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        let mut pids: Vec<u32> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        for pid in pids {
            consider(PathBuf::from(format!("/proc/{pid}/ns/net")));
        }
    }
    found
}

/// Finds a program on PATH or in the sbin directories, which root's PATH may lack.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Reads rules by running the host's tools inside each namespace.
#[derive(Default)]
pub struct SystemSource {
    paths: HashMap<u32, PathBuf>,
}

/// (program, arguments, format, whether a failure is worth reporting).
const COMMANDS: [(&str, &[&str], DumpFormat, bool); 6] = [
    ("iptables-save", &[], DumpFormat::IptablesSave, true),
    ("ip6tables-save", &[], DumpFormat::IptablesSave, true),
    // Legacy tables exist only where a node still uses them; most kernels refuse them.
    ("iptables-legacy-save", &[], DumpFormat::IptablesSave, false),
    (
        "ip6tables-legacy-save",
        &[],
        DumpFormat::IptablesSave,
        false,
    ),
    (
        "nft",
        &["-j", "list", "table", "ip", "kube-proxy"],
        DumpFormat::NftJson,
        true,
    ),
    (
        "nft",
        &["-j", "list", "table", "ip6", "kube-proxy"],
        DumpFormat::NftJson,
        true,
    ),
];

impl SystemSource {
    pub fn new() -> Self {
        SystemSource::default()
    }

    fn path_of(&mut self, netns: u32) -> Option<PathBuf> {
        if !self.paths.contains_key(&netns) {
            self.paths = list_namespaces()
                .into_iter()
                .map(|info| (info.inode, info.path))
                .collect();
        }
        self.paths.get(&netns).cloned()
    }

    /// Dumps the rules of the namespace `path` opens.
    pub fn dump_path(&self, path: &Path) -> Result<Dumps, String> {
        let own = netns_inode(Path::new("/proc/self/ns/net")).ok();
        let target = netns_inode(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let nsenter = if own == Some(target) {
            None
        } else {
            Some(find_program("nsenter").ok_or("nsenter not found")?)
        };
        let mut result = Dumps::default();
        let mut missing = Vec::new();
        let mut any_tool = false;
        for (program, args, format, report) in COMMANDS {
            let command_text = std::iter::once(program)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ");
            let Some(binary) = find_program(program) else {
                if report && !missing.contains(&program) {
                    missing.push(program);
                }
                continue;
            };
            any_tool = true;
            let mut command = match &nsenter {
                Some(nsenter) => {
                    let mut command = Command::new(nsenter);
                    command
                        .arg(format!("--net={}", path.display()))
                        .arg(&binary);
                    command
                }
                None => Command::new(&binary),
            };
            let output = match command.args(args).output() {
                Ok(output) => output,
                Err(e) => {
                    if report {
                        result.problems.push(format!("{command_text}: {e}"));
                    }
                    continue;
                }
            };
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.success() {
                result.dumps.push(Dump {
                    command: command_text,
                    format,
                    text: String::from_utf8_lossy(&output.stdout).into_owned(),
                });
            } else if format == DumpFormat::NftJson && stderr.contains("No such file or directory")
            {
                // No kube-proxy table in this family: not an error.
            } else if report {
                let first = stderr.lines().next().unwrap_or("").trim();
                result.problems.push(format!(
                    "{command_text} failed ({}): {first}",
                    output.status
                ));
            }
        }
        if !any_tool {
            return Err(format!("{} not found", missing.join(", ")));
        }
        result.problems.extend(
            missing
                .into_iter()
                .map(|program| format!("{program} not found")),
        );
        Ok(result)
    }
}

impl DumpSource for SystemSource {
    fn dump(&mut self, netns: u32) -> Result<Dumps, String> {
        let path = self
            .path_of(netns)
            .ok_or_else(|| "no process or /run/netns entry is in this namespace".to_owned())?;
        self.dump_path(&path)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    const V4: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/rules/iptables/mixed-v4-nat.saved"
    ));
    const NFT_V6: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/rules/nftables/mixed-v6.json"
    ));

    /// Fixture text per namespace, swappable mid-test; counts reads.
    #[derive(Clone, Default)]
    struct Fake {
        answers: Arc<Mutex<HashMap<u32, Result<Dumps, String>>>>,
        reads: Arc<Mutex<Vec<u32>>>,
    }

    impl Fake {
        fn set(&self, netns: u32, answer: Result<Dumps, String>) {
            self.answers.lock().unwrap().insert(netns, answer);
        }
        fn reads(&self) -> usize {
            self.reads.lock().unwrap().len()
        }
    }

    impl DumpSource for Fake {
        fn dump(&mut self, netns: u32) -> Result<Dumps, String> {
            self.reads.lock().unwrap().push(netns);
            self.answers
                .lock()
                .unwrap()
                .get(&netns)
                .cloned()
                .unwrap_or_else(|| Err("no such namespace".to_owned()))
        }
    }

    fn iptables(text: &str) -> Result<Dumps, String> {
        Ok(Dumps {
            dumps: vec![Dump {
                command: "iptables-save".to_owned(),
                format: DumpFormat::IptablesSave,
                text: text.to_owned(),
            }],
            problems: Vec::new(),
        })
    }

    fn sa(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn named(service: &str, current: bool) -> Naming {
        Naming {
            service: Some(service.to_owned()),
            endpoint_in_rules: Some(current),
        }
    }

    const NS: u32 = 4026532301;

    fn namer(fake: &Fake) -> Namer {
        Namer::new(NamerConfig::default(), Box::new(fake.clone()))
    }

    #[test]
    fn names_from_injected_dumps_and_publishes_services_once() {
        let fake = Fake::default();
        let mut both = iptables(V4).unwrap();
        both.dumps.push(Dump {
            command: "nft -j list table ip6 kube-proxy".to_owned(),
            format: DumpFormat::NftJson,
            text: NFT_V6.to_owned(),
        });
        fake.set(NS, Ok(both));
        let mut namer = namer(&fake);
        let t0 = Instant::now();
        assert_eq!(
            namer.name(
                NS,
                Proto::Tcp,
                sa("10.96.35.226:80"),
                sa("10.244.1.14:3000"),
                t0
            ),
            named("shop/checkout:http", true)
        );
        assert_eq!(
            namer.name(
                NS,
                Proto::Tcp,
                sa("[fd00:10:96::a]:80"),
                sa("[fd00:10:244:2::7]:3000"),
                t0
            ),
            named("shop/checkout:http", true)
        );
        assert_eq!(fake.reads(), 1);
        let updates = namer.take_service_updates();
        let mut names: Vec<_> = updates
            .iter()
            .map(|r| format!("{} {}", r.proto, r.service))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "tcp kube-system/kube-dns:dns-tcp",
                "tcp shop/checkout:http",
                "tcp shop/checkout:metrics",
                "tcp web-team/front-end.v2:https-alt",
                "udp kube-system/kube-dns:dns"
            ]
        );
        assert!(updates.iter().all(|r| r.netns == NS));
        assert!(namer.take_service_updates().is_empty());
        assert!(namer.take_warnings().is_empty());
    }

    #[test]
    fn rules_are_reread_when_old_and_changes_are_published() {
        let fake = Fake::default();
        fake.set(NS, iptables(V4));
        let mut namer = namer(&fake);
        let t0 = Instant::now();
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:9090"),
            sa("10.244.1.13:9100"),
            t0,
        );
        namer.take_service_updates();
        // The metrics endpoint moves to another pod.
        fake.set(
            NS,
            iptables(&V4.replace("10.244.1.13:9100", "10.244.7.7:9100")),
        );
        let young = t0 + Duration::from_secs(9);
        assert_eq!(
            namer.name(
                NS,
                Proto::Tcp,
                sa("10.96.35.226:9090"),
                sa("10.244.1.13:9100"),
                young
            ),
            named("shop/checkout:metrics", true),
            "rules younger than max_age and a hit: no re-read"
        );
        assert_eq!(fake.reads(), 1);
        let old = t0 + Duration::from_secs(10);
        assert_eq!(
            namer.name(
                NS,
                Proto::Tcp,
                sa("10.96.35.226:9090"),
                sa("10.244.1.13:9100"),
                old
            ),
            named("shop/checkout:metrics", false),
            "the old pod is now a stale pin"
        );
        assert_eq!(fake.reads(), 2);
        let updates = namer.take_service_updates();
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].service, "shop/checkout:metrics");
        assert_eq!(updates[0].endpoints[0].addr, sa("10.244.7.7:9100"));
    }

    #[test]
    fn a_miss_rereads_at_most_every_min_interval() {
        let fake = Fake::default();
        fake.set(NS, iptables(V4));
        let mut namer = namer(&fake);
        let t0 = Instant::now();
        let unknown = |namer: &mut Namer, at| {
            namer.name(
                NS,
                Proto::Tcp,
                sa("10.96.99.99:80"),
                sa("10.244.5.5:80"),
                at,
            )
        };
        assert_eq!(unknown(&mut namer, t0), Naming::default());
        assert_eq!(fake.reads(), 1);
        assert_eq!(
            unknown(&mut namer, t0 + Duration::from_millis(1999)),
            Naming::default()
        );
        assert_eq!(fake.reads(), 1, "within min_interval of the last read");
        // A new Service appears; the next miss after min_interval finds it.
        let added = V4.replace(
            "-A KUBE-SERVICES -m comment",
            "-A KUBE-SERVICES -d 10.96.99.99/32 -p tcp -m comment --comment \"new/svc:web cluster IP\" -m tcp --dport 80 -j KUBE-SVC-NEW\n-A KUBE-SVC-NEW -m comment --comment \"new/svc:web -> 10.244.5.5:80\" -j KUBE-SEP-NEW\n-A KUBE-SEP-NEW -p tcp -m tcp -j DNAT --to-destination 10.244.5.5:80\n-A KUBE-SERVICES -m comment",
        );
        fake.set(NS, iptables(&added));
        assert_eq!(
            unknown(&mut namer, t0 + Duration::from_secs(2)),
            named("new/svc:web", true)
        );
        assert_eq!(fake.reads(), 2);
        // A stale pin is a miss too, but again rate-limited.
        let stale = namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.9.9:3000"),
            t0 + Duration::from_secs(3),
        );
        assert_eq!(stale, named("shop/checkout:http", false));
        assert_eq!(fake.reads(), 2);
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.9.9:3000"),
            t0 + Duration::from_secs(4),
        );
        assert_eq!(fake.reads(), 3);
    }

    #[test]
    fn unreadable_rules_warn_once_per_namespace_and_cause() {
        let fake = Fake::default();
        fake.set(NS, Err("iptables-save, nft not found".to_owned()));
        fake.set(7, iptables("*nat\n-A KUBE-SERVICES -d\n"));
        let mut namer = namer(&fake);
        let t0 = Instant::now();
        for step in 0..5 {
            let at = t0 + Duration::from_secs(3 * step);
            let naming = namer.name(
                NS,
                Proto::Tcp,
                sa("10.96.35.226:80"),
                sa("10.244.1.14:3000"),
                at,
            );
            assert_eq!(naming, Naming::default());
            namer.name(
                7,
                Proto::Tcp,
                sa("10.96.35.226:80"),
                sa("10.244.1.14:3000"),
                at,
            );
        }
        assert_eq!(fake.reads(), 10);
        assert_eq!(
            namer.take_warnings(),
            [
                "cannot name connections in netns 4026532301: iptables-save, nft not found; records get service null",
                "cannot name connections in netns 7: iptables-save: iptables-save line 2: option -d has no value (truncated dump?); records get service null",
            ]
        );
        assert!(namer.take_warnings().is_empty());
    }

    #[test]
    fn a_failed_reread_keeps_the_last_good_rules() {
        let fake = Fake::default();
        fake.set(NS, iptables(V4));
        let mut namer = namer(&fake);
        let t0 = Instant::now();
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            t0,
        );
        fake.set(NS, Err("nsenter not found".to_owned()));
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            namer.name(
                NS,
                Proto::Tcp,
                sa("10.96.35.226:80"),
                sa("10.244.1.14:3000"),
                later
            ),
            named("shop/checkout:http", true)
        );
        assert_eq!(namer.take_warnings().len(), 1);
    }

    #[test]
    fn missing_tools_warn_only_when_nothing_was_found() {
        let fake = Fake::default();
        let mut with_problem = iptables(V4).unwrap();
        with_problem.problems.push("nft not found".to_owned());
        fake.set(NS, Ok(with_problem));
        fake.set(
            8,
            Ok(Dumps {
                dumps: Vec::new(),
                problems: vec!["iptables-save not found".to_owned()],
            }),
        );
        let mut namer = namer(&fake);
        let t0 = Instant::now();
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            t0,
        );
        namer.name(
            8,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            t0,
        );
        assert_eq!(
            namer.take_warnings(),
            [
                "cannot name connections in netns 8: iptables-save not found; records get service null"
            ]
        );
    }

    #[test]
    fn own_namespace_is_listed() {
        let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap();
        assert!(list_namespaces().iter().any(|info| info.inode == own));
    }
}
