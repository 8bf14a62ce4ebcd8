//! kube-proxy's iptables mode, as text for `iptables-restore`: what `syncProxyRules` in
//! pkg/proxy/iptables/proxier.go writes for our Services (Cluster traffic policies, no
//! session affinity, `--cluster-cidr` local detection, NodePorts on every local address).

use std::collections::BTreeSet;

use super::names::{ipt_ext_chain, ipt_sep_chain, ipt_svc_chain};
use super::spec::{CLUSTER_CIDR, Service};

/// `fmt.Sprintf("%#08x", 1<<14)`: kube-proxy's default masquerade bit.
const MASQ_MARK: &str = "0x004000";

const KUBE_SERVICES: &str = "KUBE-SERVICES";
const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
const KUBE_FORWARD: &str = "KUBE-FORWARD";
const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";

/// Chains kube-proxy owns per Service and deletes when they go stale (`isServiceChainName`).
const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
];

fn chain_line(chain: &str) -> String {
    format!(":{chain} - [0:0]")
}

/// Input for `iptables-restore --noflush` doing what kube-proxy does before its first
/// sync: the canary chains of its monitor, `EnsureChain` for each top-level chain and
/// `EnsureRule(Prepend, ...)` for the jumps into them (`iptablesJumpChains`, then the
/// kubelet's `KUBE-FIREWALL` jumps).
pub fn setup() -> String {
    const NEW: &str = "-m conntrack --ctstate NEW ";
    // (table, destination chain, source chain, comment, extra match)
    let jumps: [(&str, &str, &str, &str, &str); 14] = [
        (
            "filter",
            KUBE_EXTERNAL_SERVICES,
            "INPUT",
            "kubernetes externally-visible service portals",
            NEW,
        ),
        (
            "filter",
            KUBE_EXTERNAL_SERVICES,
            "FORWARD",
            "kubernetes externally-visible service portals",
            NEW,
        ),
        (
            "filter",
            KUBE_NODEPORTS,
            "INPUT",
            "kubernetes health check service ports",
            "",
        ),
        (
            "filter",
            KUBE_SERVICES,
            "FORWARD",
            "kubernetes service portals",
            NEW,
        ),
        (
            "filter",
            KUBE_SERVICES,
            "OUTPUT",
            "kubernetes service portals",
            NEW,
        ),
        (
            "filter",
            KUBE_FORWARD,
            "FORWARD",
            "kubernetes forwarding rules",
            "",
        ),
        (
            "filter",
            KUBE_PROXY_FIREWALL,
            "INPUT",
            "kubernetes load balancer firewall",
            NEW,
        ),
        (
            "filter",
            KUBE_PROXY_FIREWALL,
            "OUTPUT",
            "kubernetes load balancer firewall",
            NEW,
        ),
        (
            "filter",
            KUBE_PROXY_FIREWALL,
            "FORWARD",
            "kubernetes load balancer firewall",
            NEW,
        ),
        (
            "nat",
            KUBE_SERVICES,
            "OUTPUT",
            "kubernetes service portals",
            "",
        ),
        (
            "nat",
            KUBE_SERVICES,
            "PREROUTING",
            "kubernetes service portals",
            "",
        ),
        (
            "nat",
            KUBE_POSTROUTING,
            "POSTROUTING",
            "kubernetes postrouting rules",
            "",
        ),
        // The kubelet's firewall chain: no comment.
        ("filter", KUBE_FIREWALL, "INPUT", "", ""),
        ("filter", KUBE_FIREWALL, "OUTPUT", "", ""),
    ];
    let mut out = format!("*mangle\n{}\nCOMMIT\n", chain_line(KUBE_PROXY_CANARY));
    for table in ["filter", "nat"] {
        let mut chains = vec![KUBE_PROXY_CANARY];
        let mut rules = Vec::new();
        for (_, dst, src, comment, extra) in jumps.iter().filter(|j| j.0 == table) {
            if !chains.contains(dst) {
                chains.push(dst);
            }
            let comment = if comment.is_empty() {
                String::new()
            } else {
                format!("-m comment --comment \"{comment}\" ")
            };
            rules.push(format!("-I {src} {extra}{comment}-j {dst}"));
        }
        out.push_str(&format!("*{table}\n"));
        for c in chains {
            out.push_str(&chain_line(c));
            out.push('\n');
        }
        for r in rules {
            out.push_str(&r);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// `computeProbability`: `fmt.Sprintf("%0.10f", 1.0/float64(n))`.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// The input of one `iptables-restore --noflush --counters` that kube-proxy's
/// `syncProxyRules` feeds the kernel.
///
/// `previous` is the state the last sync wrote: `None` makes a full sync (start-up);
/// otherwise only the per-Service chains of Services that changed are rewritten (a partial
/// sync, as after a readiness flip). `existing_nat_chains` are the chains `iptables-save -t
/// nat` lists now: Service chains among them that are no longer used are flushed and deleted.
pub fn sync(
    services: &[Service],
    previous: Option<&[Service]>,
    existing_nat_chains: &[String],
) -> String {
    let mut filter_chains: Vec<String> = [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ]
    .iter()
    .map(|c| chain_line(c))
    .collect();
    let mut filter_rules: Vec<String> = Vec::new();
    let mut nat_chains: Vec<String> = [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_POSTROUTING,
        KUBE_MARK_MASQ,
    ]
    .iter()
    .map(|c| chain_line(c))
    .collect();
    let mut nat_rules: Vec<String> = vec![
        format!("-A {KUBE_POSTROUTING} -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
        format!("-A {KUBE_POSTROUTING} -j MARK --xor-mark {MASQ_MARK}"),
        format!(
            "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
        ),
        format!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {MASQ_MARK}"),
    ];
    // IPv4 with localhost NodePorts allowed (the default): the kubelet's anti-martian rule.
    filter_chains.push(chain_line(KUBE_FIREWALL));
    filter_rules.push(format!(
        "-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
    ));

    let mut active: BTreeSet<String> = BTreeSet::new();
    for svc in services {
        let spn = svc.port_name_string();
        let proto = svc.proto.as_str();
        let endpoints = svc.endpoint_addrs();
        let has_endpoints = !endpoints.is_empty();
        let svc_chain = ipt_svc_chain(&spn, proto);
        let ext_chain = ipt_ext_chain(&spn, proto);
        let uses_ext_chain = has_endpoints && svc.node_port.is_some();
        let (cip, port) = (svc.cluster_ip, svc.port);

        if has_endpoints {
            nat_rules.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d {cip} --dport {port} -j {svc_chain}"
            ));
        } else {
            filter_rules.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment \"{spn} has no endpoints\" -m {proto} -p {proto} -d {cip} --dport {port} -j REJECT"
            ));
        }
        if let Some(np) = svc.node_port {
            if has_endpoints {
                nat_rules.push(format!(
                    "-A {KUBE_NODEPORTS} -m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {ext_chain}"
                ));
            } else {
                filter_rules.push(format!(
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment \"{spn} has no endpoints\" -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j REJECT"
                ));
            }
        }

        // A partial sync computes unchanged Services' chains but throws them away.
        let changed = previous.is_none_or(|prev| !prev.contains(svc));
        let mut skipped_chains = Vec::new();
        let mut skipped_rules = Vec::new();
        let (chains, rules) = if changed {
            (&mut nat_chains, &mut nat_rules)
        } else {
            (&mut skipped_chains, &mut skipped_rules)
        };

        if has_endpoints {
            rules.push(format!(
                "-A {svc_chain} -m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d {cip} --dport {port} ! -s {CLUSTER_CIDR} -j {KUBE_MARK_MASQ}"
            ));
        }
        if uses_ext_chain {
            chains.push(chain_line(&ext_chain));
            active.insert(ext_chain.clone());
            rules.push(format!(
                "-A {ext_chain} -m comment --comment \"masquerade traffic for {spn} external destinations\" -j {KUBE_MARK_MASQ}"
            ));
            rules.push(format!("-A {ext_chain} -j {svc_chain}"));
        }
        if has_endpoints {
            chains.push(chain_line(&svc_chain));
            active.insert(svc_chain.clone());
            let n = endpoints.len();
            for (i, ep) in endpoints.iter().enumerate() {
                let sep = ipt_sep_chain(&spn, proto, &ep.to_string());
                let statistic = if i < n - 1 {
                    format!(
                        " -m statistic --mode random --probability {}",
                        probability(n - i)
                    )
                } else {
                    String::new()
                };
                rules.push(format!(
                    "-A {svc_chain} -m comment --comment \"{spn} -> {ep}\"{statistic} -j {sep}"
                ));
            }
        }
        for ep in &endpoints {
            let sep = ipt_sep_chain(&spn, proto, &ep.to_string());
            chains.push(chain_line(&sep));
            active.insert(sep.clone());
            rules.push(format!(
                "-A {sep} -m comment --comment {spn} -s {} -j {KUBE_MARK_MASQ}",
                ep.ip()
            ));
            rules.push(format!(
                "-A {sep} -m comment --comment {spn} -m {proto} -p {proto} -j DNAT --to-destination {ep}"
            ));
        }
    }

    for chain in existing_nat_chains {
        let ours = SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p));
        if ours && !active.contains(chain) {
            nat_chains.push(chain_line(chain));
            nat_rules.push(format!("-X {chain}"));
        }
    }

    nat_rules.push(format!(
        "-A {KUBE_SERVICES} -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}"
    ));
    // nf_conntrack_tcp_be_liberal is 0: drop INVALID packets.
    filter_rules.push(format!(
        "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP"
    ));
    filter_rules.push(format!(
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
    ));
    filter_rules.push(format!(
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    ));

    let mut out = String::from("*filter\n");
    for line in filter_chains.iter().chain(&filter_rules) {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("COMMIT\n*nat\n");
    for line in nat_chains.iter().chain(&nat_rules) {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("COMMIT\n");
    out
}

/// Chain names from `iptables-save` output (`:NAME POLICY [p:b]` lines).
pub fn chains_in_save(save: &str) -> Vec<String> {
    save.lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::spec::{pods, services};
    use super::*;

    fn lines(s: &str) -> Vec<&str> {
        s.lines().collect()
    }

    #[test]
    fn probabilities_use_ten_decimals() {
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(7), "0.1428571429");
    }

    #[test]
    fn full_sync_writes_kube_proxy_chains_and_waterfall() {
        let svcs = services(&pods("t"));
        let out = sync(&svcs, None, &[]);
        let svc = ipt_svc_chain("shop/checkout:http", "tcp");
        let ext = ipt_ext_chain("shop/checkout:http", "tcp");
        let sep = |ip: &str| ipt_sep_chain("shop/checkout:http", "tcp", ip);
        let l = lines(&out);
        let nat_start = l.iter().position(|x| *x == "*nat").unwrap();
        let nat = &l[nat_start..];
        let expected_checkout = [
            format!(
                "-A KUBE-SERVICES -m comment --comment \"shop/checkout:http cluster IP\" -m tcp -p tcp -d 10.96.35.226 --dport 80 -j {svc}"
            ),
            format!(
                "-A KUBE-NODEPORTS -m comment --comment shop/checkout:http -m tcp -p tcp --dport 30080 -j {ext}"
            ),
            format!(
                "-A {svc} -m comment --comment \"shop/checkout:http cluster IP\" -m tcp -p tcp -d 10.96.35.226 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"
            ),
            format!(
                "-A {ext} -m comment --comment \"masquerade traffic for shop/checkout:http external destinations\" -j KUBE-MARK-MASQ"
            ),
            format!("-A {ext} -j {svc}"),
            format!(
                "-A {svc} -m comment --comment \"shop/checkout:http -> 10.244.1.12:8080\" -m statistic --mode random --probability 0.3333333333 -j {}",
                sep("10.244.1.12:8080")
            ),
            format!(
                "-A {svc} -m comment --comment \"shop/checkout:http -> 10.244.1.13:8080\" -m statistic --mode random --probability 0.5000000000 -j {}",
                sep("10.244.1.13:8080")
            ),
            format!(
                "-A {svc} -m comment --comment \"shop/checkout:http -> 10.244.1.14:8080\" -j {}",
                sep("10.244.1.14:8080")
            ),
            format!(
                "-A {} -m comment --comment shop/checkout:http -s 10.244.1.12 -j KUBE-MARK-MASQ",
                sep("10.244.1.12:8080")
            ),
            format!(
                "-A {} -m comment --comment shop/checkout:http -m tcp -p tcp -j DNAT --to-destination 10.244.1.12:8080",
                sep("10.244.1.12:8080")
            ),
        ];
        let first = nat
            .iter()
            .position(|x| *x == expected_checkout[0])
            .expect("ClusterIP rule");
        for (i, want) in expected_checkout.iter().enumerate() {
            assert_eq!(nat[first + i], want, "line {i}");
        }
        // Chain declarations: top-level first, then EXT, SVC, SEPs of checkout.
        assert_eq!(
            &nat[1..5],
            [
                ":KUBE-SERVICES - [0:0]",
                ":KUBE-NODEPORTS - [0:0]",
                ":KUBE-POSTROUTING - [0:0]",
                ":KUBE-MARK-MASQ - [0:0]"
            ]
        );
        assert_eq!(nat[5], format!(":{ext} - [0:0]"));
        assert_eq!(nat[6], format!(":{svc} - [0:0]"));
        // The UDP service: two endpoints, probability 1/2 then the catch-all.
        let dns = ipt_svc_chain("kube-system/kube-dns:dns", "udp");
        assert!(out.contains(&format!("-A {dns} -m comment --comment \"kube-system/kube-dns:dns -> 10.244.1.20:5353\" -m statistic --mode random --probability 0.5000000000 -j {}\n", ipt_sep_chain("kube-system/kube-dns:dns", "udp", "10.244.1.20:5353"))));
        assert!(out.contains("-m comment --comment kube-system/kube-dns:dns -m udp -p udp -j DNAT --to-destination 10.244.1.21:5353\n"));
        // The NodePort jump closes KUBE-SERVICES; the table ends with COMMIT.
        assert_eq!(
            nat[nat.len() - 2],
            "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
        );
        assert_eq!(nat[nat.len() - 1], "COMMIT");
        assert!(!out.contains("REJECT"));
    }

    #[test]
    fn service_without_endpoints_gets_only_reject_rules() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.clear();
        let out = sync(&svcs, None, &[]);
        assert!(out.contains("-A KUBE-SERVICES -m comment --comment \"shop/checkout:http has no endpoints\" -m tcp -p tcp -d 10.96.35.226 --dport 80 -j REJECT\n"));
        assert!(out.contains("-A KUBE-EXTERNAL-SERVICES -m comment --comment \"shop/checkout:http has no endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT\n"));
        assert!(!out.contains(&ipt_svc_chain("shop/checkout:http", "tcp")));
        assert!(!out.contains(&ipt_ext_chain("shop/checkout:http", "tcp")));
        assert!(!out.contains("--dport 30080 -j KUBE-EXT"));
        // The other service is untouched.
        assert!(out.contains(&ipt_svc_chain("kube-system/kube-dns:dns", "udp")));
    }

    #[test]
    fn readiness_flip_rewrites_only_the_changed_service_and_deletes_its_stale_endpoint() {
        let before = services(&pods("t"));
        let mut after = before.clone();
        after[0].endpoints.retain(|p| p.name != "checkout-b");
        let existing = chains_in_save(&sync(&before, None, &[]));
        let out = sync(&after, Some(&before), &existing);
        let svc = ipt_svc_chain("shop/checkout:http", "tcp");
        let gone = ipt_sep_chain("shop/checkout:http", "tcp", "10.244.1.13:8080");
        let a = ipt_sep_chain("shop/checkout:http", "tcp", "10.244.1.12:8080");
        let c = ipt_sep_chain("shop/checkout:http", "tcp", "10.244.1.14:8080");
        let l = lines(&out);
        // The new waterfall: 1/2 then the rest.
        let wf: Vec<&&str> = l
            .iter()
            .filter(|x| {
                x.starts_with(&format!(
                    "-A {svc} -m comment --comment \"shop/checkout:http ->"
                ))
            })
            .collect();
        assert_eq!(wf.len(), 2);
        assert_eq!(
            *wf[0],
            format!(
                "-A {svc} -m comment --comment \"shop/checkout:http -> 10.244.1.12:8080\" -m statistic --mode random --probability 0.5000000000 -j {a}"
            )
        );
        assert_eq!(
            *wf[1],
            format!(
                "-A {svc} -m comment --comment \"shop/checkout:http -> 10.244.1.14:8080\" -j {c}"
            )
        );
        // The removed endpoint's chain: flushed by its chain line, then deleted.
        assert!(l.contains(&format!(":{gone} - [0:0]").as_str()));
        assert!(l.contains(&format!("-X {gone}").as_str()));
        assert!(!out.contains(&format!("-j {gone}")));
        // kube-dns did not change: its ClusterIP rule stays, its own chains are not rewritten.
        let dns = ipt_svc_chain("kube-system/kube-dns:dns", "udp");
        assert!(out.contains(&format!("--dport 53 -j {dns}\n")));
        assert!(!l.contains(&format!(":{dns} - [0:0]").as_str()));
        assert!(!out.contains(&format!("-A {dns} ")));
        assert!(!out.contains(&format!("-X {dns}")));
    }

    #[test]
    fn setup_prepends_kube_proxy_jumps() {
        let out = setup();
        assert!(out.starts_with("*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*filter\n"));
        assert!(out.contains(
            "-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(out.contains(
            "-I OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(out.contains("-I POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n"));
        assert!(out.contains("-I FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"));
        assert!(out.contains("-I INPUT -j KUBE-FIREWALL\n"));
        assert_eq!(out.matches("COMMIT").count(), 3);
    }

    #[test]
    fn chains_are_read_from_iptables_save() {
        let save = "# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SEP-ABC - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        assert_eq!(chains_in_save(save), ["PREROUTING", "KUBE-SEP-ABC"]);
    }
}
