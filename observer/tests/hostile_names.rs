//! Root test of a hostile node's strings (issue 22): what observer reads from the node
//! reaches terminals only as printable text. Three names hold `ESC [ 2 J` (clear the
//! screen): the hostname of pod checkout-b, set by a process of the pod (as one with
//! `CAP_SYS_ADMIN` can) and the only name of the pod (its bundle is gone); the pod-name
//! annotation of checkout-c's sandbox bundle; and a Service's name, in kube-proxy's rule
//! comments, which also holds a right-to-left override (U+202E). `observer rules`, the
//! live view (the real binary in tmux, where a raw escape would clear the screen),
//! `summary` of the log it wrote and the log itself show each as `\x1b[2J` and
//! `\u{202e}`; no output and no byte of the log holds either, raw or JSON-escaped.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use common::tmux::Tmux;
use common::{only_node, prefix, require_root};
use observer::model::record::Recording;
use observer_lab::{Lab, LabConfig, RuleMode, Service, Topology, http_fresh};

/// Clears the screen.
const ESCAPE: &str = "\u{1b}[2J";
/// How observer shows it.
const SHOWN: &str = "\\x1b[2J";
/// Right-to-left override: shows the text after it reversed.
const BIDI: &str = "\u{202e}";
const BIDI_SHOWN: &str = "\\u{202e}";
const EVIL_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 35, 240);

/// The sandbox bundle's `config.json` of lab pod `pod` under `root`.
fn sandbox_bundle(root: &Path, pod: &str) -> PathBuf {
    std::fs::read_dir(root)
        .unwrap()
        .map(|entry| entry.unwrap().path().join("config.json"))
        .find(|config| {
            let spec: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
            let annotations = &spec["annotations"];
            annotations["io.kubernetes.cri.container-type"] == "sandbox"
                && annotations["io.kubernetes.cri.sandbox-name"] == pod
        })
        .unwrap_or_else(|| panic!("no sandbox bundle of {pod}"))
}

/// The hostile lab: see the module doc.
fn hostile_lab() -> Lab {
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("hn"),
    })
    .expect("lab up");
    let root = lab.runtime_root();
    let b = sandbox_bundle(&root, "checkout-b");
    std::fs::remove_dir_all(b.parent().unwrap()).unwrap();
    lab.set_hostname("checkout-b", format!("{ESCAPE}checkout-b").as_bytes())
        .expect("a pod's hostname");
    let c = sandbox_bundle(&root, "checkout-c");
    let mut spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&c).unwrap()).unwrap();
    spec["annotations"]["io.kubernetes.cri.sandbox-name"] = format!("{ESCAPE}checkout-c").into();
    std::fs::write(&c, spec.to_string()).unwrap();
    let checkout = lab.service("checkout").unwrap().clone();
    lab.add_service(Service {
        name: format!("{ESCAPE}{BIDI}evil"),
        cluster_ip: EVIL_IP,
        node_port: None,
        ..checkout
    })
    .expect("a Service with an escape in its name");
    lab
}

/// Asserts that `output` holds no escape character and shows `expected`.
fn assert_printable(what: &str, output: &str, expected: &[String]) {
    assert!(
        !output.contains('\u{1b}') && !output.contains(BIDI),
        "{what} holds an escape or a bidi override:\n{output}"
    );
    for text in expected {
        assert!(
            output.contains(text.as_str()),
            "{what} lacks {text}:\n{output}"
        );
    }
}

/// Runs observer with `args`; returns its stdout and stderr.
fn observer(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "observer {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn escapes_from_the_node_are_shown_as_text() {
    require_root();
    let lab = hostile_lab();
    let service = format!("shop/{SHOWN}{BIDI_SHOWN}evil:http");
    let pods = [
        format!("{SHOWN}checkout-b"),
        format!("shop/{SHOWN}checkout-c"),
    ];
    // The live view's pod column keeps a long name's end.
    let pods_on_screen = [format!("{SHOWN}checkout-b"), format!("{SHOWN}checkout-c")];

    let rules = observer(&["rules"]);
    assert_printable("observer rules", &rules, std::slice::from_ref(&service));

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("live.jsonl");
    let command = format!(
        "{} --idle-timeout 2 --write {} --runtime-root {}",
        env!("CARGO_BIN_EXE_observer"),
        log.display(),
        lab.runtime_root().display()
    );
    let tmux = Tmux::start(
        &format!("observer-hostile-{}", std::process::id()),
        &command,
    );
    let hooks = format!("hooks {}", common::hooks_attached());
    tmux.wait_for("the status bar", |s| s.contains(&hooks));
    // Until every pod has answered at least once (the rules pick at random).
    let evil = SocketAddrV4::new(EVIL_IP, 80);
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 3 {
        for answer in http_fresh(&lab, evil, 3).expect("connections to the evil Service") {
            answered.insert(answer.pod);
        }
    }
    let overview = tmux.wait_for("the Service's row", |s| s.contains(&service));
    assert_printable("the overview", &overview, std::slice::from_ref(&service));
    // The Service's screen, by pod names (the default).
    tmux.keys(&["/", "e", "v", "i", "l", "Enter", "Enter"]);
    let screen = tmux.wait_for("the backends by pod name", |s| {
        pods_on_screen.iter().all(|pod| s.contains(pod.as_str()))
    });
    let mut on_screen = vec![service.clone()];
    on_screen.extend(pods_on_screen.iter().cloned());
    assert_printable("the Service's screen", &screen, &on_screen);
    tmux.quit();

    let bytes = std::fs::read(&log).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        !text.contains('\u{1b}')
            && !text.contains("\\u001b")
            && !text.contains(BIDI)
            && !text.to_lowercase().contains("\\u202e"),
        "the log holds an escape or a bidi override, raw or JSON-escaped"
    );
    let mut recording = Recording::parse("live.jsonl", &text).unwrap();
    only_node(&mut recording, lab.node_ns());
    let mut expected = vec![service.clone()];
    expected.extend(pods.iter().cloned());
    let summary = observer(&["summary", log.to_str().unwrap()]);
    assert_printable("summary", &summary, &expected);
    assert!(
        recording
            .conns
            .iter()
            .all(|c| c.service.as_deref() == Some(service.as_str())),
        "{:?}",
        recording.conns
    );
}
