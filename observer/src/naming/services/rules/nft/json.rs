//! The parts of nft's JSON that kube-proxy's dispatch uses, typed; and the readers of
//! map elements and chain names.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::model::record::Proto;
use crate::naming::services::rules::{RulesError, parse_proto, service_port_name};

#[derive(Deserialize)]
pub(super) struct Dump {
    pub(super) nftables: Vec<Object>,
}

/// One entry of the `nftables` array: an object with one key naming its kind.
#[derive(Deserialize)]
pub(super) struct Object {
    // Boxed: a table keeps tens of thousands of these, each one of the three.
    pub(super) map: Option<Box<NftMap>>,
    pub(super) set: Option<Box<NftMap>>,
    pub(super) rule: Option<Box<NftRule>>,
}

#[derive(Deserialize)]
pub(super) struct NftMap {
    pub(super) name: String,
    /// The elements' JSON text, parsed when read ([`NftMap::values`]): a table keeps its
    /// maps, and 5,000 elements as a tree of JSON maps take megabytes.
    #[serde(default)]
    pub(super) elem: Option<Box<RawValue>>,
}

impl NftMap {
    /// The elements; `object_index` is the map's position, for error paths.
    pub(super) fn values(&self, object_index: usize) -> Result<Vec<Value>, RulesError> {
        match &self.elem {
            Some(elem) => serde_json::from_str(elem.get()).map_err(|e| {
                path_err(
                    format!("nftables[{object_index}].map({}).elem", self.name),
                    e.to_string(),
                )
            }),
            None => Ok(Vec::new()),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct NftRule {
    pub(super) chain: String,
    /// The kernel's handle, by which an announcement removes the rule.
    #[serde(default)]
    pub(super) handle: Option<u64>,
    #[serde(default)]
    pub(super) expr: Vec<Expr>,
}

/// A rule statement; only the kinds kube-proxy's dispatch uses are typed.
#[derive(Deserialize)]
pub(super) struct Expr {
    pub(super) vmap: Option<Vmap>,
    pub(super) dnat: Option<Dnat>,
}

/// A vmap's key and data as JSON text (see [`NftMap::elem`]), parsed when read.
#[derive(Deserialize)]
pub(super) struct Vmap {
    pub(super) key: Box<RawValue>,
    pub(super) data: Box<RawValue>,
}

#[derive(Deserialize)]
pub(super) struct Dnat {
    pub(super) addr: Option<Value>,
    pub(super) port: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct Target {
    pub(super) target: String,
}

#[derive(Deserialize)]
pub(super) struct Verdict {
    pub(super) goto: Option<Target>,
    pub(super) jump: Option<Target>,
}

impl Verdict {
    pub(super) fn chain(&self) -> Option<&str> {
        self.goto
            .as_ref()
            .or(self.jump.as_ref())
            .map(|t| t.target.as_str())
    }
}

pub(super) fn path_err(path: String, message: impl Into<String>) -> RulesError {
    RulesError::Nft {
        path: super::super::error_text(path),
        message: super::super::error_text(message.into()),
    }
}

/// What a kube-proxy chain name says: `service-HASH-ns/name/proto/port`.
pub(super) struct ChainName<'a> {
    pub(super) prefix: &'a str,
    /// `HASH-ns/name/proto/port`: identifies the Service port across its chains.
    pub(super) base: &'a str,
    pub(super) name: String,
    pub(super) proto: Option<Proto>,
}

pub(super) fn chain_name(chain: &str) -> Option<ChainName<'_>> {
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

pub(super) fn as_port(value: &Value) -> Option<u16> {
    match value {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A map's elements as (key parts, comment, verdict chain); `path` names the map.
pub(super) struct Element<'a> {
    pub(super) path: String,
    pub(super) parts: Vec<&'a Value>,
    pub(super) comment: Option<&'a str>,
    pub(super) chain: Option<String>,
}

pub(super) fn elements<'a>(
    map: &NftMap,
    values: &'a [Value],
    object_index: usize,
) -> Result<Vec<Element<'a>>, RulesError> {
    let mut out = Vec::new();
    for (index, elem) in values.iter().enumerate() {
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
pub(super) fn ip_proto_port(
    element: &Element<'_>,
) -> Result<(IpAddr, Option<Proto>, u16), RulesError> {
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
pub(super) fn proto_port(element: &Element<'_>) -> Result<(Option<Proto>, u16), RulesError> {
    let [proto, port] = element.parts[..] else {
        return Err(path_err(element.path.clone(), "expected key proto . port"));
    };
    let port = as_port(port)
        .ok_or_else(|| path_err(element.path.clone(), format!("{port}: not a port")))?;
    Ok((proto.as_str().and_then(parse_proto), port))
}
