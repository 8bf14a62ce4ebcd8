//! `nft -j list table ip kube-proxy` as kube-proxy's nftables mode writes it
//! (pkg/proxy/nftables): the `service-ips` map (ip . proto . port : goto chain) and the
//! `service-nodeports` map (proto . port : goto chain) lead to
//! `service-HASH-ns/name/proto/port` chains (or `external-` / `local-` ones) whose
//! `numgen random mod N vmap { i : goto endpoint-... }` picks an endpoint chain that
//! `dnat to ip:port`. Only the parts used here are typed; other objects and fields are
//! ignored.

mod dispatch;
mod json;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use dispatch::{Chains, dispatch};
use json::{
    Dnat, Dump, Expr, NftMap, NftRule, Object, Vmap, chain_name, elements, ip_proto_port,
    proto_port,
};
use serde_json::{Value, json};

use crate::naming::services::RulesPatchError;
use crate::naming::services::nft_changes::{NftEvent, NftExpr, NftVerdict};

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

fn index(objects: &[(usize, Object)]) -> Index<'_> {
    let mut index = Index::default();
    for (position, object) in objects {
        let position = *position;
        if let Some(map) = object.map.as_deref() {
            index.maps.insert(map.name.as_str(), (position, map));
        }
        if let Some(set) = object.set.as_ref().filter(|s| s.name == "cluster-ips") {
            index.cluster_ips.extend(
                set.values(position)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|v| v.as_str().and_then(|s| s.parse::<IpAddr>().ok())),
            );
        }
        if let Some(rule) = object.rule.as_deref() {
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
    Table::parse(text)?.ports()
}

/// The maps, sets and rules of one `nft -j list table`, parsed, so that announced rule
/// changes can be applied and named maps or sets replaced one by one as they change
/// (`nft -j list map`) without reading or parsing the rest again. (Error paths name
/// positions in this patched list.)
#[derive(Default)]
pub struct Table {
    /// What the parser uses, each with its position in the dump (objects added since
    /// get positions after the dump's last).
    objects: Vec<(usize, Object)>,
    next_position: usize,
    /// Anonymous maps' elements announced since the read, for the rules that use them.
    anonymous: HashMap<String, Vec<(u32, Option<NftVerdict>)>>,
}

/// The objects of a dump the parser uses, with their positions in it, and how many
/// objects the dump had. Kept: maps, sets, rules that dispatch (`vmap`) or DNAT (with
/// just those statements), and every rule of a `service-` or `local-` chain (a Service
/// port's chain exists even without endpoints).
fn read_dump(text: &str) -> Result<(Vec<(usize, Object)>, usize), RulesError> {
    let dump: Dump = serde_json::from_str(text).map_err(|e| RulesError::NftSyntax {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let count = dump.nftables.len();
    let mut kept = Vec::new();
    for (position, mut object) in dump.nftables.into_iter().enumerate() {
        if let Some(rule) = object.rule.as_deref_mut() {
            rule.expr.retain(|e| e.vmap.is_some() || e.dnat.is_some());
            rule.expr.shrink_to_fit();
            if rule.expr.is_empty() && !names_port(&rule.chain) {
                continue;
            }
        }
        if object.map.is_some() || object.set.is_some() || object.rule.is_some() {
            kept.push((position, object));
        }
    }
    kept.shrink_to_fit();
    Ok((kept, count))
}

/// Whether `chain` is a Service port's `service-` or `local-` chain.
fn names_port(chain: &str) -> bool {
    chain_name(chain).is_some_and(|parsed| parsed.prefix == "service-" || parsed.prefix == "local-")
}

impl Table {
    pub fn parse(text: &str) -> Result<Table, RulesError> {
        let (objects, next_position) = read_dump(text)?;
        Ok(Table {
            objects,
            next_position,
            anonymous: HashMap::new(),
        })
    }

    fn push(&mut self, object: Object) {
        self.objects.push((self.next_position, object));
        self.next_position += 1;
    }

    /// Applies one announcement about a chain's rules or an anonymous map; a named set
    /// or map is [`Table::replace_set`]'s. `Err` says why the table must be read whole.
    pub fn apply(&mut self, event: &NftEvent) -> Result<(), RulesPatchError> {
        match event {
            NftEvent::Rule {
                chain,
                handle,
                exprs,
            } => {
                let expr = exprs
                    .iter()
                    .map(|expr| self.expr(expr))
                    .collect::<Result<Vec<Expr>, RulesPatchError>>()?;
                self.remove_rules(|rule| rule.chain == *chain && rule.handle == Some(*handle));
                if expr.is_empty() && !names_port(chain) {
                    // Kept no more than a read would keep it.
                    return Ok(());
                }
                self.push(Object {
                    map: None,
                    set: None,
                    rule: Some(Box::new(NftRule {
                        chain: chain.clone(),
                        handle: Some(*handle),
                        expr,
                    })),
                });
            }
            NftEvent::RuleGone { chain, handle } => {
                self.remove_rules(|rule| rule.chain == *chain && rule.handle == Some(*handle));
            }
            NftEvent::ChainGone { chain } => self.remove_rules(|rule| rule.chain == *chain),
            NftEvent::AnonElements { set, elements } => {
                self.anonymous
                    .entry(set.clone())
                    .or_default()
                    .extend(elements.iter().cloned());
            }
            NftEvent::AnonGone { set } => {
                self.anonymous.remove(set);
            }
            NftEvent::Set { name } => {
                return Err(RulesPatchError::SetAnnounced { name: name.clone() });
            }
        }
        Ok(())
    }

    fn remove_rules(&mut self, matches: impl Fn(&NftRule) -> bool) {
        self.objects
            .retain(|(_, o)| o.rule.as_deref().is_none_or(|rule| !matches(rule)));
    }

    /// A decoded expression as nft's JSON has it.
    fn expr(&self, expr: &NftExpr) -> Result<Expr, RulesPatchError> {
        Ok(match expr {
            NftExpr::NumgenVmap {
                modulus,
                offset,
                set,
            } => {
                let mut elements = self
                    .anonymous
                    .get(set)
                    .ok_or_else(|| RulesPatchError::ElementsNotAnnounced { set: set.clone() })?
                    .clone();
                // nft lists a map's elements by key.
                elements.sort_by_key(|(key, _)| *key);
                let entries: Vec<Value> = elements
                    .into_iter()
                    .map(|(key, verdict)| {
                        let verdict = match verdict {
                            Some(v) if v.goto => json!({"goto": {"target": v.chain}}),
                            Some(v) => json!({"jump": {"target": v.chain}}),
                            None => json!({}),
                        };
                        json!([key, verdict])
                    })
                    .collect();
                let raw = |value: Value| {
                    serde_json::value::to_raw_value(&value)
                        .map_err(|e| RulesPatchError::Json(e.to_string()))
                };
                Expr {
                    vmap: Some(Vmap {
                        key: raw(
                            json!({"numgen": {"mode": "random", "mod": modulus, "offset": offset}}),
                        )?,
                        data: raw(json!({ "set": entries }))?,
                    }),
                    dnat: None,
                }
            }
            NftExpr::Dnat { addr, port } => Expr {
                vmap: None,
                dnat: Some(Dnat {
                    addr: Some(json!(addr.to_string())),
                    port: Some(json!(port)),
                }),
            },
        })
    }

    /// Replaces the named map or set `name` with that of `listing` (`nft -j list map`
    /// or `list set`); `None`: it is gone.
    pub fn replace_set(&mut self, name: &str, listing: Option<&str>) -> Result<(), RulesError> {
        let fresh = match listing {
            Some(listing) => read_dump(listing)?.0,
            None => Vec::new(),
        };
        let named =
            |o: &Object| o.map.iter().chain(&o.set).any(|set| set.name == name) && o.rule.is_none();
        self.objects.retain(|(_, o)| !named(o));
        for (_, object) in fresh {
            if named(&object) {
                self.push(object);
            }
        }
        Ok(())
    }

    /// Whether the table has a set (not a map) named `name`.
    pub fn is_set(&self, name: &str) -> bool {
        self.objects
            .iter()
            .any(|(_, o)| o.set.as_ref().is_some_and(|set| set.name == name))
    }

    /// The Service ports the table defines.
    pub fn ports(&self) -> Result<Vec<ServicePort>, RulesError> {
        ports(&self.objects)
    }
}

fn ports(objects: &[(usize, Object)]) -> Result<Vec<ServicePort>, RulesError> {
    let index = index(objects);
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
        for element in elements(map, &map.values(*index)?, *index)? {
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
        for element in elements(map, &map.values(*index)?, *index)? {
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
        for element in elements(map, &map.values(*index)?, *index)? {
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
        for element in elements(map, &map.values(*index)?, *index)? {
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
        for element in elements(map, &map.values(*index)?, *index)? {
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
