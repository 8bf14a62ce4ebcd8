//! `nft -j list table ip kube-proxy` as kube-proxy's nftables mode writes it
//! (pkg/proxy/nftables): the `service-ips` map (ip . proto . port : goto chain) and the
//! `service-nodeports` map (proto . port : goto chain) lead to
//! `service-HASH-ns/name/proto/port` chains (or `external-` / `local-` ones) whose
//! `numgen random mod N vmap { i : goto endpoint-... }` picks an endpoint chain that
//! `dnat to ip:port`. Only the parts used here are typed; other objects and fields are
//! ignored.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;
use serde_json::Value;

use super::{RulesError, ServicePort, frontend, parse_proto, service_port_name};
use crate::model::record::{EndpointShare, Frontend, FrontendKind, Proto};

#[derive(Deserialize)]
struct Dump {
    nftables: Vec<Object>,
}

/// One entry of the `nftables` array: an object with one key naming its kind.
#[derive(Deserialize)]
struct Object {
    map: Option<NftMap>,
    set: Option<NftMap>,
    rule: Option<NftRule>,
}

#[derive(Deserialize)]
struct NftMap {
    name: String,
    #[serde(default)]
    elem: Vec<Value>,
}

#[derive(Deserialize)]
struct NftRule {
    chain: String,
    #[serde(default)]
    expr: Vec<Expr>,
}

/// A rule statement; only the kinds kube-proxy's dispatch uses are typed.
#[derive(Deserialize)]
struct Expr {
    vmap: Option<Vmap>,
    dnat: Option<Dnat>,
}

#[derive(Deserialize)]
struct Vmap {
    key: Value,
    data: Value,
}

#[derive(Deserialize)]
struct Dnat {
    addr: Option<Value>,
    port: Option<Value>,
}

#[derive(Deserialize)]
struct Target {
    target: String,
}

#[derive(Deserialize)]
struct Verdict {
    goto: Option<Target>,
    jump: Option<Target>,
}

impl Verdict {
    fn chain(&self) -> Option<&str> {
        self.goto
            .as_ref()
            .or(self.jump.as_ref())
            .map(|t| t.target.as_str())
    }
}

fn path_err(path: String, message: impl Into<String>) -> RulesError {
    RulesError::Nft {
        path,
        message: message.into(),
    }
}

/// What a kube-proxy chain name says: `service-HASH-ns/name/proto/port`.
struct ChainName<'a> {
    prefix: &'a str,
    /// `HASH-ns/name/proto/port`: identifies the Service port across its chains.
    base: &'a str,
    name: String,
    proto: Option<Proto>,
}

fn chain_name(chain: &str) -> Option<ChainName<'_>> {
    let (prefix, base) = ["service-", "local-", "external-"]
        .into_iter()
        .find_map(|prefix| chain.strip_prefix(prefix).map(|rest| (prefix, rest)))?;
    let (_hash, rest) = base.split_once('-')?;
    let mut parts = rest.splitn(4, '/');
    let (namespace, name, proto, port) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some(ChainName {
        prefix,
        base,
        name: service_port_name(namespace, name, port),
        proto: parse_proto(proto),
    })
}

/// Map element keys: `{"concat": [...]}`, a bare value, or either wrapped in
/// `{"elem": {"val": ..., "comment": ...}}`. Returns the parts and the comment.
fn element_key(key: &Value) -> (Vec<&Value>, Option<&str>) {
    let (value, comment) = match key.get("elem") {
        Some(elem) => (
            elem.get("val").unwrap_or(&Value::Null),
            elem.get("comment").and_then(Value::as_str),
        ),
        None => (key, None),
    };
    match value.get("concat").and_then(Value::as_array) {
        Some(parts) => (parts.iter().collect(), comment),
        None => (vec![value], comment),
    }
}

fn as_port(value: &Value) -> Option<u16> {
    match value {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A map's elements as (key parts, comment, verdict chain); `path` names the map.
struct Element<'a> {
    path: String,
    parts: Vec<&'a Value>,
    comment: Option<&'a str>,
    chain: Option<String>,
}

fn elements<'a>(map: &'a NftMap, object_index: usize) -> Result<Vec<Element<'a>>, RulesError> {
    let mut out = Vec::new();
    for (index, elem) in map.elem.iter().enumerate() {
        let path = format!("nftables[{object_index}].map({}).elem[{index}]", map.name);
        let pair = elem
            .as_array()
            .filter(|pair| pair.len() == 2)
            .ok_or_else(|| path_err(path.clone(), "expected a [key, verdict] pair"))?;
        let verdict: Verdict = serde_json::from_value(pair[1].clone())
            .map_err(|e| path_err(format!("{path}[1]"), e.to_string()))?;
        let (parts, comment) = element_key(&pair[0]);
        out.push(Element {
            path,
            parts,
            comment,
            chain: verdict.chain().map(str::to_owned),
        });
    }
    Ok(out)
}

/// (ip, proto, port) of a `service-ips`-style key.
fn ip_proto_port(element: &Element<'_>) -> Result<(IpAddr, Option<Proto>, u16), RulesError> {
    let [ip, proto, port] = element.parts[..] else {
        return Err(path_err(
            element.path.clone(),
            "expected key ip . proto . port",
        ));
    };
    let ip = ip
        .as_str()
        .and_then(|s| s.parse::<IpAddr>().ok())
        .ok_or_else(|| path_err(element.path.clone(), format!("{ip}: not an IP address")))?;
    let port = as_port(port)
        .ok_or_else(|| path_err(element.path.clone(), format!("{port}: not a port")))?;
    Ok((ip, proto.as_str().and_then(parse_proto), port))
}

/// (proto, port) of a `service-nodeports`-style key.
fn proto_port(element: &Element<'_>) -> Result<(Option<Proto>, u16), RulesError> {
    let [proto, port] = element.parts[..] else {
        return Err(path_err(element.path.clone(), "expected key proto . port"));
    };
    let port = as_port(port)
        .ok_or_else(|| path_err(element.path.clone(), format!("{port}: not a port")))?;
    Ok((proto.as_str().and_then(parse_proto), port))
}

#[derive(Default)]
struct Builder {
    name: String,
    proto: Option<Proto>,
    frontends: BTreeSet<Frontend>,
}

pub(super) fn parse(text: &str) -> Result<Vec<ServicePort>, RulesError> {
    let dump: Dump = serde_json::from_str(text).map_err(|e| RulesError::NftSyntax {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;

    let mut maps: BTreeMap<&str, (usize, &NftMap)> = BTreeMap::new();
    let mut cluster_ips: HashSet<IpAddr> = HashSet::new();
    let mut chains: BTreeMap<&str, Vec<(usize, &NftRule)>> = BTreeMap::new();
    for (index, object) in dump.nftables.iter().enumerate() {
        if let Some(map) = &object.map {
            maps.insert(map.name.as_str(), (index, map));
        }
        if let Some(set) = object.set.as_ref().filter(|s| s.name == "cluster-ips") {
            cluster_ips.extend(
                set.elem
                    .iter()
                    .filter_map(|v| v.as_str().and_then(|s| s.parse::<IpAddr>().ok())),
            );
        }
        if let Some(rule) = &object.rule {
            chains
                .entry(rule.chain.as_str())
                .or_default()
                .push((index, rule));
        }
    }

    // LoadBalancer IPs with source ranges are the only ones nft tells apart from
    // external IPs: both go through the `external-` chain.
    let mut firewalled: HashSet<(IpAddr, u16)> = HashSet::new();
    if let Some((index, map)) = maps.get("firewall-ips") {
        for element in elements(map, *index)? {
            let (ip, _, port) = ip_proto_port(&element)?;
            firewalled.insert((ip, port));
        }
    }

    let mut builders: BTreeMap<String, Builder> = BTreeMap::new();
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
    // Service ports whose chains exist without a map element still have endpoints.
    for chain in chains.keys() {
        if let Some(parsed) = chain_name(chain)
            && (parsed.prefix == "service-" || parsed.prefix == "local-")
        {
            let builder = builders.entry(parsed.base.to_owned()).or_default();
            builder.name = parsed.name;
            builder.proto = builder.proto.or(parsed.proto);
        }
    }

    let mut ports = Vec::new();
    for (base, builder) in builders {
        let Some(proto) = builder.proto else {
            continue;
        };
        let cluster = dispatch(&chains, &format!("service-{base}"))?;
        let local = dispatch(&chains, &format!("local-{base}"))?;
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

    add_no_endpoint_services(&maps, &cluster_ips, &mut ports)?;
    Ok(ports)
}

/// The endpoints a `service-` / `local-` chain's `numgen random mod N vmap` picks from:
/// each vmap key is one of N equally likely numbers.
fn dispatch(
    chains: &BTreeMap<&str, Vec<(usize, &NftRule)>>,
    chain: &str,
) -> Result<Option<Vec<EndpointShare>>, RulesError> {
    let Some(rules) = chains.get(chain) else {
        return Ok(None);
    };
    let mut endpoints: Vec<EndpointShare> = Vec::new();
    for (index, rule) in rules {
        for (expr_index, expr) in rule.expr.iter().enumerate() {
            let Some(vmap) = &expr.vmap else {
                continue;
            };
            let Some(modulus) = vmap
                .key
                .get("numgen")
                .and_then(|n| n.get("mod"))
                .and_then(Value::as_u64)
            else {
                continue;
            };
            let path = format!("nftables[{index}].rule({chain}).expr[{expr_index}].vmap");
            let entries = vmap
                .data
                .get("set")
                .and_then(Value::as_array)
                .ok_or_else(|| path_err(path.clone(), "numgen vmap without an inline set"))?;
            if modulus == 0 {
                return Err(path_err(path, "numgen mod 0"));
            }
            for (entry_index, entry) in entries.iter().enumerate() {
                let entry_path = format!("{path}.data.set[{entry_index}]");
                let pair = entry
                    .as_array()
                    .filter(|pair| pair.len() == 2)
                    .ok_or_else(|| {
                        path_err(entry_path.clone(), "expected a [number, verdict] pair")
                    })?;
                let verdict: Verdict = serde_json::from_value(pair[1].clone())
                    .map_err(|e| path_err(entry_path.clone(), e.to_string()))?;
                let Some(target) = verdict.chain() else {
                    continue;
                };
                let Some(addr) = endpoint_dnat(chains, target)? else {
                    continue;
                };
                // A key is one number or a {"range": [a, b]} of them.
                let numbers = match pair[0].get("range").and_then(Value::as_array) {
                    Some(range) => match (
                        range.first().and_then(Value::as_u64),
                        range.get(1).and_then(Value::as_u64),
                    ) {
                        (Some(low), Some(high)) if high >= low => high - low + 1,
                        _ => return Err(path_err(entry_path, "bad numgen range")),
                    },
                    None => 1,
                };
                let share = numbers as f64 / modulus as f64;
                match endpoints.iter_mut().find(|e| e.addr == addr) {
                    Some(existing) => existing.expected_share += share,
                    None => endpoints.push(EndpointShare {
                        addr,
                        expected_share: share,
                    }),
                }
            }
        }
    }
    Ok(Some(endpoints))
}

/// The `dnat to ip:port` of an endpoint chain.
fn endpoint_dnat(
    chains: &BTreeMap<&str, Vec<(usize, &NftRule)>>,
    chain: &str,
) -> Result<Option<SocketAddr>, RulesError> {
    let Some(rules) = chains.get(chain) else {
        return Ok(None);
    };
    for (index, rule) in rules {
        for (expr_index, expr) in rule.expr.iter().enumerate() {
            let Some(dnat) = &expr.dnat else {
                continue;
            };
            let path = format!("nftables[{index}].rule({chain}).expr[{expr_index}].dnat");
            let ip = dnat
                .addr
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<IpAddr>().ok())
                .ok_or_else(|| path_err(path.clone(), "addr is not an IP address"))?;
            let port = dnat
                .port
                .as_ref()
                .and_then(as_port)
                .ok_or_else(|| path_err(path, "port is not a port number"))?;
            return Ok(Some(SocketAddr::new(ip, port)));
        }
    }
    Ok(None)
}

/// `no-endpoint-services` / `no-endpoint-nodeports` elements carry the Service port's
/// name as a comment; a Service port with no endpoints appears nowhere else. (The
/// `drop` elements of a port with no *local* endpoints name ports that exist already.)
fn add_no_endpoint_services(
    maps: &BTreeMap<&str, (usize, &NftMap)>,
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
