//! kube-proxy's iptables mode, as text for `iptables-restore`: what `syncProxyRules` in
//! pkg/proxy/iptables/proxier.go writes for our Services (`externalTrafficPolicy` and
//! ClientIP session affinity: see `chains`, `--cluster-cidr` local detection, NodePorts on every local address).

mod chains;

use std::collections::BTreeSet;

use crate::spec::Service;

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

/// (table, destination chain, source chain, comment, extra match) of each jump
/// kube-proxy prepends (`iptablesJumpChains`), then the kubelet's `KUBE-FIREWALL` jumps.
const JUMPS: [(&str, &str, &str, &str, &str); 14] = [
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
const NEW: &str = "-m conntrack --ctstate NEW ";

/// Input for `iptables-restore --noflush` doing what kube-proxy does before its first
/// sync: the canary chains of its monitor, `EnsureChain` for each top-level chain and
/// `EnsureRule(Prepend, ...)` for the jumps into them ([`JUMPS`]).
pub fn setup() -> String {
    let mut out = format!("*mangle\n{}\nCOMMIT\n", chain_line(KUBE_PROXY_CANARY));
    for table in ["filter", "nat"] {
        let mut chains = vec![KUBE_PROXY_CANARY];
        let mut rules = Vec::new();
        for (_, dst, src, comment, extra) in JUMPS.iter().filter(|j| j.0 == table) {
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
        for line in chains.iter().map(|c| chain_line(c)).chain(rules) {
            out.push_str(&line);
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
    let mut tables = Tables::top_level();
    let mut active: BTreeSet<String> = BTreeSet::new();
    for svc in services {
        chains::frontend_rules(svc, &mut tables);
        // A partial sync computes unchanged Services' chains but throws them away.
        let changed = previous.is_none_or(|prev| !prev.contains(svc));
        let mut skipped = Chains::default();
        let into = if changed {
            &mut tables.nat
        } else {
            &mut skipped
        };
        chains::service_chains(svc, into, &mut active);
    }
    for chain in existing_nat_chains {
        let ours = SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p));
        if ours && !active.contains(chain) {
            tables.nat.chains.push(chain_line(chain));
            tables.nat.rules.push(format!("-X {chain}"));
        }
    }
    tables.close();
    tables.render()
}

/// One table's chain declarations and rules, in `iptables-restore` order.
#[derive(Default)]
struct Chains {
    chains: Vec<String>,
    rules: Vec<String>,
}

impl Chains {
    fn declaring(names: &[&str]) -> Chains {
        Chains {
            chains: names.iter().map(|c| chain_line(c)).collect(),
            rules: Vec::new(),
        }
    }
}

struct Tables {
    filter: Chains,
    nat: Chains,
}

impl Tables {
    /// The top-level chains with the rules that do not depend on the Services.
    fn top_level() -> Tables {
        let mut filter = Chains::declaring(&[
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_FORWARD,
            KUBE_NODEPORTS,
            KUBE_PROXY_FIREWALL,
        ]);
        let mut nat = Chains::declaring(&[
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
        ]);
        nat.rules = vec![
            format!("-A {KUBE_POSTROUTING} -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-A {KUBE_POSTROUTING} -j MARK --xor-mark {MASQ_MARK}"),
            format!(
                "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
            ),
            format!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {MASQ_MARK}"),
        ];
        // IPv4 with localhost NodePorts allowed (the default): the kubelet's anti-martian rule.
        filter.chains.push(chain_line(KUBE_FIREWALL));
        filter.rules.push(format!(
            "-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        ));
        Tables { filter, nat }
    }

    /// The rules that end the sync: the NodePort jump last in KUBE-SERVICES, KUBE-FORWARD.
    fn close(&mut self) {
        self.nat.rules.push(format!(
            "-A {KUBE_SERVICES} -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}"
        ));
        // nf_conntrack_tcp_be_liberal is 0: drop INVALID packets.
        self.filter.rules.extend([
            format!("-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP"),
            format!(
                "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
            ),
            format!(
                "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
            ),
        ]);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (name, table) in [("filter", &self.filter), ("nat", &self.nat)] {
            out.push_str(&format!("*{name}\n"));
            for line in table.chains.iter().chain(&table.rules) {
                out.push_str(line);
                out.push('\n');
            }
            out.push_str("COMMIT\n");
        }
        out
    }
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
    use super::*;
    use crate::names::{ipt_ext_chain, ipt_sep_chain, ipt_svc_chain};
    use crate::spec::{pods, services};

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
