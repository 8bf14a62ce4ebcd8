//! `nft -j list table ip kube-proxy` as kube-proxy's nftables mode writes it
//! (pkg/proxy/nftables): the `service-ips` map (ip . proto . port : goto chain) and the
//! `service-nodeports` map (proto . port : goto chain) lead to
//! `service-HASH-ns/name/proto/port` chains (or `external-` / `local-` ones) whose
//! `numgen random mod N vmap { i : goto endpoint-... }` picks an endpoint chain that
//! `dnat to ip:port`. Only the parts used here are typed; other objects and fields are
//! ignored.

mod dispatch;
mod json;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use dispatch::{Chains, dispatch};
use json::{Dump, NftMap, chain_name, elements, ip_proto_port, proto_port};

use super::{RulesError, ServicePort, frontend};
use crate::model::record::{Frontend, FrontendKind, Proto};

/// Maps by name, each with its index in the `nftables` array (for error paths).
type Maps<'a> = BTreeMap<&'a str, (usize, &'a NftMap)>;

/// The dump's objects kube-proxy's dispatch uses, by name.
#[derive(Default)]
struct Index<'a> {
    maps: Maps<'a>,
    cluster_ips: HashSet<IpAddr>,
    chains: Chains<'a>,
}

fn index(dump: &Dump) -> Index<'_> {
    let mut index = Index::default();
    for (position, object) in dump.nftables.iter().enumerate() {
        if let Some(map) = &object.map {
            index.maps.insert(map.name.as_str(), (position, map));
        }
        if let Some(set) = object.set.as_ref().filter(|s| s.name == "cluster-ips") {
            index.cluster_ips.extend(
                set.elem
                    .iter()
                    .filter_map(|v| v.as_str().and_then(|s| s.parse::<IpAddr>().ok())),
            );
        }
        if let Some(rule) = &object.rule {
            index
                .chains
                .entry(rule.chain.as_str())
                .or_default()
                .push((position, rule));
        }
    }
    index
}

/// What the maps say about one Service port, keyed by its chains' base name.
#[derive(Default)]
struct Builder {
    name: String,
    proto: Option<Proto>,
    frontends: BTreeSet<Frontend>,
}

type Builders = BTreeMap<String, Builder>;

pub(super) fn parse(text: &str) -> Result<Vec<ServicePort>, RulesError> {
    let dump: Dump = serde_json::from_str(text).map_err(|e| RulesError::NftSyntax {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let index = index(&dump);
    let mut builders = map_frontends(&index.maps)?;
    // Service ports whose chains exist without a map element still have endpoints.
    for chain in index.chains.keys() {
        if let Some(parsed) = chain_name(chain)
            && (parsed.prefix == "service-" || parsed.prefix == "local-")
        {
            let builder = builders.entry(parsed.base.to_owned()).or_default();
            builder.name = parsed.name;
            builder.proto = builder.proto.or(parsed.proto);
        }
    }
    let mut ports = service_ports(builders, &index.chains)?;
    add_no_endpoint_services(&index.maps, &index.cluster_ips, &mut ports)?;
    Ok(ports)
}

/// Frontends from the `service-ips` and `service-nodeports` maps, by the chain they go to.
fn map_frontends(maps: &Maps<'_>) -> Result<Builders, RulesError> {
    let firewalled = firewalled(maps)?;
    let mut builders = Builders::new();
    let mut add = |chain: &str, frontend: Frontend, proto: Option<Proto>| {
        let Some(parsed) = chain_name(chain) else {
            return;
        };
        let builder = builders.entry(parsed.base.to_owned()).or_default();
        builder.name = parsed.name;
        builder.proto = builder.proto.or(parsed.proto).or(proto);
        builder.frontends.insert(frontend);
    };
    if let Some((index, map)) = maps.get("service-ips") {
        for element in elements(map, *index)? {
            let (ip, proto, port) = ip_proto_port(&element)?;
            let Some(chain) = element.chain.as_deref() else {
                continue;
            };
            let kind = if chain.starts_with("external-") {
                if firewalled.contains(&(ip, port)) {
                    FrontendKind::LoadBalancer
                } else {
                    FrontendKind::ExternalIp
                }
            } else {
                FrontendKind::ClusterIp
            };
            add(chain, frontend(kind, Some(ip), port), proto);
        }
    }
    if let Some((index, map)) = maps.get("service-nodeports") {
        for element in elements(map, *index)? {
            let (proto, port) = proto_port(&element)?;
            if let Some(chain) = element.chain.as_deref() {
                add(chain, frontend(FrontendKind::NodePort, None, port), proto);
            }
        }
    }
    Ok(builders)
}

/// LoadBalancer IPs with source ranges are the only ones nft tells apart from external
/// IPs: both go through the `external-` chain.
fn firewalled(maps: &Maps<'_>) -> Result<HashSet<(IpAddr, u16)>, RulesError> {
    let mut firewalled = HashSet::new();
    if let Some((index, map)) = maps.get("firewall-ips") {
        for element in elements(map, *index)? {
            let (ip, _, port) = ip_proto_port(&element)?;
            firewalled.insert((ip, port));
        }
    }
    Ok(firewalled)
}

/// Each Service port with a protocol, with the endpoints its chains dispatch to.
fn service_ports(builders: Builders, chains: &Chains<'_>) -> Result<Vec<ServicePort>, RulesError> {
    let mut ports = Vec::new();
    for (base, builder) in builders {
        let Some(proto) = builder.proto else {
            continue;
        };
        let cluster = dispatch(chains, &format!("service-{base}"))?;
        let local = dispatch(chains, &format!("local-{base}"))?;
        let (endpoints, local_endpoints) = match (cluster, local) {
            (Some(cluster), local) => (cluster, local),
            (None, Some(local)) => (local, None),
            (None, None) => (Vec::new(), None),
        };
        ports.push(ServicePort {
            name: builder.name,
            proto,
            frontends: builder.frontends.into_iter().collect(),
            endpoints,
            local_endpoints,
        });
    }
    Ok(ports)
}

/// `no-endpoint-services` / `no-endpoint-nodeports` elements carry the Service port's
/// name as a comment; a Service port with no endpoints appears nowhere else. (The
/// `drop` elements of a port with no *local* endpoints name ports that exist already.)
fn add_no_endpoint_services(
    maps: &Maps<'_>,
    cluster_ips: &HashSet<IpAddr>,
    ports: &mut Vec<ServicePort>,
) -> Result<(), RulesError> {
    let known: HashSet<(Proto, String)> = ports.iter().map(|p| (p.proto, p.name.clone())).collect();
    let mut extra: BTreeMap<(Proto, String), BTreeSet<Frontend>> = BTreeMap::new();
    if let Some((index, map)) = maps.get("no-endpoint-services") {
        for element in elements(map, *index)? {
            let (ip, proto, port) = ip_proto_port(&element)?;
            let (Some(name), Some(proto)) = (element.comment, proto) else {
                continue;
            };
            let kind = if cluster_ips.contains(&ip) {
                FrontendKind::ClusterIp
            } else {
                FrontendKind::ExternalIp
            };
            extra
                .entry((proto, name.to_owned()))
                .or_default()
                .insert(frontend(kind, Some(ip), port));
        }
    }
    if let Some((index, map)) = maps.get("no-endpoint-nodeports") {
        for element in elements(map, *index)? {
            let (proto, port) = proto_port(&element)?;
            let (Some(name), Some(proto)) = (element.comment, proto) else {
                continue;
            };
            extra
                .entry((proto, name.to_owned()))
                .or_default()
                .insert(frontend(FrontendKind::NodePort, None, port));
        }
    }
    for ((proto, name), frontends) in extra {
        if known.contains(&(proto, name.clone())) {
            continue;
        }
        ports.push(ServicePort {
            name,
            proto,
            frontends: frontends.into_iter().collect(),
            endpoints: Vec::new(),
            local_endpoints: None,
        });
    }
    Ok(())
}
