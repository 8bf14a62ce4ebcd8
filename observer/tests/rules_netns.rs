//! Reads kube-proxy-format rules out of real network namespaces: one loaded with
//! iptables-restore, one with nft -f, both created (and deleted) by this test. Needs
//! root; without it the test fails rather than skipping, so CI cannot pass it silently.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use observer::model::record::FrontendKind::{ClusterIp, NodePort};
use observer::model::record::{LogLine, Proto};
use observer::naming::services::{Namer, NamerConfig, Naming, SystemSource, netns_inode};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/rules");

/// A network namespace that is deleted when the test ends, also on failure.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("obs-rules-{tag}-{}", std::process::id());
        // A leftover from a killed run would make `ip netns add` fail.
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        run("ip", &["netns", "add", &name], None);
        Netns { name }
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    fn load(&self, program: &str, args: &[&str], file: &str) {
        let input = std::fs::File::open(Path::new(DATA).join(file)).unwrap();
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        run("ip", &full, Some(input));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(program: &str, args: &[&str], stdin: Option<std::fs::File>) {
    let mut command = Command::new(program);
    command.args(args);
    if let Some(stdin) = stdin {
        command.stdin(stdin);
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What `observer rules ARGS` prints; it must succeed.
fn rendered(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_observer"))
        .arg("rules")
        .args(args)
        .output()
        .expect("run observer rules");
    assert!(
        out.status.success(),
        "observer rules {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn names_connections_from_rules_in_real_namespaces() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test must run as root: it creates network namespaces and loads rules into them"
    );

    let ipt = Netns::new("ipt");
    ipt.load("iptables-restore", &[], "iptables/mixed-v4.rules");
    ipt.load("ip6tables-restore", &[], "iptables/mixed-v6.rules");
    let nft = Netns::new("nft");
    nft.load("nft", &["-f", "/dev/stdin"], "nftables/mixed-v4.nft");
    nft.load("nft", &["-f", "/dev/stdin"], "nftables/mixed-v6.nft");
    let ipt_inode = netns_inode(&ipt.path()).unwrap();
    let nft_inode = netns_inode(&nft.path()).unwrap();

    namer_reads_both(ipt_inode, nft_inode);
    rules_table_of_one_namespace(&ipt, ipt_inode);
    rules_json_of_one_namespace(nft_inode);

    // Default: every namespace with kube-proxy rules, ours among them.
    let all = rendered(&[]);
    assert!(all.contains(&format!("netns {ipt_inode} (")), "{all}");
    assert!(all.contains(&format!("netns {nft_inode} (")), "{all}");
}

/// (netns, protocol, dialed, backend, expected naming) of connections in both namespaces.
fn cases(ipt_inode: u32, nft_inode: u32) -> [(u32, Proto, &'static str, &'static str, Naming); 8] {
    [
        (
            ipt_inode,
            Proto::Tcp,
            "10.96.35.226:80",
            "10.244.1.14:3000",
            Naming::named("shop/checkout:http", true).via(ClusterIp),
        ),
        (
            ipt_inode,
            Proto::Tcp,
            "[fd00:10:96::a]:80",
            "[fd00:10:244:2::7]:3000",
            Naming::named("shop/checkout:http", true).via(ClusterIp),
        ),
        (
            ipt_inode,
            Proto::Udp,
            "10.96.0.10:53",
            "10.244.0.3:53",
            Naming::named("kube-system/kube-dns:dns", true).via(ClusterIp),
        ),
        (
            ipt_inode,
            Proto::Tcp,
            "10.0.0.5:30443",
            "10.244.9.9:8443",
            Naming::named("web-team/front-end.v2:https-alt", false).via(NodePort),
        ),
        (
            ipt_inode,
            Proto::Tcp,
            "10.96.35.226:81",
            "10.244.1.14:3000",
            Naming::default(),
        ),
        (
            nft_inode,
            Proto::Tcp,
            "10.96.35.226:80",
            "10.244.2.7:3000",
            Naming::named("shop/checkout:http", true).via(ClusterIp),
        ),
        (
            nft_inode,
            Proto::Udp,
            "[fd00:1::2]:30053",
            "[fd00:10:244::2]:53",
            Naming::named("kube-system/kube-dns:dns", true).via(NodePort),
        ),
        (
            nft_inode,
            Proto::Tcp,
            "10.96.200.1:80",
            "10.244.1.1:80",
            Naming::named("shop/empty:http", false).via(ClusterIp),
        ),
    ]
}

/// The namer, with the system's tools, names connections in both namespaces.
fn namer_reads_both(ipt_inode: u32, nft_inode: u32) {
    let mut namer = Namer::new(NamerConfig::default(), Box::new(SystemSource::new()));
    let now = Instant::now();
    let cases = cases(ipt_inode, nft_inode);
    for (netns, proto, dst, backend, want) in cases {
        let (dst, backend): (SocketAddr, SocketAddr) =
            (dst.parse().unwrap(), backend.parse().unwrap());
        assert_eq!(
            namer.name(netns, proto, dst, backend, now),
            want,
            "{netns} {proto} {dst} -> {backend}"
        );
    }
    assert_eq!(namer.take_warnings(), Vec::<String>::new());
    let updates = namer.take_service_updates();
    assert_eq!(
        updates.iter().filter(|r| r.netns == ipt_inode).count(),
        6,
        "{updates:#?}"
    );
    assert_eq!(
        updates.iter().filter(|r| r.netns == nft_inode).count(),
        6,
        "{updates:#?}"
    );

    // An inode no process or /run/netns entry holds: service null and one warning.
    let dst: SocketAddr = "10.96.35.226:80".parse().unwrap();
    let backend: SocketAddr = "10.244.1.14:3000".parse().unwrap();
    let gone = namer.name(1, Proto::Tcp, dst, backend, now);
    assert_eq!(gone, Naming::default());
    assert_eq!(
        namer.take_warnings(),
        [
            "cannot name connections in netns 1: no process or /run/netns entry is in this namespace; records get service null"
        ]
    );
}

/// `observer rules --netns PATH`: the table.
fn rules_table_of_one_namespace(ipt: &Netns, ipt_inode: u32) {
    let ipt_path = ipt.path().display().to_string();
    let table = rendered(&["-o", "table", "--netns", &ipt_path]);
    let header = format!("netns {ipt_inode} ({})", ipt.path().display());
    assert!(table.starts_with(&header), "{table}");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for row in [
        vec![
            "shop/checkout:http",
            "tcp",
            "10.96.35.226:80",
            "10.244.1.13:3000",
            "33.3%",
        ],
        vec!["[fd00:10:96::a]:80", "10.244.1.14:3000", "33.3%"],
        vec!["[fd00:10:244:2::7]:3000", "50.0%"],
        vec![
            "shop/empty:http",
            "tcp",
            "10.96.200.1:80",
            "(no",
            "endpoints)",
        ],
        vec!["NodePort", "30443", "10.244.1.21:8443", "25.0%", "50.0%"],
    ] {
        assert!(rows.contains(&row), "no row {row:?} in\n{table}");
    }
}

/// `observer rules -o json --netns INODE`: service records of that namespace only.
fn rules_json_of_one_namespace(nft_inode: u32) {
    let json = rendered(&["-o", "json", "--netns", &nft_inode.to_string()]);
    let records: Vec<_> = json
        .lines()
        .map(
            |line| match serde_json::from_str::<LogLine>(line).unwrap() {
                LogLine::Service(record) => record,
                other => panic!("not a service line: {other:?}"),
            },
        )
        .collect();
    assert_eq!(records.len(), 6, "{json}");
    assert!(records.iter().all(|r| r.netns == nft_inode));
    let checkout = records
        .iter()
        .find(|r| r.service == "shop/checkout:http")
        .unwrap();
    assert_eq!(checkout.endpoints.len(), 5);
}
