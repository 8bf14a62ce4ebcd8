use std::sync::mpsc::{Receiver, Sender, channel};

use std::path::{Path, PathBuf};

use super::runtime::{MAX_BUNDLE_BYTES, within};
use super::*;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn scan_of(pods: &[(&str, &str)]) -> PodScan {
    PodScan {
        pods: pods.iter().map(|(a, p)| (ip(a), (*p).to_owned())).collect(),
        skipped: Vec::new(),
    }
}

/// Hands out prepared scans in order and says when each was taken.
struct Scripted {
    scans: Receiver<PodScan>,
    taken: Sender<()>,
}

impl PodSource for Scripted {
    fn scan(&mut self) -> PodScan {
        let scan = self.scans.recv().unwrap_or_default();
        let _ = self.taken.send(());
        scan
    }
}

#[test]
fn names_from_the_first_scan_and_refreshes_in_the_background_when_asked() {
    let (give, scans) = channel();
    let (taken, was_taken) = channel();
    give.send(scan_of(&[("10.244.1.12", "shop/checkout-a")]))
        .unwrap();
    let config = PodNamerConfig::default();
    let mut namer = PodNamer::start(config, Box::new(Scripted { scans, taken }));
    was_taken.recv().unwrap();
    let t0 = Instant::now();
    assert_eq!(
        namer.name(ip("10.244.1.12"), t0).as_deref(),
        Some("shop/checkout-a")
    );
    // Unknown, but the first scan is younger than min_interval: no refresh asked.
    assert_eq!(namer.name(ip("10.244.1.13"), t0), None);
    assert_eq!(namer.scans(), 1);
    // After min_interval an unknown address asks once; the lookup does not wait.
    give.send(scan_of(&[("10.244.1.13", "shop/checkout-b")]))
        .unwrap();
    let later = t0 + config.min_interval;
    assert_eq!(namer.name(ip("10.244.1.13"), later), None);
    was_taken
        .recv_timeout(Duration::from_secs(30))
        .expect("the background scan ran");
    // `store` runs right after the scan returns; wait for it without timing anything.
    while namer.scans() < 2 {
        std::thread::yield_now();
    }
    assert_eq!(
        namer.name(ip("10.244.1.13"), later).as_deref(),
        Some("shop/checkout-b")
    );
    assert_eq!(
        namer.name(ip("10.244.1.12"), later),
        None,
        "a pod that left is forgotten"
    );
}

/// A hostname (or annotation) holding a terminal escape names its pod as printable text,
/// and so does a warning quoting one.
#[test]
fn names_and_warnings_are_printable_text() {
    let (give, scans) = channel();
    let (taken, _was_taken) = channel();
    let mut scan = scan_of(&[("10.244.1.12", "\u{1b}[2Jcheckout-a")]);
    scan.skipped
        .push("network namespace 7: processes with different hostnames (\u{1b}[2J, b)".into());
    give.send(scan).unwrap();
    let mut namer = PodNamer::start(
        PodNamerConfig::default(),
        Box::new(Scripted { scans, taken }),
    );
    assert_eq!(
        namer.name(ip("10.244.1.12"), Instant::now()).as_deref(),
        Some("\\x1b[2Jcheckout-a")
    );
    let warnings = namer.take_warnings();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("hostnames (\\x1b[2J, b)") && !warnings[0].contains('\u{1b}'),
        "{warnings:?}"
    );
}

#[test]
fn a_known_address_refreshes_only_after_max_age() {
    let (give, scans) = channel();
    let (taken, was_taken) = channel();
    give.send(scan_of(&[("10.244.1.12", "shop/checkout-a")]))
        .unwrap();
    let config = PodNamerConfig::default();
    let mut namer = PodNamer::start(config, Box::new(Scripted { scans, taken }));
    was_taken.recv().unwrap();
    let t0 = Instant::now();
    let known = ip("10.244.1.12");
    assert!(namer.name(known, t0 + config.max_age / 2).is_some());
    assert!(
        was_taken.try_recv().is_err(),
        "a hit on a young scan asks for nothing"
    );
    give.send(scan_of(&[("10.244.1.12", "shop/checkout-z")]))
        .unwrap();
    assert!(namer.name(known, t0 + config.max_age).is_some());
    was_taken.recv_timeout(Duration::from_secs(30)).unwrap();
}

#[test]
fn unreadable_and_malformed_bundles_are_skipped_counted_and_warned_once() {
    let root = tempfile::tempdir().unwrap();
    let write = |id: &str, name: &str, text: &str| {
        let dir = root.path().join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    };
    let sandbox = |netns: &str| {
        format!(
            r#"{{"annotations":{{"io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri.sandbox-name":"web","io.kubernetes.cri.sandbox-namespace":"shop"}},"linux":{{"namespaces":[{{"type":"network","path":"{netns}"}}]}}}}"#
        )
    };
    write("aaa", "config.json", "{ not json");
    write(
        "bbb",
        "config.json",
        r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox"}}"#,
    );
    write("ccc", "config.json", &sandbox("/nonexistent/netns/cni-1"));
    // A regular file is no network namespace: entering it fails.
    let not_netns = root.path().join("plain-file");
    std::fs::write(&not_netns, "x").unwrap();
    write(
        "ddd",
        "config.json",
        &sandbox(&not_netns.display().to_string()),
    );
    // A container (not a sandbox) and a CRI-O layout without a bundle are ignored.
    write(
        "eee",
        "config.json",
        r#"{"annotations":{"io.kubernetes.cri.container-type":"container"}}"#,
    );
    std::fs::create_dir_all(root.path().join("fff/userdata")).unwrap();
    // A FIFO where the netns should be: skipped, the scan does not block on it.
    let fifo = root.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR).unwrap();
    write("ggg", "config.json", &sandbox(&fifo.display().to_string()));
    // Far too large for a runtime spec: not read.
    let huge = std::fs::File::create(root.path().join("hhh-config.json")).unwrap();
    huge.set_len(MAX_BUNDLE_BYTES + 1).unwrap();
    std::fs::create_dir_all(root.path().join("hhh")).unwrap();
    std::fs::rename(
        root.path().join("hhh-config.json"),
        root.path().join("hhh/config.json"),
    )
    .unwrap();
    let mut source = RuntimeSource::new(vec![root.path().to_path_buf()]).bundles_only();
    let scan = source.scan();
    assert!(scan.pods.is_empty());
    let skipped = &scan.skipped;
    assert_eq!(skipped.len(), 6, "{skipped:#?}");
    let dir = root.path().display();
    for start in [
        format!("{dir}/aaa/config.json: not an OCI runtime spec: "),
        format!(
            "{dir}/bbb/config.json: a pod sandbox without the annotation io.kubernetes.cri.sandbox-name"
        ),
        "/nonexistent/netns/cni-1: cannot open: ".to_owned(),
        format!(
            "{}: cannot enter the network namespace: ",
            not_netns.display()
        ),
    ] {
        assert!(
            skipped.iter().any(|s| s.starts_with(&start)),
            "{start}: {skipped:#?}"
        );
    }

    let mut namer = PodNamer::start(PodNamerConfig::default(), Box::new(source));
    let warnings = namer.take_warnings();
    assert_eq!(warnings.len(), 6, "{warnings:#?}");
    assert!(
        warnings.iter().any(|w| w.contains("(6 skipped so far")),
        "{warnings:#?}"
    );
    assert!(
        namer.take_warnings().is_empty(),
        "each cause is reported once"
    );
}

#[test]
fn missing_roots_are_no_problem() {
    let mut source =
        RuntimeSource::new(vec![PathBuf::from("/nonexistent/observer/runtime")]).bundles_only();
    assert_eq!(source.scan(), PodScan::default());
}

#[test]
fn absolute_links_resolve_inside_the_node_root() {
    // A kind node's /var/run is a link to /run: from the host it must stay in the node.
    let node = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(node.path().join("run/netns")).unwrap();
    std::fs::create_dir_all(node.path().join("var")).unwrap();
    std::os::unix::fs::symlink("/run", node.path().join("var/run")).unwrap();
    std::fs::write(node.path().join("run/netns/cni-1"), "").unwrap();
    assert_eq!(
        within(node.path(), Path::new("/var/run/netns/cni-1")),
        node.path().join("run/netns/cni-1")
    );
    std::os::unix::fs::symlink("../run/netns", node.path().join("var/ns")).unwrap();
    assert_eq!(
        within(node.path(), Path::new("/var/ns/cni-1")),
        node.path().join("run/netns/cni-1")
    );
    assert_eq!(
        within(node.path(), Path::new("/../../etc")),
        node.path().join("etc"),
        "`..` never leaves the node's root"
    );
    assert_eq!(
        within(Path::new("/"), Path::new("/run/netns/x")),
        PathBuf::from("/run/netns/x")
    );
}
