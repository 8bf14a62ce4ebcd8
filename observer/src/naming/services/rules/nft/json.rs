//! `nft -j list table` into a [`Program`]: chains (with their hooks), rules, sets and
//! maps. Expressions observer does not model become opaque (the evaluator then says
//! which rule it could not follow); malformed values in maps and sets are errors that
//! name their position (`nftables[3].map(service-ips).elem[0]`).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::statements::{Declared, RuleDecoder, Usage};
use super::types::{Ty, encode_parts};
use crate::naming::services::rules::RulesError;
use crate::naming::services::rules::program::{
    Base, Bytes, ChainType, Data, Element, Family, Hook, Program, Set, Verdict,
};

pub(super) fn path_err(path: String, message: impl Into<String>) -> RulesError {
    RulesError::Nft {
        path: crate::naming::services::rules::error_text(path),
        message: crate::naming::services::rules::error_text(message.into()),
    }
}

/// The `nftables` array of a dump. Parsed through `Value`'s `FromStr`, which is compiled
/// in serde_json (optimized in every build, see Cargo.toml), not in observer: a 5,000
/// Service dump is 17 MB.
pub(super) fn objects(text: &str) -> Result<Vec<Value>, RulesError> {
    let mut dump: Value = text
        .parse()
        .map_err(|e: serde_json::Error| RulesError::NftSyntax {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
    match dump.get_mut("nftables").map(Value::take) {
        Some(Value::Array(objects)) => Ok(objects),
        _ => Err(RulesError::NftSyntax {
            line: 1,
            column: 1,
            message: "not nft's JSON: no `nftables` array".to_owned(),
        }),
    }
}

/// The family of the first object that names one (`ip` unless `ip6`).
pub(super) fn family(objects: &[Value]) -> Family {
    objects
        .iter()
        .filter_map(|o| o.as_object()?.values().next()?.get("family")?.as_str())
        .map(|family| match family {
            "ip6" => Family::V6,
            _ => Family::V4,
        })
        .next()
        .unwrap_or(Family::V4)
}

/// A whole dump as a program; the names of the plain sets (not maps).
pub(super) fn program(objects: &[Value]) -> Result<(Program, Vec<String>), RulesError> {
    let family = family(objects);
    let mut program = Program::new(family);
    let mut decoder = RuleDecoder::new(family, declared_types(objects));
    for (position, object) in objects.iter().enumerate() {
        if let Some(chain) = object.get("chain") {
            let Some(name) = chain.get("name").and_then(Value::as_str) else {
                continue;
            };
            program.chains.entry(name.to_owned()).or_default().base = base(chain);
        }
        if let Some(rule) = object.get("rule") {
            let (chain, rule) = decoder.rule(position, rule)?;
            program.chains.entry(chain).or_default().rules.push(rule);
        }
    }
    let mut plain = Vec::new();
    for (position, object) in objects.iter().enumerate() {
        for kind in ["set", "map"] {
            if let Some(set) = object.get(kind) {
                let (name, set) = named_set(position, kind, set, decoder.usage())?;
                if kind == "set" {
                    plain.push(name.clone());
                }
                program.sets.insert(name, Arc::new(set));
            }
        }
    }
    Ok((program, plain))
}

/// The declared key and data types of every named set and map.
fn declared_types(objects: &[Value]) -> Declared {
    let mut out = HashMap::new();
    for object in objects {
        for kind in ["set", "map"] {
            let Some(set) = object.get(kind) else {
                continue;
            };
            let Some(name) = set.get("name").and_then(Value::as_str) else {
                continue;
            };
            let key = set.get("type").and_then(Ty::declared);
            let data = set
                .get("map")
                .filter(|m| m.as_str() != Some("verdict"))
                .and_then(Ty::declared);
            out.insert(name.to_owned(), (key, data));
        }
    }
    out
}

/// A base chain's hook: `{"type": "nat", "hook": "prerouting", "prio": -100}`.
fn base(chain: &Value) -> Option<Base> {
    let hook = match chain.get("hook")?.as_str()? {
        "prerouting" => Hook::Prerouting,
        "input" => Hook::Input,
        "forward" => Hook::Forward,
        "output" => Hook::Output,
        "postrouting" => Hook::Postrouting,
        _ => return None,
    };
    let kind = match chain.get("type")?.as_str()? {
        "nat" => ChainType::Nat,
        _ => ChainType::Filter,
    };
    let priority = chain
        .get("prio")
        .and_then(Value::as_i64)
        .and_then(|p| i32::try_from(p).ok())
        .unwrap_or(0);
    Some(Base {
        kind,
        hook,
        priority,
    })
}

/// A named set or map, its elements typed by its declaration or by how rules use it.
fn named_set(
    position: usize,
    kind: &str,
    set: &Value,
    usage: &HashMap<String, Usage>,
) -> Result<(String, Set), RulesError> {
    let name = set
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| path_err(format!("nftables[{position}].{kind}"), "no name"))?;
    let path = format!("nftables[{position}].{kind}({name})");
    let used = usage.get(name);
    let key_types = set
        .get("type")
        .and_then(Ty::declared)
        .or_else(|| used.and_then(|u| u.key.clone()));
    let data_types = set
        .get("map")
        .filter(|m| m.as_str() != Some("verdict"))
        .and_then(Ty::declared)
        .or_else(|| used.and_then(|u| u.data.clone()));
    let flags: Vec<&str> = set
        .get("flags")
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Set::default();
    // kube-proxy's affinity sets: `flags dynamic,timeout` (nft 1.0.6 prints only
    // `timeout` back); filled by `update @set` from the packets.
    out.dynamic = flags.contains(&"dynamic") || flags.contains(&"timeout");
    out.timeout = set.get("timeout").and_then(Value::as_u64);
    out.comment = set
        .get("comment")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let elements = set.get("elem").and_then(Value::as_array);
    if let (Some(elements), Some(key_types)) = (elements, key_types) {
        for (index, element) in elements.iter().enumerate() {
            let at = format!("{path}.elem[{index}]");
            out.push(
                self::element(&key_types, data_types.as_deref(), element)
                    .map_err(|message| path_err(at, message))?,
            );
        }
    }
    Ok((name.to_owned(), out))
}

/// One element: `KEY`, `[KEY, DATA]`; a key may be `{"elem": {"val": ..., "comment":
/// ...}}`, a `{"prefix": ...}` or a `{"range": [...]}`. Data is a verdict or a value of
/// `data_types`.
pub(super) fn element(
    key_types: &[Ty],
    data_types: Option<&[Ty]>,
    element: &Value,
) -> Result<Element, String> {
    let (key, data) = match element.as_array() {
        Some(pair) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
        Some(_) => return Err("expected a [key, data] pair".to_owned()),
        None => (element, None),
    };
    let (key_value, comment) = match key.get("elem") {
        Some(elem) => (
            elem.get("val").unwrap_or(&Value::Null),
            elem.get("comment").and_then(Value::as_str),
        ),
        None => (key, None),
    };
    let (key, key_end) = key_bytes(key_types, key_value)?;
    let data = match data {
        None => None,
        Some(data) => Some(match verdict(data) {
            Some(verdict) => Data::Verdict(verdict),
            None => match data_types {
                Some(types) => Data::Value(encode_parts(types, data)?),
                None => return Err(format!("{data}: not a verdict")),
            },
        }),
    };
    Ok(Element {
        key,
        key_end,
        data,
        comment: comment.map(str::to_owned),
    })
}

/// A key, or the first and last key of a range or prefix.
fn key_bytes(types: &[Ty], value: &Value) -> Result<(Bytes, Option<Bytes>), String> {
    if let Some(prefix) = value.get("prefix") {
        let [ty] = types else {
            return Err(format!("{value}: a prefix of a concatenation"));
        };
        let low = ty.encode(prefix.get("addr").unwrap_or(&Value::Null))?;
        let len = prefix.get("len").and_then(Value::as_u64).unwrap_or(0) as usize;
        let high = host_ones(&low, len);
        let low = host_zeros(&low, len);
        return Ok((low, Some(high)));
    }
    if let Some([low, high]) = value
        .get("range")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        return Ok((encode_parts(types, low)?, Some(encode_parts(types, high)?)));
    }
    Ok((encode_parts(types, value)?, None))
}

/// An address with the bits after `prefix` cleared, or set.
pub(super) fn host_zeros(addr: &[u8], prefix: usize) -> Bytes {
    masked(addr, prefix, false)
}

pub(super) fn host_ones(addr: &[u8], prefix: usize) -> Bytes {
    masked(addr, prefix, true)
}

fn masked(addr: &[u8], prefix: usize, ones: bool) -> Bytes {
    addr.iter()
        .enumerate()
        .map(|(i, byte)| {
            let keep = prefix.saturating_sub(i * 8).min(8);
            let mask = if keep == 0 { 0 } else { 0xffu8 << (8 - keep) };
            if ones { byte | !mask } else { byte & mask }
        })
        .collect()
}

/// `{"goto": {"target": C}}`, `{"jump": ...}`, `{"accept": null}`, ...
pub(super) fn verdict(value: &Value) -> Option<Verdict> {
    let object = value.as_object()?;
    let (kind, body) = object.iter().next()?;
    let target = || {
        body.get("target")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    Some(match kind.as_str() {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "continue" => Verdict::Continue,
        "return" => Verdict::Return,
        "jump" => Verdict::Jump(target()?),
        "goto" => Verdict::Goto(target()?),
        _ => return None,
    })
}

/// A named set listed alone (`nft -j list map ip kube-proxy NAME`), typed as the
/// program's rules use it.
pub(super) fn listed_set(
    listing: &str,
    name: &str,
    usage: &HashMap<String, Usage>,
) -> Result<Option<(Set, bool)>, RulesError> {
    for (position, object) in objects(listing)?.iter().enumerate() {
        for kind in ["set", "map"] {
            if let Some(set) = object.get(kind)
                && set.get("name").and_then(Value::as_str) == Some(name)
            {
                let (_, set) = named_set(position, kind, set, usage)?;
                return Ok(Some((set, kind == "set")));
            }
        }
    }
    Ok(None)
}
