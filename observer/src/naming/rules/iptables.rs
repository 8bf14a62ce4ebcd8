//! `iptables-save` text as kube-proxy's iptables mode writes it (pkg/proxy/iptables):
//! KUBE-SERVICES / KUBE-NODEPORTS frontends jump to per-Service-port chains that share
//! one hash (KUBE-SVC-H, KUBE-SVL-H, KUBE-EXT-H, KUBE-FW-H); KUBE-SVC-H / KUBE-SVL-H hold
//! the `--probability` waterfall to KUBE-SEP-* chains, which DNAT. iptables-nft and
//! legacy print the same text; option order differs between kube-proxy's input and
//! iptables-save's output, so rules are read as option sets, not by position.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use super::{RulesError, ServicePort, frontend, parse_proto};
use crate::model::record::{EndpointShare, Frontend, FrontendKind, Proto};

/// One `-A` line, reduced to the options kube-proxy's chains use.
#[derive(Debug, Default)]
struct Rule {
    line: usize,
    /// `-d` when not negated: (address, prefix length).
    dst: Option<(IpAddr, u8)>,
    proto: Option<String>,
    dport: Option<String>,
    jump: Option<String>,
    comment: Option<String>,
    probability: Option<String>,
    to_destination: Option<String>,
    /// `-m recent --rcheck`: a session-affinity shortcut, not part of the waterfall.
    rcheck: bool,
    /// `--dst-type LOCAL`: a NodePort-style match on any local address.
    dst_local: bool,
}

#[derive(Default)]
struct Table {
    chains: BTreeMap<String, Vec<Rule>>,
}

fn err(line: usize, message: impl Into<String>) -> RulesError {
    RulesError::Iptables {
        line,
        message: message.into(),
    }
}

/// Splits a rule line like a shell would for iptables-save's quoting: double quotes
/// group words, and `\"` / `\\` escape inside them.
fn tokenize(text: &str, line: usize) -> Result<Vec<String>, RulesError> {
    let mut words = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(words);
        }
        let mut word = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() {
                break;
            }
            chars.next();
            if c != '"' {
                word.push(c);
                continue;
            }
            loop {
                match chars.next() {
                    None => return Err(err(line, "unterminated quoted string (truncated dump?)")),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(escaped) => word.push(escaped),
                        None => {
                            return Err(err(line, "unterminated quoted string (truncated dump?)"));
                        }
                    },
                    Some(other) => word.push(other),
                }
            }
        }
        words.push(word);
    }
}

/// Options that take one value; every other option's value, if any, is skipped as an
/// ordinary word.
fn parse_rule(words: &[String], line: usize) -> Result<(String, Rule), RulesError> {
    let chain = words
        .get(1)
        .ok_or_else(|| err(line, "-A without a chain name"))?
        .clone();
    let mut rule = Rule {
        line,
        ..Rule::default()
    };
    let mut negate = false;
    let mut index = 2;
    while index < words.len() {
        let word = words[index].as_str();
        let takes_value = matches!(
            word,
            "-d" | "--destination"
                | "-p"
                | "--protocol"
                | "--dport"
                | "--destination-port"
                | "-j"
                | "--jump"
                | "-g"
                | "--goto"
                | "--comment"
                | "--probability"
                | "--to-destination"
                | "--dst-type"
        );
        if word == "!" {
            negate = true;
            index += 1;
            continue;
        }
        if takes_value {
            let value = words
                .get(index + 1)
                .ok_or_else(|| {
                    err(
                        line,
                        format!("option {word} has no value (truncated dump?)"),
                    )
                })?
                .clone();
            match word {
                "-d" | "--destination" if !negate => rule.dst = Some(parse_cidr(&value, line)?),
                "-p" | "--protocol" if !negate => rule.proto = Some(value),
                "--dport" | "--destination-port" if !negate => rule.dport = Some(value),
                "-j" | "--jump" | "-g" | "--goto" => rule.jump = Some(value),
                "--comment" => rule.comment = Some(value),
                "--probability" => rule.probability = Some(value),
                "--to-destination" => rule.to_destination = Some(value),
                "--dst-type" if !negate => rule.dst_local = value == "LOCAL",
                _ => {}
            }
            index += 2;
        } else {
            if word == "--rcheck" {
                rule.rcheck = true;
            }
            index += 1;
        }
        negate = false;
    }
    Ok((chain, rule))
}

fn parse_cidr(text: &str, line: usize) -> Result<(IpAddr, u8), RulesError> {
    let (ip, prefix) = match text.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (text, None),
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| err(line, format!("-d {text}: not an IP address")))?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(prefix) => prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= full)
            .ok_or_else(|| err(line, format!("-d {text}: bad prefix length")))?,
        None => full,
    };
    Ok((ip, prefix))
}

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

/// `ip:port` or `[ip6]:port`, as DNAT prints it.
fn parse_socket(text: &str, line: usize) -> Result<SocketAddr, RulesError> {
    text.parse::<SocketAddr>()
        .map_err(|_| err(line, format!("--to-destination {text}: not ip:port")))
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

#[derive(Default)]
struct Builder {
    name: Option<String>,
    proto: Option<Proto>,
    frontends: BTreeSet<Frontend>,
}

pub(super) fn parse(text: &str) -> Result<Vec<ServicePort>, RulesError> {
    let mut tables: HashMap<String, Table> = HashMap::new();
    let mut current: Option<(String, usize)> = None;
    let mut last_line = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        last_line = line;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('*') {
            if let Some((open, _)) = &current {
                return Err(err(
                    line,
                    format!("table {name} starts before table {open} got its COMMIT"),
                ));
            }
            current = Some((name.to_owned(), line));
            tables.entry(name.to_owned()).or_default();
            continue;
        }
        let Some((table_name, _)) = &current else {
            return Err(err(
                line,
                format!(
                    "not iptables-save output (outside any *table): {}",
                    clip(trimmed)
                ),
            ));
        };
        let table = tables.entry(table_name.clone()).or_default();
        if trimmed == "COMMIT" {
            current = None;
        } else if let Some(declaration) = trimmed.strip_prefix(':') {
            let chain = declaration.split_whitespace().next().unwrap_or_default();
            if chain.is_empty() {
                return Err(err(line, "chain declaration without a name"));
            }
            table.chains.entry(chain.to_owned()).or_default();
        } else if trimmed.starts_with("-A ") {
            let words = tokenize(trimmed, line)?;
            let (chain, rule) = parse_rule(&words, line)?;
            table.chains.entry(chain).or_default().push(rule);
        } else {
            return Err(err(
                line,
                format!("not an iptables-save line: {}", clip(trimmed)),
            ));
        }
    }
    if let Some((name, _)) = current {
        return Err(err(
            last_line,
            format!("table {name} has no COMMIT (truncated dump?)"),
        ));
    }
    let mut ports = match tables.get("nat") {
        Some(nat) => from_nat(nat)?,
        None => Vec::new(),
    };
    if let Some(filter) = tables.get("filter") {
        add_no_endpoint_services(filter, &mut ports)?;
    }
    Ok(ports)
}

fn clip(text: &str) -> String {
    const MAX: usize = 60;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

fn from_nat(nat: &Table) -> Result<Vec<ServicePort>, RulesError> {
    let mut builders: BTreeMap<&str, Builder> = BTreeMap::new();
    let empty = Vec::new();
    for rule in nat.chains.get("KUBE-SERVICES").unwrap_or(&empty) {
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
    for rule in nat.chains.get("KUBE-NODEPORTS").unwrap_or(&empty) {
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
            continue;
        };
        let (endpoints, local_endpoints) = match (cluster, local) {
            (Some(cluster), local) => (cluster.endpoints, local.map(|l| l.endpoints)),
            (None, Some(local)) => (local.endpoints, None),
            (None, None) => (Vec::new(), None),
        };
        ports.push(ServicePort {
            name,
            proto,
            frontends: builder.frontends.into_iter().collect(),
            endpoints,
            local_endpoints,
        });
    }
    Ok(ports)
}

struct Waterfall {
    name: Option<String>,
    proto: Option<Proto>,
    endpoints: Vec<EndpointShare>,
}

/// The endpoints a KUBE-SVC / KUBE-SVL chain picks from and each one's expected share:
/// rule i is reached with the probability that no earlier rule matched, so
/// share_i = P_i * prod_{j<i}(1 - P_j); a rule without `--probability` takes the rest.
fn waterfall(nat: &Table, chain: &str) -> Result<Option<Waterfall>, RulesError> {
    let Some(rules) = nat.chains.get(chain) else {
        return Ok(None);
    };
    let mut result = Waterfall {
        name: None,
        proto: None,
        endpoints: Vec::new(),
    };
    let mut remaining = 1.0_f64;
    for rule in rules {
        let Some(target) = rule.jump.as_deref() else {
            continue;
        };
        if !target.starts_with("KUBE-SEP-") || rule.rcheck {
            continue;
        }
        let probability = match rule.probability.as_deref() {
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| {
                    err(
                        rule.line,
                        format!("--probability {text}: not a probability"),
                    )
                })?,
            None => 1.0,
        };
        let comment_target = rule.comment.as_deref().and_then(|c| c.split_once(" -> "));
        if let Some((name, _)) = comment_target {
            result.name.get_or_insert_with(|| name.to_owned());
        }
        let dnat = endpoint_dnat(nat, target)?;
        if let Some((_, proto)) = &dnat {
            result.proto = result.proto.or(*proto);
        }
        let addr = match (dnat, comment_target) {
            (Some((addr, _)), _) => addr,
            (None, Some((_, addr))) => parse_socket(addr, rule.line)?,
            // A jump to an endpoint chain that was cut off and names no address.
            (None, None) => continue,
        };
        let share = remaining * probability;
        remaining -= share;
        match result.endpoints.iter_mut().find(|e| e.addr == addr) {
            Some(existing) => existing.expected_share += share,
            None => result.endpoints.push(EndpointShare {
                addr,
                expected_share: share,
            }),
        }
    }
    Ok(Some(result))
}

/// The DNAT target (and protocol) of a KUBE-SEP chain.
fn endpoint_dnat(
    nat: &Table,
    chain: &str,
) -> Result<Option<(SocketAddr, Option<Proto>)>, RulesError> {
    let Some(rules) = nat.chains.get(chain) else {
        return Ok(None);
    };
    for rule in rules {
        if rule.jump.as_deref() == Some("DNAT")
            && let Some(target) = &rule.to_destination
        {
            let addr = parse_socket(target, rule.line)?;
            let proto = rule.proto.as_deref().and_then(parse_proto);
            return Ok(Some((addr, proto)));
        }
    }
    Ok(None)
}

/// The filter table's "has no endpoints" rejects: the only trace of a Service port with
/// no endpoints (the nat table has nothing for it).
fn add_no_endpoint_services(
    filter: &Table,
    ports: &mut Vec<ServicePort>,
) -> Result<(), RulesError> {
    let empty = Vec::new();
    for chain in ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS"] {
        for rule in filter.chains.get(chain).unwrap_or(&empty) {
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
            let frontend = match (exact_dst(rule), chain) {
                (Some(ip), "KUBE-SERVICES") => frontend(FrontendKind::ClusterIp, Some(ip), port),
                (Some(ip), _) => frontend(FrontendKind::ExternalIp, Some(ip), port),
                (None, _) if rule.dst_local || chain == "KUBE-NODEPORTS" => {
                    frontend(FrontendKind::NodePort, None, port)
                }
                (None, _) => continue,
            };
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
    }
    Ok(())
}
