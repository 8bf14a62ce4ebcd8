//! One Service port's rules: its frontend jumps (or "has no endpoints" rejects) and its
//! own KUBE-SVC / KUBE-EXT / KUBE-SEP chains.

use std::collections::BTreeSet;
use std::net::SocketAddrV4;

use super::{
    Chains, KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_SERVICES, Tables,
    chain_line, probability,
};
use crate::names::{ipt_ext_chain, ipt_sep_chain, ipt_svc_chain};
use crate::spec::{CLUSTER_CIDR, Service};

/// What a Service port's rules are written from.
struct Port {
    /// `ns/name:port`.
    spn: String,
    proto: &'static str,
    endpoints: Vec<SocketAddrV4>,
    svc_chain: String,
    ext_chain: String,
}

impl Port {
    fn new(svc: &Service) -> Port {
        let spn = svc.port_name_string();
        let proto = svc.proto.as_str();
        Port {
            svc_chain: ipt_svc_chain(&spn, proto),
            ext_chain: ipt_ext_chain(&spn, proto),
            endpoints: svc.endpoint_addrs(),
            spn,
            proto,
        }
    }

    fn has_endpoints(&self) -> bool {
        !self.endpoints.is_empty()
    }

    fn sep_chain(&self, endpoint: &SocketAddrV4) -> String {
        ipt_sep_chain(&self.spn, self.proto, &endpoint.to_string())
    }
}

/// The ClusterIP and NodePort rules in KUBE-SERVICES / KUBE-NODEPORTS (nat) or, without
/// endpoints, the REJECTs in the filter table.
pub(super) fn frontend_rules(svc: &Service, tables: &mut Tables) {
    let p = Port::new(svc);
    let (spn, proto, svc_chain, ext_chain) = (&p.spn, p.proto, &p.svc_chain, &p.ext_chain);
    let (cip, port) = (svc.cluster_ip, svc.port);
    if p.has_endpoints() {
        tables.nat.rules.push(format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d {cip} --dport {port} -j {svc_chain}"
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
    } else {
        tables.filter.rules.push(format!(
            "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment \"{spn} has no endpoints\" -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j REJECT"
        ));
    }
}

/// The Service port's own chains, declared in `into`, each also recorded in `active`.
pub(super) fn service_chains(svc: &Service, into: &mut Chains, active: &mut BTreeSet<String>) {
    let p = Port::new(svc);
    if p.has_endpoints() {
        into.rules.push(format!(
            "-A {} -m comment --comment \"{} cluster IP\" -m {proto} -p {proto} -d {} --dport {} ! -s {CLUSTER_CIDR} -j {KUBE_MARK_MASQ}",
            p.svc_chain,
            p.spn,
            svc.cluster_ip,
            svc.port,
            proto = p.proto,
        ));
    }
    if p.has_endpoints() && svc.node_port.is_some() {
        external_chain(&p, into, active);
    }
    if p.has_endpoints() {
        waterfall(&p, into, active);
    }
    for ep in &p.endpoints {
        endpoint_chain(&p, ep, into, active);
    }
}

/// KUBE-EXT: masquerade, then on to KUBE-SVC.
fn external_chain(p: &Port, into: &mut Chains, active: &mut BTreeSet<String>) {
    let (spn, ext_chain) = (&p.spn, &p.ext_chain);
    into.chains.push(chain_line(ext_chain));
    active.insert(ext_chain.clone());
    into.rules.push(format!(
        "-A {ext_chain} -m comment --comment \"masquerade traffic for {spn} external destinations\" -j {KUBE_MARK_MASQ}"
    ));
    into.rules
        .push(format!("-A {ext_chain} -j {}", p.svc_chain));
}

/// KUBE-SVC: the `--probability` waterfall to the KUBE-SEP chains.
fn waterfall(p: &Port, into: &mut Chains, active: &mut BTreeSet<String>) {
    let (spn, svc_chain) = (&p.spn, &p.svc_chain);
    into.chains.push(chain_line(svc_chain));
    active.insert(svc_chain.clone());
    let n = p.endpoints.len();
    for (i, ep) in p.endpoints.iter().enumerate() {
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
            "-A {svc_chain} -m comment --comment \"{spn} -> {ep}\"{statistic} -j {sep}"
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
    into.rules.push(format!(
        "-A {sep} -m comment --comment {spn} -m {proto} -p {proto} -j DNAT --to-destination {ep}"
    ));
}
