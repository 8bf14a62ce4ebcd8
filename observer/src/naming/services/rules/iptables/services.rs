//! Service ports from the parsed tables: frontends from KUBE-SERVICES / KUBE-NODEPORTS,
//! endpoints from the per-Service chains, and the filter table's "has no endpoints"
//! rejects.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::waterfall::waterfall;
use super::{Rule, Table, err};
use crate::model::record::{Frontend, FrontendKind, Proto};
use crate::naming::services::rules::{RulesError, ServicePort, frontend, parse_proto};

/// What the frontend rules say about one Service port, keyed by its chains' hash.
#[derive(Default)]
struct Builder {
    name: Option<String>,
    proto: Option<Proto>,
    frontends: BTreeSet<Frontend>,
}

type Builders<'a> = BTreeMap<&'a str, Builder>;

/// The exact address of a frontend match (`-d ip/32`), not a range like 127.0.0.0/8.
fn exact_dst(rule: &Rule) -> Option<IpAddr> {
    let (ip, prefix) = rule.dst?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    (prefix == full).then_some(ip)
}

fn parse_port(rule: &Rule) -> Result<Option<u16>, RulesError> {
    rule.dport
        .as_deref()
        .map(|text| {
            text.parse::<u16>()
                .map_err(|_| err(rule.line, format!("--dport {text}: not a port number")))
        })
        .transpose()
}

/// Splits the hash off `KUBE-SVC-H` and friends.
fn service_chain(name: &str) -> Option<(&'static str, &str)> {
    [
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-EXT-",
        "KUBE-FW-",
        "KUBE-XLB-",
    ]
    .into_iter()
    .find_map(|prefix| name.strip_prefix(prefix).map(|hash| (prefix, hash)))
}

/// Whether a rule of `chain` in `table` is one the functions here read: every rule of
/// the frontend chains, a Service chain's jumps to endpoint chains, an endpoint chain's
/// DNAT. Parsed tables keep only these (and every chain's name), which more than halves
/// what 5,000 Services' tables take in memory.
pub(super) fn is_read(table: &str, chain: &str, rule: &Rule) -> bool {
    const FRONTENDS: [&str; 3] = ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS"];
    match table {
        "nat" if chain == "KUBE-SERVICES" || chain == "KUBE-NODEPORTS" => true,
        "nat" if chain.starts_with("KUBE-SVC-") || chain.starts_with("KUBE-SVL-") => {
            !rule.rcheck
                && rule
                    .jump
                    .as_deref()
                    .is_some_and(|jump| jump.starts_with("KUBE-SEP-"))
        }
        "nat" if chain.starts_with("KUBE-SEP-") => {
            rule.jump.as_deref() == Some("DNAT") && rule.to_destination.is_some()
        }
        "filter" => FRONTENDS.contains(&chain),
        _ => false,
    }
}

fn chain<'a>(table: &'a Table, name: &str) -> &'a [Rule] {
    table.chains.get(name).map_or(&[], Vec::as_slice)
}

pub(super) fn from_nat(nat: &Table) -> Result<Vec<ServicePort>, RulesError> {
    let mut builders = Builders::new();
    address_frontends(nat, &mut builders)?;
    node_port_frontends(nat, &mut builders)?;
    // Chains that exist without a frontend rule still define a Service port (e.g. only
    // reachable through a chain we do not model): their comments name it.
    for chain in nat.chains.keys() {
        if let Some((prefix, hash)) = service_chain(chain)
            && (prefix == "KUBE-SVC-" || prefix == "KUBE-SVL-")
        {
            builders.entry(hash).or_default();
        }
    }
    let mut ports = Vec::new();
    for (hash, builder) in builders {
        ports.extend(service_port(nat, hash, builder)?);
    }
    Ok(ports)
}

/// KUBE-SERVICES' ClusterIP, external IP and load-balancer IP jumps.
fn address_frontends<'a>(nat: &'a Table, builders: &mut Builders<'a>) -> Result<(), RulesError> {
    for rule in chain(nat, "KUBE-SERVICES") {
        let (Some(comment), Some(target)) = (&rule.comment, &rule.jump) else {
            continue;
        };
        let Some((_, hash)) = service_chain(target) else {
            continue;
        };
        let kind_and_name = [
            (" cluster IP", FrontendKind::ClusterIp),
            (" external IP", FrontendKind::ExternalIp),
            (" loadbalancer IP", FrontendKind::LoadBalancer),
        ]
        .into_iter()
        .find_map(|(suffix, kind)| comment.strip_suffix(suffix).map(|name| (kind, name)));
        let (Some((kind, name)), Some(ip), Some(port)) =
            (kind_and_name, exact_dst(rule), parse_port(rule)?)
        else {
            continue;
        };
        let builder = builders.entry(hash).or_default();
        builder.name.get_or_insert_with(|| name.to_owned());
        if let Some(proto) = rule.proto.as_deref().and_then(parse_proto) {
            builder.proto.get_or_insert(proto);
        }
        builder.frontends.insert(frontend(kind, Some(ip), port));
    }
    Ok(())
}

/// KUBE-NODEPORTS' jumps: the comment is the Service port's name.
fn node_port_frontends<'a>(nat: &'a Table, builders: &mut Builders<'a>) -> Result<(), RulesError> {
    for rule in chain(nat, "KUBE-NODEPORTS") {
        let (Some(comment), Some(target)) = (&rule.comment, &rule.jump) else {
            continue;
        };
        let (Some((_, hash)), Some(port)) = (service_chain(target), parse_port(rule)?) else {
            continue;
        };
        let builder = builders.entry(hash).or_default();
        builder.name.get_or_insert_with(|| comment.clone());
        if let Some(proto) = rule.proto.as_deref().and_then(parse_proto) {
            builder.proto.get_or_insert(proto);
        }
        builder
            .frontends
            .insert(frontend(FrontendKind::NodePort, None, port));
    }
    Ok(())
}

/// One Service port from its frontends and its KUBE-SVC / KUBE-SVL chains; `None` when
/// nothing can be named by it.
fn service_port(
    nat: &Table,
    hash: &str,
    builder: Builder,
) -> Result<Option<ServicePort>, RulesError> {
    let cluster = waterfall(nat, &format!("KUBE-SVC-{hash}"))?;
    let local = waterfall(nat, &format!("KUBE-SVL-{hash}"))?;
    let name = builder
        .name
        .or_else(|| cluster.as_ref().and_then(|w| w.name.clone()))
        .or_else(|| local.as_ref().and_then(|w| w.name.clone()));
    let proto = builder
        .proto
        .or_else(|| cluster.as_ref().and_then(|w| w.proto))
        .or_else(|| local.as_ref().and_then(|w| w.proto));
    // Without a name or a TCP/UDP protocol (SCTP) nothing can be named by it.
    let (Some(name), Some(proto)) = (name, proto) else {
        return Ok(None);
    };
    let (endpoints, local_endpoints) = match (cluster, local) {
        (Some(cluster), local) => (cluster.endpoints, local.map(|l| l.endpoints)),
        (None, Some(local)) => (local.endpoints, None),
        (None, None) => (Vec::new(), None),
    };
    Ok(Some(ServicePort {
        name,
        proto,
        frontends: builder.frontends.into_iter().collect(),
        endpoints,
        local_endpoints,
    }))
}

/// The filter table's "has no endpoints" rejects: the only trace of a Service port with
/// no endpoints (the nat table has nothing for it).
pub(super) fn add_no_endpoint_services(
    filter: &Table,
    ports: &mut Vec<ServicePort>,
) -> Result<(), RulesError> {
    for chain_name in ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS"] {
        for rule in chain(filter, chain_name) {
            let Some(name) = rule
                .comment
                .as_deref()
                .and_then(|c| c.strip_suffix(" has no endpoints"))
            else {
                continue;
            };
            let (Some(proto), Some(port)) = (
                rule.proto.as_deref().and_then(parse_proto),
                parse_port(rule)?,
            ) else {
                continue;
            };
            let frontend = match (exact_dst(rule), chain_name) {
                (Some(ip), "KUBE-SERVICES") => frontend(FrontendKind::ClusterIp, Some(ip), port),
                (Some(ip), _) => frontend(FrontendKind::ExternalIp, Some(ip), port),
                (None, _) if rule.dst_local || chain_name == "KUBE-NODEPORTS" => {
                    frontend(FrontendKind::NodePort, None, port)
                }
                (None, _) => continue,
            };
            add_frontend(ports, name, proto, frontend);
        }
    }
    Ok(())
}

/// Adds `frontend` to the Service port `name`, creating it (without endpoints) if new.
fn add_frontend(ports: &mut Vec<ServicePort>, name: &str, proto: Proto, frontend: Frontend) {
    match ports
        .iter_mut()
        .find(|p| p.name == name && p.proto == proto)
    {
        Some(existing) => {
            if !existing.frontends.contains(&frontend) {
                existing.frontends.push(frontend);
                existing.frontends.sort();
            }
        }
        None => ports.push(ServicePort {
            name: name.to_owned(),
            proto,
            frontends: vec![frontend],
            endpoints: Vec::new(),
            local_endpoints: None,
        }),
    }
}
