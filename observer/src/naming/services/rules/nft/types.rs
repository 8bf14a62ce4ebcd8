//! nft's JSON values as the kernel's bytes: what type a value has (from the expression
//! it is compared with, or a set's declared type) and how that type is encoded.

use std::net::IpAddr;

use serde_json::Value;

use crate::naming::services::rules::program::{
    Bytes, CT_STATE_NEW, Expr, Family, Field, RTN_LOCAL, padded,
};

/// A value's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Addr(Family),
    /// `inet_proto`: one byte.
    Proto,
    /// `inet_service`: two bytes, big-endian.
    Port,
    /// A host-endian 32-bit number: `mark`, numgen's numbers, `integer`.
    U32,
    /// `ct state` flags.
    CtState,
    /// `fib ... type`: a route type.
    FibType,
}

impl Ty {
    /// nft's type names (`ipv4_addr`, `inet_service`, ...).
    pub fn named(name: &str) -> Option<Ty> {
        Some(match name {
            "ipv4_addr" => Ty::Addr(Family::V4),
            "ipv6_addr" => Ty::Addr(Family::V6),
            "inet_proto" => Ty::Proto,
            "inet_service" => Ty::Port,
            "mark" | "integer" | "ct_mark" => Ty::U32,
            "ct_state" => Ty::CtState,
            "fib_addrtype" => Ty::FibType,
            _ => return None,
        })
    }

    /// A declared type: `"ipv4_addr"`, `["ipv4_addr", "inet_proto"]` or
    /// `"ipv4_addr . inet_service"`.
    pub fn declared(value: &Value) -> Option<Vec<Ty>> {
        match value {
            Value::String(text) => text.split(" . ").map(|n| Ty::named(n.trim())).collect(),
            Value::Array(names) => names
                .iter()
                .map(|n| n.as_str().and_then(Ty::named))
                .collect(),
            _ => None,
        }
    }

    /// The type of what an expression yields, part by part.
    pub fn of(expr: &Expr, family: Family) -> Option<Vec<Ty>> {
        Some(match expr {
            Expr::Field(Field::Saddr | Field::Daddr) => vec![Ty::Addr(family)],
            Expr::Field(Field::L4Proto) => vec![Ty::Proto],
            Expr::Field(Field::Sport | Field::Dport) => vec![Ty::Port],
            Expr::CtMark | Expr::Mark | Expr::Numgen { .. } => vec![Ty::U32],
            Expr::CtState => vec![Ty::CtState],
            Expr::FibType { .. } => vec![Ty::FibType],
            Expr::Concat(parts) => {
                let mut out = Vec::new();
                for part in parts {
                    out.extend(Ty::of(part, family)?);
                }
                out
            }
            Expr::Bitwise { of, .. } => Ty::of(of, family)?,
            _ => return None,
        })
    }

    /// One value of this type as bytes; `Err` says why it is not one.
    pub fn encode(self, value: &Value) -> Result<Bytes, String> {
        let bad = || format!("{value}: not {}", self.article());
        Ok(match self {
            Ty::Addr(family) => {
                let ip = value
                    .as_str()
                    .and_then(|s| s.parse::<IpAddr>().ok())
                    .filter(|ip| Family::of(*ip) == family)
                    .ok_or_else(bad)?;
                crate::naming::services::rules::program::eval::octets(ip)
            }
            Ty::Proto => vec![proto(value).ok_or_else(bad)?],
            Ty::Port => port(value).ok_or_else(bad)?.to_be_bytes().to_vec(),
            Ty::U32 => number(value)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad)?
                .to_ne_bytes()
                .to_vec(),
            Ty::CtState => ct_state(value).ok_or_else(bad)?.to_ne_bytes().to_vec(),
            Ty::FibType => match value.as_str() {
                Some("local") => RTN_LOCAL,
                Some("unicast") => 1,
                Some("broadcast") => 3,
                Some("anycast") => 4,
                Some("multicast") => 5,
                Some("blackhole") => 6,
                Some("unreachable") => 7,
                Some("prohibit") => 8,
                _ => number(value)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(bad)?,
            }
            .to_ne_bytes()
            .to_vec(),
        })
    }

    fn article(self) -> &'static str {
        match self {
            Ty::Addr(Family::V4) => "an IP address",
            Ty::Addr(Family::V6) => "an IPv6 address",
            Ty::Proto => "a protocol",
            Ty::Port => "a port",
            Ty::U32 => "a 32-bit number",
            Ty::CtState => "a conntrack state",
            Ty::FibType => "a route type",
        }
    }
}

/// A value of several parts (`{"concat": [...]}` or a bare value for one part), each
/// encoded by its type and padded to 4 bytes when there are several.
pub fn encode_parts(types: &[Ty], value: &Value) -> Result<Bytes, String> {
    let parts: Vec<&Value> = match value.get("concat").and_then(Value::as_array) {
        Some(parts) => parts.iter().collect(),
        None => vec![value],
    };
    if parts.len() != types.len() {
        return Err(format!(
            "{value}: {} parts where the type has {}",
            parts.len(),
            types.len()
        ));
    }
    if types.len() == 1 {
        return types[0].encode(parts[0]);
    }
    let mut out = Vec::new();
    for (ty, part) in types.iter().zip(parts) {
        // Each part starts on a register boundary.
        out.extend(ty.encode(part)?);
        out.resize(padded(out.len()), 0);
    }
    Ok(out)
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        },
        _ => None,
    }
}

fn proto(value: &Value) -> Option<u8> {
    match value.as_str() {
        Some("tcp") => Some(6),
        Some("udp") => Some(17),
        Some("sctp") => Some(132),
        Some("icmp") => Some(1),
        Some("icmpv6" | "ipv6-icmp") => Some(58),
        _ => number(value).and_then(|n| u8::try_from(n).ok()),
    }
}

fn port(value: &Value) -> Option<u16> {
    match value.as_str() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        Some("domain") => Some(53),
        _ => number(value).and_then(|n| u16::try_from(n).ok()),
    }
}

fn ct_state(value: &Value) -> Option<u32> {
    let one = |name: &str| -> Option<u32> {
        Some(match name {
            "invalid" => 1,
            "established" => 2,
            "related" => 4,
            "new" => CT_STATE_NEW,
            "untracked" => 64,
            _ => return None,
        })
    };
    match value {
        Value::String(name) => one(name),
        Value::Array(names) => names
            .iter()
            .map(|n| n.as_str().and_then(one))
            .sum::<Option<u32>>(),
        _ => number(value).and_then(|n| u32::try_from(n).ok()),
    }
}
