//! What the rules do with each Service frontend, for each kind of client: the
//! evaluator's branches folded into [`Case`]s, named from kube-proxy's chain names and
//! comments, and the warnings for frontends observer could not follow.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use super::eval::{Branch, Daddr, Guard, Packet, Target};
use super::frontends::{Plan, TCP, UDP, candidates};
use super::{Program, Set};
use crate::model::record::{Affinity, EndpointShare, Frontend, FrontendKind, Proto, RejectReason};

/// What the rules do with connections to one frontend from one kind of client.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// What the client must be for this case (empty: any client).
    pub guards: Vec<Guard>,
    /// Where the rules DNAT this case's connections, each endpoint's share of them.
    pub endpoints: Vec<EndpointShare>,
    /// What happens to the share that is not DNATed, when some is not: dropped or
    /// rejected (why), or passed on untouched (`None`).
    pub turned_away: Option<RejectReason>,
}

impl Case {
    /// Whether `client` (what it dialed, as `packet`) is a client of this case; an
    /// untellable guard counts as met.
    pub fn admits(&self, client: &super::eval::Client, packet: &Packet) -> bool {
        self.guards
            .iter()
            .all(|guard| guard.check(client, packet).unwrap_or(true))
    }
}

/// One Service frontend as the rules define it.
#[derive(Clone, Debug, PartialEq)]
pub struct FrontendRules {
    /// `ns/name:port` from the rules' names, when they name it.
    pub name: Option<String>,
    pub proto: Proto,
    pub frontend: Frontend,
    pub cases: Vec<Case>,
    pub affinity: Option<Affinity>,
    /// Whether some branch met a rule observer could not follow.
    pub unfollowed: bool,
}

/// Every Service frontend of a table (or of iptables' tables, in hook order), and one
/// warning per rule observer could not follow.
pub fn frontends(programs: &[&Program]) -> (Vec<FrontendRules>, Vec<String>) {
    let plan = Plan::new(programs);
    let mut packets = BTreeSet::new();
    for program in programs {
        packets.extend(candidates(program));
    }
    let cluster_ips: Vec<&Set> = programs
        .iter()
        .filter_map(|p| p.sets.get("cluster-ips").map(|set| &**set))
        .collect();
    let mut out = Vec::new();
    let mut unfollowed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for packet in packets {
        let proto = match packet.proto {
            TCP => Proto::Tcp,
            UDP => Proto::Udp,
            _ => continue,
        };
        let branches = plan.run(packet);
        let name = name(&branches);
        let dnats = branches.iter().any(|b| matches!(b.target, Target::Dnat(_)));
        // Turned away for a Service's reason (no endpoints, a source range), not by
        // some other drop on the way.
        let refuses = branches.iter().any(|b| {
            matches!(b.target, Target::Drop | Target::Reject) && reason(b) != RejectReason::Other
        });
        let mut lost = false;
        for branch in &branches {
            if let Target::Unfollowed(rule) = &branch.target {
                lost = true;
                unfollowed
                    .entry(rule.clone())
                    .or_default()
                    .push(describe_frontend(&name, packet));
            }
        }
        // Not a Service: nothing DNATs it, nothing names it while turning it away or on
        // a way observer cannot follow.
        if !(dnats || (refuses || lost) && name.is_some()) {
            continue;
        }
        let frontend = Frontend {
            kind: kind(packet, &branches, &cluster_ips),
            ip: match packet.daddr {
                Daddr::Addr(ip) => Some(ip),
                Daddr::NodeLocal => None,
            },
            port: packet.dport,
        };
        let affinity = branches
            .iter()
            .find_map(|b| b.trail.affinity)
            .map(|timeout_s| Affinity { timeout_s });
        out.push(FrontendRules {
            name,
            proto,
            frontend,
            cases: cases(&branches),
            affinity,
            unfollowed: lost,
        });
    }
    let warnings = unfollowed
        .into_iter()
        .map(|(rule, frontends)| {
            format!(
                "cannot follow {rule:?}: connections that meet it (to {} first) are not matched to endpoints",
                frontends[0]
            )
        })
        .collect();
    (out, warnings)
}

fn describe_frontend(name: &Option<String>, packet: Packet) -> String {
    let at = match packet.daddr {
        Daddr::Addr(ip) => SocketAddr::new(ip, packet.dport).to_string(),
        Daddr::NodeLocal => format!("NodePort {}", packet.dport),
    };
    match name {
        Some(name) => format!("{name} at {at}"),
        None => at,
    }
}

/// The Service port's name: from the first kube-proxy chain on the way
/// (`service-HASH-ns/name/proto/port`, and its `local-`, `external-`, `endpoint-`
/// siblings), else from the first rule or element comment naming one
/// (`ns/name:port cluster IP`, `ns/name:port -> 10.0.0.1:80`).
fn name(branches: &[Branch]) -> Option<String> {
    let from_chains = branches
        .iter()
        .flat_map(|b| &b.trail.chains)
        .find_map(|chain| chain_name(chain));
    from_chains.or_else(|| {
        branches
            .iter()
            .flat_map(|b| &b.trail.comments)
            .find_map(|comment| comment_name(comment))
    })
}

/// `ns/name:port` from a kube-proxy nftables chain name: `PREFIX-HASH-ns/name/proto/port`
/// (an endpoint chain adds `__ip/port`).
pub fn chain_name(chain: &str) -> Option<String> {
    let (_prefix, rest) = chain.split_once('-')?;
    let (_hash, rest) = rest.split_once('-')?;
    let mut parts = rest.splitn(4, '/');
    let (namespace, name, _proto, port) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let port = port.split("__").next().unwrap_or_default();
    Some(match port.is_empty() {
        true => format!("{namespace}/{name}"),
        false => format!("{namespace}/{name}:{port}"),
    })
}

/// The first word of a comment that looks like `ns/name` or `ns/name:port` (not an
/// address prefix).
fn comment_name(comment: &str) -> Option<String> {
    comment
        .split_whitespace()
        .find(|word| {
            word.contains('/')
                && !word.starts_with('/')
                && word
                    .split('/')
                    .next()
                    .is_some_and(|ns| ns.parse::<std::net::IpAddr>().is_err())
                && !word.contains("->")
        })
        .map(str::to_owned)
}

/// Which kind of Service address: a NodePort is any node address; kube-proxy's names
/// tell ClusterIPs (its `cluster-ips` set, iptables' "cluster IP" comments) from
/// external and load-balancer IPs (its `external-`/`KUBE-EXT-` chains, the
/// `firewall-ips` map, "loadbalancer IP" comments).
fn kind(packet: Packet, branches: &[Branch], cluster_ips: &[&Set]) -> FrontendKind {
    let Daddr::Addr(ip) = packet.daddr else {
        return FrontendKind::NodePort;
    };
    let comments = || branches.iter().flat_map(|b| &b.trail.comments);
    let chains = || branches.iter().flat_map(|b| &b.trail.chains);
    let sets = || branches.iter().flat_map(|b| &b.trail.sets);
    let in_cluster_ips = cluster_ips
        .iter()
        .any(|set| set.find(&super::eval::octets(ip)).is_some());
    if in_cluster_ips || comments().any(|c| c.ends_with(" cluster IP")) {
        FrontendKind::ClusterIp
    } else if sets().any(|s| s == "firewall-ips")
        || comments().any(|c| c.ends_with(" loadbalancer IP"))
        || chains().any(|c| c.starts_with("KUBE-FW-"))
    {
        FrontendKind::LoadBalancer
    } else if comments().any(|c| c.ends_with(" external IP"))
        || chains().any(|c| c.starts_with("external-") || c.starts_with("KUBE-EXT-"))
    {
        FrontendKind::ExternalIp
    } else {
        FrontendKind::ClusterIp
    }
}

/// Where branches end, with their probability and, when they refuse, why.
type Outcome = (Target, f64, RejectReason);

/// Branches grouped by the client they apply to, guards that change nothing dropped.
fn cases(branches: &[Branch]) -> Vec<Case> {
    type Key = Vec<(String, bool)>;
    let key = |guards: &[Guard]| -> Key {
        let mut key: Key = guards.iter().map(|g| (g.text.clone(), g.holds)).collect();
        key.sort();
        key.dedup();
        key
    };
    let mut groups: BTreeMap<Key, (Vec<Guard>, Vec<Outcome>)> = BTreeMap::new();
    for branch in branches {
        let group = groups
            .entry(key(&branch.guards))
            .or_insert_with(|| (dedup(&branch.guards), Vec::new()));
        let reason = reason(branch);
        match group.1.iter_mut().find(|(t, _, _)| *t == branch.target) {
            Some(existing) => existing.1 += branch.probability,
            None => group
                .1
                .push((branch.target.clone(), branch.probability, reason)),
        }
    }
    // A guard both of whose sides lead to the same outcomes, with the same other
    // guards, changes nothing: drop it, merging the two.
    loop {
        let texts: BTreeSet<String> = groups.keys().flatten().map(|(t, _)| t.clone()).collect();
        let mut changed = false;
        for text in texts {
            let without =
                |k: &Key| -> Key { k.iter().filter(|(t, _)| *t != text).cloned().collect() };
            let with_text: Vec<&Key> = groups
                .keys()
                .filter(|k| k.iter().any(|(t, _)| *t == text))
                .collect();
            let removable = with_text.iter().all(|k| {
                let partner: Key = k
                    .iter()
                    .map(|(t, holds)| (t.clone(), if *t == text { !holds } else { *holds }))
                    .collect();
                groups
                    .get(&partner)
                    .is_some_and(|other| same_outcomes(&groups[*k].1, &other.1))
            });
            if removable && !with_text.is_empty() {
                let old = std::mem::take(&mut groups);
                for (k, (guards, outcomes)) in old {
                    let guards = guards.into_iter().filter(|g| g.text != text).collect();
                    groups.entry(without(&k)).or_insert((guards, outcomes));
                }
                changed = true;
                break;
            }
        }
        if !changed {
            break;
        }
    }
    groups
        .into_values()
        .map(|(guards, outcomes)| case(guards, outcomes))
        .collect()
}

fn dedup(guards: &[Guard]) -> Vec<Guard> {
    let mut out: Vec<Guard> = Vec::new();
    for guard in guards {
        if !out
            .iter()
            .any(|g| g.text == guard.text && g.holds == guard.holds)
        {
            out.push(guard.clone());
        }
    }
    out
}

fn same_outcomes(a: &[Outcome], b: &[Outcome]) -> bool {
    a.len() == b.len()
        && a.iter().all(|(target, p, _)| {
            b.iter()
                .any(|(other, q, _)| other == target && (p - q).abs() < 1e-9)
        })
}

fn case(guards: Vec<Guard>, outcomes: Vec<Outcome>) -> Case {
    let mut endpoints: Vec<EndpointShare> = Vec::new();
    let mut turned_away = None;
    for (target, probability, reason) in &outcomes {
        match target {
            Target::Dnat(addr) => endpoints.push(EndpointShare {
                addr: *addr,
                expected_share: *probability,
                pod: None,
            }),
            Target::Drop | Target::Reject => turned_away = Some(*reason),
            Target::Pass | Target::Unfollowed(_) => {}
        }
    }
    Case {
        guards,
        endpoints,
        turned_away,
    }
}

/// Why a branch that dropped or rejected did, by kube-proxy's names for the rule that
/// ended it: its chain and comment, and the map whose element led there.
pub fn reason(branch: &Branch) -> RejectReason {
    let trail = &branch.trail;
    let (chain, comment) = match &trail.end {
        Some((chain, comment)) => (chain.as_str(), comment.as_deref().unwrap_or_default()),
        None => ("", ""),
    };
    let last_set = trail.sets.last().map_or("", String::as_str);
    let rejected = branch.target == Target::Reject;
    if comment.contains("has no local endpoints") {
        RejectReason::NoLocalEndpoints
    } else if comment.contains("has no endpoints") {
        RejectReason::NoEndpoints
    } else if last_set.starts_with("no-endpoint-") {
        // kube-proxy's element verdict: `goto reject-chain` without endpoints, `drop`
        // without local ones.
        if rejected {
            RejectReason::NoEndpoints
        } else {
            RejectReason::NoLocalEndpoints
        }
    } else if last_set == "firewall-ips"
        || (chain.starts_with("firewall-") && chain != "firewall-check")
        || chain.starts_with("KUBE-FW-")
        || chain == "KUBE-PROXY-FIREWALL"
        || comment.contains("traffic not accepted by")
    {
        RejectReason::SourceRange
    } else if chain == "cluster-ips-check" {
        if rejected {
            RejectReason::InvalidPort
        } else {
            RejectReason::UnallocatedIp
        }
    } else {
        RejectReason::Other
    }
}
