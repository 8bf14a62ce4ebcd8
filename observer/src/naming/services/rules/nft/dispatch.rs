//! The endpoints a `service-` / `local-` chain dispatches to: its `numgen random mod N
//! vmap`, and each endpoint chain's `dnat to ip:port`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use super::json::{NftRule, Verdict, as_port, path_err};
use crate::model::record::EndpointShare;
use crate::naming::services::rules::RulesError;

/// Rules by chain name, each with its index in the `nftables` array (for error paths).
pub(super) type Chains<'a> = BTreeMap<&'a str, Vec<(usize, &'a NftRule)>>;

/// The endpoints a `service-` / `local-` chain's `numgen random mod N vmap` picks from:
/// each vmap key is one of N equally likely numbers.
pub(super) fn dispatch(
    chains: &Chains<'_>,
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
            let path = format!("nftables[{index}].rule({chain}).expr[{expr_index}].vmap");
            let parse = |raw: &serde_json::value::RawValue, part: &str| {
                serde_json::from_str::<Value>(raw.get())
                    .map_err(|e| path_err(format!("{path}.{part}"), e.to_string()))
            };
            let key = parse(&vmap.key, "key")?;
            let Some(modulus) = key
                .get("numgen")
                .and_then(|n| n.get("mod"))
                .and_then(Value::as_u64)
            else {
                continue;
            };
            let data = parse(&vmap.data, "data")?;
            add_vmap_shares(chains, &data, modulus, &path, &mut endpoints)?;
        }
    }
    Ok(Some(endpoints))
}

/// Adds each endpoint of one numgen vmap with its share of the `modulus` numbers.
fn add_vmap_shares(
    chains: &Chains<'_>,
    data: &Value,
    modulus: u64,
    path: &str,
    endpoints: &mut Vec<EndpointShare>,
) -> Result<(), RulesError> {
    let entries = data
        .get("set")
        .and_then(Value::as_array)
        .ok_or_else(|| path_err(path.to_owned(), "numgen vmap without an inline set"))?;
    if modulus == 0 {
        return Err(path_err(path.to_owned(), "numgen mod 0"));
    }
    for (entry_index, entry) in entries.iter().enumerate() {
        let entry_path = format!("{path}.data.set[{entry_index}]");
        let pair = entry
            .as_array()
            .filter(|pair| pair.len() == 2)
            .ok_or_else(|| path_err(entry_path.clone(), "expected a [number, verdict] pair"))?;
        let verdict: Verdict = serde_json::from_value(pair[1].clone())
            .map_err(|e| path_err(entry_path.clone(), e.to_string()))?;
        let Some(target) = verdict.chain() else {
            continue;
        };
        let Some(addr) = endpoint_dnat(chains, target)? else {
            continue;
        };
        let share = key_count(&pair[0], entry_path)? as f64 / modulus as f64;
        match endpoints.iter_mut().find(|e| e.addr == addr) {
            Some(existing) => existing.expected_share += share,
            None => endpoints.push(EndpointShare {
                addr,
                expected_share: share,
                pod: None,
            }),
        }
    }
    Ok(())
}

/// How many numbers a vmap key stands for: one number or a {"range": [a, b]} of them.
fn key_count(key: &Value, entry_path: String) -> Result<u64, RulesError> {
    match key.get("range").and_then(Value::as_array) {
        Some(range) => match (
            range.first().and_then(Value::as_u64),
            range.get(1).and_then(Value::as_u64),
        ) {
            (Some(low), Some(high)) if high >= low => Ok(high - low + 1),
            _ => Err(path_err(entry_path, "bad numgen range")),
        },
        None => Ok(1),
    }
}

/// The `dnat to ip:port` of an endpoint chain.
fn endpoint_dnat(chains: &Chains<'_>, chain: &str) -> Result<Option<SocketAddr>, RulesError> {
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
