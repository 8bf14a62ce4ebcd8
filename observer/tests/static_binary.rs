//! The release artifacts of `cargo xtask dist` (OBSERVER_DIST): static binaries that
//! match their checksums, an OCI image archive for both architectures that skopeo and
//! umoci read and whose binaries run, that containerd imports under the DaemonSet's image name (as `kind load
//! image-archive` does), and the static binary run alone in an empty root against the lab with
//! exactly the DaemonSet's capabilities: every Service named; without each capability
//! that matters, one sentence naming it. Root: builds a lab, mounts, chroots.

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Output};

use common::command::run;
use common::daemonset;
use common::empty_root::{EmptyRoot, dist_dir};
use common::image;
use common::{Recorder, only_node, prefix, require_root};
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_fresh, udp_queries};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs the release artifacts (cargo xtask dist): run by cargo xtask test"]
fn binaries_are_static_and_match_their_checksums() {
    let dist = dist_dir();
    for (arch, file_says) in [("x86_64", "x86-64"), ("aarch64", "ARM aarch64")] {
        let binary = dist.join(format!("observer-linux-{arch}"));
        let described = stdout(&run(Command::new("file").arg("-b").arg(&binary)));
        assert!(described.contains(file_says), "{arch}: {described}");
        assert!(described.contains("static"), "{arch}: {described}");
        assert!(!described.contains("interpreter"), "{arch}: {described}");
    }
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let listed: BTreeSet<&str> = sums
        .lines()
        .map(|line| line.split_once("  ").unwrap().1)
        .collect();
    assert_eq!(
        listed,
        BTreeSet::from([
            "observer-linux-x86_64",
            "observer-linux-aarch64",
            "observer-image.tar",
        ])
    );
    run(Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&dist));
}

#[test]
#[ignore = "needs the release artifacts (cargo xtask dist): run by cargo xtask test"]
fn the_image_archive_is_read_by_skopeo_and_umoci_and_its_binaries_run() {
    let source = image::archive_source();
    let raw: serde_json::Value = serde_json::from_slice(
        &run(Command::new("skopeo").args(["inspect", "--raw", &source])).stdout,
    )
    .unwrap();
    let platforms: Vec<&str> = raw["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, ["amd64", "arm64"], "one image for both: {raw}");
    for (arch, runs_here) in [("amd64", cfg!(target_arch = "x86_64")), ("arm64", false)] {
        let inspected: serde_json::Value =
            serde_json::from_slice(&run(&mut image::skopeo(arch, &["inspect", &source])).stdout)
                .unwrap();
        assert_eq!(inspected["Architecture"], arch, "{inspected}");
        assert_eq!(inspected["Os"], "linux", "{inspected}");
        assert_eq!(inspected["Layers"].as_array().unwrap().len(), 1);
        let config = image::image_config(arch);
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/observer"])
        );

        let work = tempfile::tempdir().unwrap();
        let bundle = work.path().join("bundle");
        image::unpack(arch, &bundle);
        let entries: Vec<String> = std::fs::read_dir(bundle.join("rootfs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries, ["observer"], "a scratch image: the binary alone");
        let unpacked = bundle.join("rootfs/observer");
        let version = if runs_here {
            stdout(&run(Command::new(&unpacked).arg("--version")))
        } else {
            stdout(&run(Command::new("qemu-aarch64-static")
                .arg(&unpacked)
                .arg("--version")))
        };
        assert_eq!(version, format!("observer {}\n", env!("CARGO_PKG_VERSION")));
    }
}

/// The DaemonSet's capabilities (`add: [...]` in deploy/daemonset.yaml) with their numbers.
fn daemonset_capabilities() -> Vec<(String, u32)> {
    daemonset::read()
        .container()
        .security_context
        .capabilities
        .add
        .iter()
        .map(|name| (name.clone(), daemonset::capability_number(name)))
        .collect()
}

/// `observer rules --netns NODE` in the empty root with `caps`: exit 2 and one sentence.
fn refused(root: &EmptyRoot, caps: &[u32], node: &str) -> String {
    let out = root
        .command(Some(caps))
        .args(["rules", "-o", "json", "--netns"])
        .arg(format!("/run/netns/{node}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    stderr
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn alone_in_an_empty_root_with_the_daemonsets_capabilities_it_names_every_service() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("static"),
    })
    .expect("lab up");
    let caps = daemonset_capabilities();
    let numbers: Vec<u32> = caps.iter().map(|(_, cap)| *cap).collect();
    let root = EmptyRoot::new();

    // `rules`: the node's own iptables-save, run in PID 1's mount namespace.
    let out = run(root
        .command(Some(&numbers))
        .args(["rules", "-o", "json", "--netns"])
        .arg(format!("/run/netns/{}", lab.node_ns())));
    let services: BTreeSet<String> = stdout(&out)
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            line["service"].as_str().unwrap().to_owned()
        })
        .collect();
    let expected: BTreeSet<String> = lab
        .services()
        .iter()
        .map(|s| s.port_name_string())
        .collect();
    assert_eq!(services, expected);
    assert!(
        expected.contains("shop/checkout:http") && expected.contains("kube-system/kube-dns:dns")
    );

    // `record`: traffic to both Services, every connection named.
    let mut command = root.command(Some(&numbers));
    command.args(["record", "--write", "/conns.jsonl", "--idle-timeout", "1"]);
    let recorder = Recorder::spawn(command, root.path().join("conns.jsonl"));
    let checkout = lab.service("checkout").unwrap().cluster_addr();
    let dns = lab.service("kube-dns").unwrap().cluster_addr();
    let fresh = http_fresh(&lab, checkout, 6).unwrap();
    let udp = udp_queries(&lab, dns, 4).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());
    assert_eq!(recording.conns.len(), fresh.len() + udp.len());
    let named: BTreeSet<Option<&str>> = recording
        .conns
        .iter()
        .map(|c| c.service.as_deref())
        .collect();
    assert_eq!(
        named,
        BTreeSet::from([Some("shop/checkout:http"), Some("kube-system/kube-dns:dns")])
    );

    each_missing_capability_is_named(&root, &caps, lab.node_ns());
}

/// Item 5 of issue 22: with no iptables-save or nft in its root and the node's init's
/// root unreadable (here: without CAP_SYS_PTRACE), `observer rules` says so and what to
/// do, not that no namespace has rules.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn without_the_nodes_tools_rules_says_why_it_read_none() {
    require_root();
    let root = EmptyRoot::new();
    let without_ptrace: Vec<u32> = daemonset_capabilities()
        .into_iter()
        .filter(|(name, _)| name != "SYS_PTRACE")
        .map(|(_, cap)| cap)
        .collect();
    let out = root
        .command(Some(&without_ptrace))
        .arg("rules")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "observer: cannot read kube-proxy's rules: no iptables-save or nft in this root and /proc/{}/root is not readable (Permission denied: this process lacks CAP_SYS_PTRACE); run observer with hostPID and CAP_SYS_PTRACE, or on the node itself\n",
            std::process::id()
        )
    );
}

/// Without each capability that matters: exit 2 and one sentence that names it.
fn each_missing_capability_is_named(root: &EmptyRoot, caps: &[(String, u32)], node: &str) {
    let numbers: Vec<u32> = caps.iter().map(|(_, cap)| *cap).collect();
    for (name, wanted) in [
        (
            "SYS_ADMIN",
            "lacks CAP_SYS_ADMIN, which observer needs to enter the node's network namespace",
        ),
        (
            "NET_ADMIN",
            "lacks CAP_NET_ADMIN, which observer needs to read kube-proxy's rules",
        ),
        (
            "SYS_PTRACE",
            "is not readable (Permission denied: this process lacks CAP_SYS_PTRACE); run observer with hostPID and CAP_SYS_PTRACE",
        ),
        (
            "SYS_CHROOT",
            "lacks CAP_SYS_CHROOT, which observer needs to run the node's own iptables-save and nft in PID 1's mount namespace",
        ),
    ] {
        let fewer: Vec<u32> = caps
            .iter()
            .filter(|(cap, _)| cap != name)
            .map(|(_, cap)| *cap)
            .collect();
        assert_eq!(fewer.len(), caps.len() - 1, "{name} is in the DaemonSet");
        let stderr = refused(root, &fewer, node);
        assert!(stderr.contains(wanted), "without {name}: {stderr}");
    }
    // Without CAP_SYS_ADMIN, `record` cannot even load its programs.
    let without_admin: Vec<u32> = numbers.iter().copied().filter(|&cap| cap != 21).collect();
    let out = root
        .command(Some(&without_admin))
        .args(["record", "--write", "/refused.jsonl", "--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "loading kernel programs needs root: this process lacks CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"
        ),
        "{stderr}"
    );
}

/// A containerd of the test's own (own socket, root and state; no CRI plugin), killed
/// on drop.
struct Containerd {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start() -> Containerd {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().display();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{path}/root\"\nstate = \"{path}/state\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{path}/containerd.sock\"\n"
            ),
        )
        .unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("containerd (Debian package containerd; `cargo xtask setup` installs it)");
        let containerd = Containerd { child, dir };
        for _ in 0..100 {
            if containerd.ctr(&["version"]).status.success() {
                return containerd;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("containerd did not answer on its socket");
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.dir.path().join("containerd.sock"))
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Snapshots may be mounts; lazily unmount whatever is left under the root.
        let _ = Command::new("umount")
            .arg("-R")
            .arg("-l")
            .arg(self.dir.path().join("root"))
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn containerd_imports_the_image_as_kind_load_does() {
    require_root();
    let containerd = Containerd::start();
    let archive = dist_dir().join("observer-image.tar");
    // What `kind load image-archive` runs on every node.
    let out = containerd.ctr(&[
        "images",
        "import",
        "--all-platforms",
        "--digests",
        "--snapshotter=native",
        archive.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = stdout(&containerd.ctr(&["images", "ls", "--quiet"]));
    let image = daemonset::read().container().image.clone();
    assert!(
        names.lines().any(|name| name == image),
        "{image} (deploy/daemonset.yaml) not among the imported images:\n{names}"
    );
    // Both platforms' content came in: the name resolves on either kind of node.
    let listing = stdout(&containerd.ctr(&["images", "ls"]));
    let line = listing
        .lines()
        .find(|line| line.starts_with(&format!("{image} ")))
        .unwrap();
    assert!(line.contains("linux/amd64,linux/arm64/v8"), "{line}");
}
