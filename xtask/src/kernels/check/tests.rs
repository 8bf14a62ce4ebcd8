use super::*;

fn expected() -> Expected {
    Expected {
        release: "6.1.0-57-cloud-amd64".into(),
        pods: [("a", [10, 244, 1, 12]), ("b", [10, 244, 1, 13])]
            .map(|(n, a)| (n.to_owned(), a.into()))
            .into(),
        client_ip: "10.244.1.9".into(),
        http: ServicePort {
            name: "shop/checkout:http".into(),
            addr: "10.96.35.226:80".into(),
            target_port: 8080,
        },
        lines: ServicePort {
            name: "shop/checkout:lines".into(),
            addr: "10.96.35.226:81".into(),
            target_port: 8081,
        },
        connections: 2,
        held_lines: 3,
        offsets: [("sk_buff._nfct", 104), ("net.ns.inum", 144)]
            .map(|(p, o)| (p.to_owned(), o))
            .into(),
    }
}

fn conn(port: u16, backend: &str, sent: u64, received: u64) -> String {
    format!(
        r#"{{"type":"conn","proto":"tcp","client":"10.244.1.9:{port}","original_dst":"10.96.35.226:80","backend":"{backend}","service":"shop/checkout:http","endpoint_in_rules":true,"netns":1,"start":"t","end":"t","duration_ms":1.0,"requests":1,"bytes_to_backend":{sent},"bytes_from_backend":{received},"close":"fin","connect_ms":null,"start_seen":true}}"#
    )
}

fn held(port: u16, sent: u64, received: u64) -> String {
    format!(
        r#"{{"type":"conn","proto":"tcp","client":"10.244.1.9:{port}","original_dst":"10.96.35.226:81","backend":"10.244.1.13:8081","service":"shop/checkout:lines","endpoint_in_rules":true,"netns":1,"start":"t","end":"t","duration_ms":1.0,"requests":3,"bytes_to_backend":{sent},"bytes_from_backend":{received},"close":"fin","connect_ms":null,"start_seen":false}}"#
    )
}

const NETLINK_SENTENCE: &str = "observer: warning: conntrack's netlink interface is missing (module nf_conntrack_netlink is not loaded): observer cannot adopt connections that began before it, nor see conntrack remove entries (timeouts, flushes, deletes), nor read conntrack's table fill and drops; load it with `modprobe nf_conntrack_netlink`";

const FLOWTABLE_WARNING: &str = "observer: warning: network namespace 4026531840 (/proc/self/ns/net) has nftables flowtable inet fast/ft on v-client: the flows it offloads skip netfilter's hooks and carry no conntrack entry, so their packets after the first few are not counted";

/// What a guest where everything works reports.
fn good() -> String {
    let mut lines = vec![
        "RELEASE 6.1.0-57-cloud-amd64".to_owned(),
        "EXIT without-ctnetlink 0".to_owned(),
        format!("STDERR without-ctnetlink {NETLINK_SENTENCE}"),
        "STDERR without-ctnetlink observer: attached 2 kernel program(s); recording".to_owned(),
    ];
    for s in SCENARIOS {
        lines.extend([
            format!("HELD {s} 57 87 3 b"),
            format!("LOG {s} {}", held(39000, 57, 87)),
            format!("CLIENT {s} 1 48 219 b"),
            format!("CLIENT {s} 2 49 219 a"),
            format!("EXIT {s} 0"),
            format!("STDERR {s} [DEBUG] kernel offsets from BTF: sk_buff._nfct=104 net.ns.inum=144"),
            format!("STDERR {s} [DEBUG] net_dev_queue attached as a BTF tracepoint"),
            format!("LOG {s} {}", conn(40000, "10.244.1.12:8080", 49, 219)),
            format!("LOG {s} {}", conn(40001, "10.244.1.13:8080", 48, 219)),
            format!(
                r#"LOG {s} {{"type":"summary","connections":3,"dnat_events":3,"lost_events":0,"read_errors":0}}"#
            ),
            format!("STDERR {s} observer: attached 2 kernel program(s); recording DNATed connections to /tmp/x"),
            format!("PROGS {s} 1 3 1 0"),
        ]);
    }
    lines.extend([
        "EXIT flowtable 0".to_owned(),
        format!("STDERR flowtable {FLOWTABLE_WARNING}"),
    ]);
    lines.push("NOBTF 2 observer: cannot read kernel BTF at /nonexistent (...); observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y".into());
    lines.push("DONE".into());
    lines.join("\n")
}

#[test]
fn a_report_where_everything_holds_passes() {
    assert_eq!(check(&good(), &expected()), Vec::<String>::new());
}

#[test]
fn the_revalidation_program_counts_as_loaded_where_observer_said_it_loaded() {
    let report = good().replace(
        "STDERR nftables [DEBUG] net_dev_queue attached as a BTF tracepoint",
        "STDERR nftables [DEBUG] net_dev_queue attached as a BTF tracepoint\nSTDERR nftables [2026-12-03T08:23:41Z DEBUG observer::kernel::attach] the revalidation program loaded (run, not attached)",
    );
    assert_eq!(
        check(&report, &expected()),
        vec!["nftables: not attached and detached cleanly: observer attached Some(2) programs; bpftool counted before, during, after, pinned objects: [1, 3, 1, 0]".to_owned()]
    );
    let report = report.replace("PROGS nftables 1 3 1 0", "PROGS nftables 1 4 1 0");
    assert_eq!(check(&report, &expected()), Vec::<String>::new());
    // A debug line quoting the verifier's errno is no bare errno.
    let report = good().replace(
        "STDERR without-ctnetlink observer: attached",
        "STDERR without-ctnetlink [2026-12-03T08:23:41Z DEBUG observer::kernel::attach] the kernel refused the revalidation program (the BPF_PROG_LOAD syscall returned Invalid argument (os error 22))\nSTDERR without-ctnetlink observer: attached",
    );
    assert_eq!(check(&report, &expected()), Vec::<String>::new());
}

#[test]
fn each_wrong_fact_is_one_line_naming_it() {
    let cases: [(&str, &str, &str); 15] = [
        ("DONE", "", "the guest did not finish its scenarios"),
        (
            "EXIT iptables 0",
            "EXIT iptables 1",
            "iptables: observer record exited with Some(\"1\"), expected 0",
        ),
        (
            "net.ns.inum=144",
            "net.ns.inum=136",
            "iptables: offset net.ns.inum: observer read Some(136), the C compiler says 144",
        ),
        (
            "PROGS nftables 1 3 1 0",
            "PROGS nftables 1 3 3 0",
            "nftables: not attached and detached cleanly: observer attached Some(2) programs; bpftool counted before, during, after, pinned objects: [1, 3, 3, 0]",
        ),
        (
            "PROGS iptables 1 3 1 0",
            "PROGS iptables 0 0 0 0",
            "iptables: not attached and detached cleanly",
        ),
        (
            "PROGS nftables 1 3 1 0",
            "PROGS nftables 1 3 1 1",
            "nftables: not attached and detached cleanly",
        ),
        (
            "\"bytes_from_backend\":219,\"close\":\"fin\",\"connect_ms\":null,\"start_seen\":true}\nLOG iptables {\"type\":\"conn\",\"proto\":\"tcp\",\"client\":\"10.244.1.9:40001\"",
            "\"bytes_from_backend\":218,\"close\":\"fin\",\"connect_ms\":null,\"start_seen\":true}\nLOG iptables {\"type\":\"conn\",\"proto\":\"tcp\",\"client\":\"10.244.1.9:40001\"",
            "iptables: bytes_from_backend wrong for the connection that sent 49 bytes to 10.244.1.12:8080 and got 219",
        ),
        ("NOBTF 2", "NOBTF 1", "--btf /nonexistent: expected exit 2"),
        (
            "[DEBUG] net_dev_queue attached as a BTF tracepoint",
            "[DEBUG] net_dev_queue attached as a raw tracepoint",
            "iptables: net_dev_queue was not attached as a BTF tracepoint",
        ),
        (
            "\"dnat_events\":3",
            "\"dnat_events\":4",
            "iptables: summary should count 3 connections and DNAT events",
        ),
        // The connection opened before observer: adopted, counted from observer's start.
        (
            "\"requests\":3,",
            "\"requests\":4,",
            "iptables: requests wrong for the connection that sent 57 bytes to 10.244.1.13:8081 and got 87",
        ),
        (
            "\"bytes_to_backend\":57",
            "\"bytes_to_backend\":64",
            "iptables: bytes_to_backend wrong for the connection that sent 57 bytes",
        ),
        (
            "\"start_seen\":false",
            "\"start_seen\":true",
            "iptables: start_seen wrong for the connection that sent 57 bytes",
        ),
        (
            "HELD nftables 57 87 3 b",
            "HELD nftables 57 87 2 b",
            "nftables: the connection opened before observer was not answered 3 times by one known pod",
        ),
        (
            "STDERR nftables [DEBUG] net_dev_queue",
            "STDERR nftables observer: warning: cannot dump conntrack in /proc/1/ns/net: Invalid argument\nSTDERR nftables [DEBUG] net_dev_queue",
            "nftables: observer warned: observer: warning: cannot dump conntrack",
        ),
    ];
    for (from, to, want) in cases {
        let report = good().replacen(from, to, 1);
        assert_ne!(report, good(), "{from}");
        let failures = check(&report, &expected());
        assert_eq!(failures.len(), 1, "{from}: {failures:#?}");
        assert!(failures[0].starts_with(want), "{from}: {failures:#?}");
    }
}

#[test]
fn a_record_on_another_backend_than_the_client_saw_fails() {
    let report = good().replacen(
        r#""backend":"10.244.1.12:8080""#,
        r#""backend":"10.244.1.13:8080""#,
        1,
    );
    let failures = check(&report, &expected());
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert!(
        failures[0].starts_with("iptables: backend wrong"),
        "{failures:#?}"
    );
}

#[test]
fn missing_records_and_unanswered_clients_are_counted() {
    let report = good()
        .replacen("CLIENT iptables 2 49 219 a", "CLIENT iptables 2 49 0 ", 1)
        .replacen(
            &format!(
                "LOG nftables {}\n",
                conn(40001, "10.244.1.13:8080", 48, 219)
            ),
            "",
            1,
        );
    let failures = check(&report, &expected());
    assert!(
        failures.contains(&"iptables: client got no answer from a known pod: 2 49 0 ".to_owned()),
        "{failures:#?}"
    );
    assert!(
        failures.contains(&"iptables: 1 clients were answered, expected 2".to_owned()),
        "{failures:#?}"
    );
    assert!(
        failures.contains(&"nftables: 1 conn records for 2 client connections".to_owned()),
        "{failures:#?}"
    );
}

#[test]
fn without_ctnetlink_observer_says_so_once_and_never_with_a_bare_errno() {
    let once = format!("STDERR without-ctnetlink {NETLINK_SENTENCE}\n");
    let twice = good().replacen(&once, &format!("{once}{once}"), 1);
    assert_eq!(
        check(&twice, &expected()),
        [format!(
            "without-ctnetlink: observer said 2 times that conntrack's netlink interface is missing, expected once: {:?}",
            [
                NETLINK_SENTENCE,
                NETLINK_SENTENCE,
                "observer: attached 2 kernel program(s); recording"
            ]
        )]
    );
    let bare = good().replacen(
        &once,
        "STDERR without-ctnetlink observer: warning: cannot dump conntrack in /proc/1/ns/net: Invalid argument\n",
        1,
    );
    let failures = check(&bare, &expected());
    assert_eq!(failures.len(), 2, "{failures:#?}");
    assert!(failures[0].starts_with("without-ctnetlink: observer said 0 times"));
    assert_eq!(
        failures[1],
        "without-ctnetlink: observer printed a bare errno: observer: warning: cannot dump conntrack in /proc/1/ns/net: Invalid argument"
    );
}

#[test]
fn the_netfilter_hook_is_expected_from_6_12_on() {
    use super::netfilter_kernel;
    assert!(netfilter_kernel("6.12.118+deb12-cloud-amd64"));
    assert!(netfilter_kernel("6.18.0"));
    assert!(!netfilter_kernel("6.1.0-57-arm64"));
    assert!(!netfilter_kernel("5.10.0-46-cloud-amd64"));
}

#[test]
fn the_flowtable_is_said_once_and_nothing_else() {
    let unsaid = good().replace(&format!("STDERR flowtable {FLOWTABLE_WARNING}"), "");
    assert_eq!(
        check(&unsaid, &expected()),
        vec![format!(
            "flowtable: expected one warning naming the flowtable ({FLOWTABLE_SAID:?}), got []"
        )]
    );
    let twice = good().replace(
        &format!("STDERR flowtable {FLOWTABLE_WARNING}"),
        &format!("STDERR flowtable {FLOWTABLE_WARNING}\nSTDERR flowtable {FLOWTABLE_WARNING}"),
    );
    assert_eq!(check(&twice, &expected()).len(), 1);
    let failed = good().replace("EXIT flowtable 0", "EXIT flowtable 1");
    assert_eq!(
        check(&failed, &expected()),
        vec!["flowtable: observer record exited with Some(\"1\"), expected 0".to_owned()]
    );
}
