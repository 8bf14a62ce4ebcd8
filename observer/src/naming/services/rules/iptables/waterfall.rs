//! The `--probability` waterfall of a KUBE-SVC / KUBE-SVL chain and the KUBE-SEP chains
//! it jumps to.

use std::net::SocketAddr;

use super::{Rule, Table, err};
use crate::model::record::{EndpointShare, Proto};
use crate::naming::services::rules::{RulesError, parse_proto};

pub(super) struct Waterfall {
    pub(super) name: Option<String>,
    pub(super) proto: Option<Proto>,
    pub(super) endpoints: Vec<EndpointShare>,
}

/// The endpoints a KUBE-SVC / KUBE-SVL chain picks from and each one's expected share:
/// rule i is reached with the probability that no earlier rule matched, so
/// share_i = P_i * prod_{j<i}(1 - P_j); a rule without `--probability` takes the rest.
pub(super) fn waterfall(nat: &Table, chain: &str) -> Result<Option<Waterfall>, RulesError> {
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
        let probability = probability(rule)?;
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
                pod: None,
            }),
        }
    }
    Ok(Some(result))
}

/// A rule's `--probability`; 1 without one.
fn probability(rule: &Rule) -> Result<f64, RulesError> {
    match rule.probability.as_deref() {
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|p| (0.0..=1.0).contains(p))
            .ok_or_else(|| {
                err(
                    rule.line,
                    format!("--probability {text}: not a probability"),
                )
            }),
        None => Ok(1.0),
    }
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

/// `ip:port` or `[ip6]:port`, as DNAT prints it.
fn parse_socket(text: &str, line: usize) -> Result<SocketAddr, RulesError> {
    text.parse::<SocketAddr>()
        .map_err(|_| err(line, format!("--to-destination {text}: not ip:port")))
}
