//! One Service port's rules: its frontend jumps (or "has no endpoints" rejects) and its
//! own KUBE-SVC / KUBE-SVL / KUBE-EXT / KUBE-SEP chains, as `syncProxyRules` and
//! `writeServiceToEndpointRules` in kube-proxy's (up to 1.35) pkg/proxy/iptables/proxier.go write
//! them, `externalTrafficPolicy: Local`, `internalTrafficPolicy: Local` and
//! `sessionAffinity: ClientIP` included.

use std::collections::BTreeSet;
use std::net::SocketAddrV4;

use super::{
    Chains, KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_SERVICES, Tables,
    chain_line, probability,
};
use crate::names::{ipt_ext_chain, ipt_sep_chain, ipt_svc_chain, ipt_svl_chain};
use crate::spec::{CLUSTER_CIDR, Service, Traffic};

/// What a Service port's rules are written from.
struct Port {
    /// `ns/name:port`.
    spn: String,
    proto: &'static str,
    endpoints: Vec<SocketAddrV4>,
    /// The endpoints on this node: the Local policy's.
    local: Vec<SocketAddrV4>,
    svc_chain: String,
    svl_chain: String,
    ext_chain: String,
    traffic: Traffic,
}

impl Port {
    fn new(svc: &Service) -> Port {
        let spn = svc.port_name_string();
        let proto = svc.proto.as_str();
        Port {
            svc_chain: ipt_svc_chain(&spn, proto),
            svl_chain: ipt_svl_chain(&spn, proto),
            ext_chain: ipt_ext_chain(&spn, proto),
            endpoints: svc.endpoint_addrs(),
            local: svc.local_endpoint_addrs(),
            traffic: svc.traffic,
            spn,
            proto,
        }
    }

    fn has_endpoints(&self) -> bool {
        !self.endpoints.is_empty()
    }

    /// `hasExternalEndpoints`: with the Local policy, only this node's count.
    fn has_external_endpoints(&self) -> bool {
        match self.traffic.external_local {
            true => !self.local.is_empty(),
            false => self.has_endpoints(),
        }
    }

    /// `internalTrafficChain`: KUBE-SVL with the internal Local policy, else KUBE-SVC.
    fn internal_chain(&self) -> &str {
        match self.traffic.internal_local {
            true => &self.svl_chain,
            false => &self.svc_chain,
        }
    }

    fn sep_chain(&self, endpoint: &SocketAddrV4) -> String {
        ipt_sep_chain(&self.spn, self.proto, &endpoint.to_string())
    }
}

/// The ClusterIP and NodePort rules in KUBE-SERVICES / KUBE-NODEPORTS (nat) or, without
/// endpoints, the REJECTs in the filter table.
pub(super) fn frontend_rules(svc: &Service, tables: &mut Tables) {
    let p = Port::new(svc);
    let (spn, proto, ext_chain) = (&p.spn, p.proto, &p.ext_chain);
    let (cip, port) = (svc.cluster_ip, svc.port);
    if p.has_endpoints() {
        let internal = p.internal_chain();
        tables.nat.rules.push(format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d {cip} --dport {port} -j {internal}"
        ));
    } else {
        tables.filter.rules.push(format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{spn} has no endpoints\" -m {proto} -p {proto} -d {cip} --dport {port} -j REJECT"
        ));
    }
    let Some(np) = svc.node_port else {
        return;
    };
    if p.has_endpoints() {
        tables.nat.rules.push(format!(
            "-A {KUBE_NODEPORTS} -m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {ext_chain}"
        ));
    }
    // No endpoints at all (REJECT), or none on this node for the Local policy (DROP
    // what the EXT chain did not short-circuit).
    let filter = match (p.has_endpoints(), p.has_external_endpoints()) {
        (false, _) => Some(("has no endpoints", "REJECT")),
        (true, false) => Some(("has no local endpoints", "DROP")),
        (true, true) => None,
    };
    if let Some((why, target)) = filter {
        tables.filter.rules.push(format!(
            "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment \"{spn} {why}\" -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {target}"
        ));
    }
}

/// The Service port's own chains, declared in `into`, each also recorded in `active`.
pub(super) fn service_chains(svc: &Service, into: &mut Chains, active: &mut BTreeSet<String>) {
    let p = Port::new(svc);
    if p.has_endpoints() {
        into.rules.push(format!(
            "-A {} -m comment --comment \"{} cluster IP\" -m {proto} -p {proto} -d {} --dport {} ! -s {CLUSTER_CIDR} -j {KUBE_MARK_MASQ}",
            p.internal_chain(),
            p.spn,
            svc.cluster_ip,
            svc.port,
            proto = p.proto,
        ));
    }
    if p.has_endpoints() && svc.node_port.is_some() {
        external_chain(&p, into, active);
    }
    if svc.uses_cluster_chain() {
        waterfall(&p, &p.svc_chain, &p.endpoints, into, active);
    }
    if svc.uses_local_chain() {
        waterfall(&p, &p.svl_chain, &p.local, into, active);
    }
    for ep in &p.endpoints {
        endpoint_chain(&p, ep, into, active);
    }
}

/// KUBE-EXT: masquerade, then on to KUBE-SVC; with the Local policy, pod and node
/// traffic short-circuited to KUBE-SVC, the rest (unmasqueraded) to KUBE-SVL.
fn external_chain(p: &Port, into: &mut Chains, active: &mut BTreeSet<String>) {
    let (spn, ext_chain, svc_chain) = (&p.spn, &p.ext_chain, &p.svc_chain);
    into.chains.push(chain_line(ext_chain));
    active.insert(ext_chain.clone());
    if !p.traffic.external_local {
        into.rules.push(format!(
            "-A {ext_chain} -m comment --comment \"masquerade traffic for {spn} external destinations\" -j {KUBE_MARK_MASQ}"
        ));
        into.rules.push(format!("-A {ext_chain} -j {svc_chain}"));
        return;
    }
    into.rules.extend([
        format!(
            "-A {ext_chain} -m comment --comment \"pod traffic for {spn} external destinations\" -s {CLUSTER_CIDR} -j {svc_chain}"
        ),
        format!(
            "-A {ext_chain} -m comment --comment \"masquerade LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
        ),
        format!(
            "-A {ext_chain} -m comment --comment \"route LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}"
        ),
    ]);
    if !p.local.is_empty() {
        into.rules
            .push(format!("-A {ext_chain} -j {}", p.svl_chain));
    }
}

/// KUBE-SVC or KUBE-SVL: with ClientIP affinity, a `-m recent --rcheck` rule per
/// endpoint first; then the `--probability` waterfall to the KUBE-SEP chains.
fn waterfall(
    p: &Port,
    chain: &str,
    endpoints: &[SocketAddrV4],
    into: &mut Chains,
    active: &mut BTreeSet<String>,
) {
    let spn = &p.spn;
    into.chains.push(chain_line(chain));
    active.insert(chain.to_owned());
    if let Some(seconds) = p.traffic.affinity_timeout_s {
        for ep in endpoints {
            let sep = p.sep_chain(ep);
            into.rules.push(format!(
                "-A {chain} -m comment --comment \"{spn} -> {ep}\" -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
            ));
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let sep = p.sep_chain(ep);
        let statistic = if i < n - 1 {
            format!(
                " -m statistic --mode random --probability {}",
                probability(n - i)
            )
        } else {
            String::new()
        };
        into.rules.push(format!(
            "-A {chain} -m comment --comment \"{spn} -> {ep}\"{statistic} -j {sep}"
        ));
    }
}

/// KUBE-SEP: hairpin masquerade and the DNAT to one endpoint.
fn endpoint_chain(p: &Port, ep: &SocketAddrV4, into: &mut Chains, active: &mut BTreeSet<String>) {
    let (spn, proto) = (&p.spn, p.proto);
    let sep = p.sep_chain(ep);
    into.chains.push(chain_line(&sep));
    active.insert(sep.clone());
    into.rules.push(format!(
        "-A {sep} -m comment --comment {spn} -s {} -j {KUBE_MARK_MASQ}",
        ep.ip()
    ));
    // ClientIP affinity: remember the client for this endpoint.
    let recent = match p.traffic.affinity_timeout_s {
        Some(_) => format!(" -m recent --name {sep} --set"),
        None => String::new(),
    };
    into.rules.push(format!(
        "-A {sep} -m comment --comment {spn}{recent} -m {proto} -p {proto} -j DNAT --to-destination {ep}"
    ));
}

#[cfg(test)]
mod tests {
    use super::super::sync;
    use crate::names::{ipt_ext_chain, ipt_sep_chain, ipt_svc_chain, ipt_svl_chain};
    use crate::spec::{Pod, Traffic, pods, services};

    fn remote() -> Pod {
        Pod {
            name: "checkout-remote".into(),
            ns: "t-peer".into(),
            ip: "10.244.2.2".parse().unwrap(),
            http_port: 8080,
            udp_port: 5353,
        }
    }

    #[test]
    fn local_policy_short_circuits_then_goes_to_the_nodes_endpoints() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.push(remote());
        svcs[0].traffic.external_local = true;
        let out = sync(&svcs, None, &[]);
        let spn = "shop/checkout:http";
        let (svc, svl, ext) = (
            ipt_svc_chain(spn, "tcp"),
            ipt_svl_chain(spn, "tcp"),
            ipt_ext_chain(spn, "tcp"),
        );
        let sep = |ep: &str| ipt_sep_chain(spn, "tcp", ep);
        for want in [
            format!(
                "-A {ext} -m comment --comment \"pod traffic for {spn} external destinations\" -s 10.244.0.0/16 -j {svc}"
            ),
            format!(
                "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"
            ),
            format!(
                "-A {ext} -m comment --comment \"route LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j {svc}"
            ),
            format!("-A {ext} -j {svl}"),
            format!(":{svl} - [0:0]"),
            format!(
                "-A {svl} -m comment --comment \"{spn} -> 10.244.1.12:8080\" -m statistic --mode random --probability 0.3333333333 -j {}",
                sep("10.244.1.12:8080")
            ),
            format!(
                "-A {svl} -m comment --comment \"{spn} -> 10.244.1.14:8080\" -j {}",
                sep("10.244.1.14:8080")
            ),
            // The Cluster chain has the remote endpoint too: one in four.
            format!(
                "-A {svc} -m comment --comment \"{spn} -> 10.244.1.12:8080\" -m statistic --mode random --probability 0.2500000000 -j {}",
                sep("10.244.1.12:8080")
            ),
            format!(
                "-A {svc} -m comment --comment \"{spn} -> 10.244.2.2:8080\" -j {}",
                sep("10.244.2.2:8080")
            ),
            format!(
                "-A {} -m comment --comment {spn} -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080",
                sep("10.244.2.2:8080")
            ),
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want}\n{out}");
        }
        assert!(!out.contains("masquerade traffic for"));
        assert!(!out.contains(&format!(
            "-A {svl} -m comment --comment \"{spn} -> 10.244.2.2"
        )));
    }

    /// kube-proxy (up to 1.35) sends ClusterIP traffic of an `internalTrafficPolicy: Local`
    /// Service to `internalTrafficChain`, its KUBE-SVL chain, which also takes the
    /// ClusterIP's masquerade rule; its NodePort (Cluster policy) keeps KUBE-SVC.
    #[test]
    fn internal_local_policy_sends_cluster_ip_traffic_to_the_nodes_endpoints() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.push(remote());
        svcs[0].traffic.internal_local = true;
        let out = sync(&svcs, None, &[]);
        let spn = "shop/checkout:http";
        let (svc, svl, ext) = (
            ipt_svc_chain(spn, "tcp"),
            ipt_svl_chain(spn, "tcp"),
            ipt_ext_chain(spn, "tcp"),
        );
        let sep = |ep: &str| ipt_sep_chain(spn, "tcp", ep);
        for want in [
            format!(
                "-A KUBE-SERVICES -m comment --comment \"{spn} cluster IP\" -m tcp -p tcp -d 10.96.35.226 --dport 80 -j {svl}"
            ),
            format!(
                "-A {svl} -m comment --comment \"{spn} cluster IP\" -m tcp -p tcp -d 10.96.35.226 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"
            ),
            format!(
                "-A {svl} -m comment --comment \"{spn} -> 10.244.1.14:8080\" -j {}",
                sep("10.244.1.14:8080")
            ),
            format!("-A {ext} -j {svc}"),
            format!(
                "-A {svc} -m comment --comment \"{spn} -> 10.244.2.2:8080\" -j {}",
                sep("10.244.2.2:8080")
            ),
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want}\n{out}");
        }
        assert!(!out.contains(&format!(
            "-A {svc} -m comment --comment \"{spn} cluster IP\""
        )));
        assert!(!out.contains(&format!(
            "-A {svl} -m comment --comment \"{spn} -> 10.244.2.2"
        )));
    }

    #[test]
    fn local_policy_without_local_endpoints_drops_external_traffic() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints = vec![remote()];
        svcs[0].traffic.external_local = true;
        let out = sync(&svcs, None, &[]);
        assert!(out.contains("-A KUBE-EXTERNAL-SERVICES -m comment --comment \"shop/checkout:http has no local endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP\n"));
        assert!(!out.contains("KUBE-SVL-"));
    }

    #[test]
    fn client_ip_affinity_checks_recent_lists_then_sets_them() {
        let mut svcs = services(&pods("t"));
        svcs[0].traffic = Traffic {
            external_local: false,
            affinity_timeout_s: Some(10800),
            ..Traffic::default()
        };
        let out = sync(&svcs, None, &[]);
        let spn = "shop/checkout:http";
        let svc = ipt_svc_chain(spn, "tcp");
        let a = ipt_sep_chain(spn, "tcp", "10.244.1.12:8080");
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("-A {svc} ")))
            .collect();
        assert_eq!(lines.len(), 1 + 3 + 3, "{lines:#?}");
        assert_eq!(
            lines[1],
            format!(
                "-A {svc} -m comment --comment \"{spn} -> 10.244.1.12:8080\" -m recent --name {a} --rcheck --seconds 10800 --reap -j {a}"
            )
        );
        assert!(lines[4].contains("--probability 0.3333333333"));
        assert!(out.contains(&format!("-A {a} -m comment --comment {spn} -m recent --name {a} --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.12:8080\n")));
    }
}
