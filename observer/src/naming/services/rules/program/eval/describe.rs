//! Matches as text, in nft's words: what a guard says in messages and the key by which
//! guards are told apart.

use std::net::IpAddr;

use crate::naming::services::rules::program::{CmpOp, Cond, Expr, Field, RTN_LOCAL, Set, SetRef};

/// A match as nft would print it, near enough: `ip saddr 10.0.0.0/8`,
/// `fib saddr type local`, `ip daddr @nodeport-ips`.
pub fn describe(cond: &Cond) -> String {
    match cond {
        Cond::Cmp { left, op, right } => {
            let op = match op {
                CmpOp::Eq => "",
                CmpOp::Ne => "!= ",
                CmpOp::Lt => "< ",
                CmpOp::Gt => "> ",
                CmpOp::Le => "<= ",
                CmpOp::Ge => ">= ",
            };
            match left {
                Expr::Bitwise { of, mask, .. } if is_addr(of) => {
                    let bits = mask.iter().map(|b| b.count_ones()).sum::<u32>();
                    format!("{} {op}{}/{bits}", expr(of), value(of, right))
                }
                _ => format!("{} {op}{}", expr(left), value(left, right)),
            }
        }
        Cond::Range {
            left,
            low,
            high,
            negated,
        } => format!(
            "{} {}{}-{}",
            expr(left),
            if *negated { "!= " } else { "" },
            value(left, low),
            value(left, high)
        ),
        Cond::InSet { left, set, negated } => format!(
            "{} {}{}",
            expr(left),
            if *negated { "!= " } else { "" },
            set_text(left, set)
        ),
        Cond::Probability(p) => format!("probability {p}"),
        Cond::Recent { .. } => "recent client".to_owned(),
        Cond::Opaque(text) => text.clone(),
    }
}

fn is_addr(expr: &Expr) -> bool {
    matches!(expr, Expr::Field(Field::Saddr | Field::Daddr))
}

fn expr(value: &Expr) -> String {
    match value {
        Expr::Field(Field::Saddr) => "ip saddr".to_owned(),
        Expr::Field(Field::Daddr) => "ip daddr".to_owned(),
        Expr::Field(Field::L4Proto) => "meta l4proto".to_owned(),
        Expr::Field(Field::Sport) => "th sport".to_owned(),
        Expr::Field(Field::Dport) => "th dport".to_owned(),
        Expr::CtMark => "ct mark".to_owned(),
        Expr::CtState => "ct state".to_owned(),
        Expr::Mark => "meta mark".to_owned(),
        Expr::FibType { source: true } => "fib saddr type".to_owned(),
        Expr::FibType { source: false } => "fib daddr type".to_owned(),
        Expr::Numgen { modulus, .. } => format!("numgen mod {modulus}"),
        Expr::Const(bytes) => hex(bytes),
        Expr::Concat(parts) => parts.iter().map(expr).collect::<Vec<_>>().join(" . "),
        Expr::Lookup { key, map } => format!("{} map {}", expr(key), set_label(map)),
        Expr::Slice { of, .. } => expr(of),
        Expr::Bitwise { of, mask, .. } => format!("{} & {}", expr(of), hex(mask)),
        Expr::Opaque(text) => text.clone(),
    }
}

/// A constant in the form its expression gives it.
fn value(left: &Expr, bytes: &[u8]) -> String {
    match left {
        Expr::Field(Field::Saddr | Field::Daddr) | Expr::Bitwise { .. } => match bytes.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap_or_default()).to_string(),
            16 => IpAddr::from(<[u8; 16]>::try_from(bytes).unwrap_or_default()).to_string(),
            _ => hex(bytes),
        },
        Expr::FibType { .. } if bytes == RTN_LOCAL.to_ne_bytes() => "local".to_owned(),
        Expr::Field(Field::Sport | Field::Dport) if bytes.len() == 2 => {
            u16::from_be_bytes([bytes[0], bytes[1]]).to_string()
        }
        Expr::Field(Field::L4Proto) if bytes.len() == 1 => bytes[0].to_string(),
        _ => hex(bytes),
    }
}

fn set_text(left: &Expr, set: &SetRef) -> String {
    match set {
        SetRef::Named(name) => format!("@{name}"),
        SetRef::Inline(set) => inline(left, set),
    }
}

fn set_label(set: &SetRef) -> String {
    match set {
        SetRef::Named(name) => format!("@{name}"),
        SetRef::Inline(_) => "{ ... }".to_owned(),
    }
}

fn inline(left: &Expr, set: &Set) -> String {
    let elements: Vec<String> = set
        .elements()
        .iter()
        .map(|e| match &e.key_end {
            Some(end) => prefix_or_range(left, &e.key, end),
            None => value(left, &e.key),
        })
        .collect();
    format!("{{ {} }}", elements.join(", "))
}

/// `10.0.0.0/8` where the range is a prefix, `a-b` otherwise.
fn prefix_or_range(left: &Expr, low: &[u8], high: &[u8]) -> String {
    let number = |bytes: &[u8]| bytes.iter().fold(0u128, |n, b| (n << 8) | u128::from(*b));
    if is_addr(left) && low.len() == high.len() && matches!(low.len(), 4 | 16) {
        let (l, h) = (number(low), number(high));
        let host = l ^ h;
        if l & host == 0 && h & host == host && host.wrapping_add(1) & host == 0 {
            let prefix = low.len() as u32 * 8 - (128 - host.leading_zeros());
            return format!("{}/{prefix}", value(left, low));
        }
    }
    format!("{}-{}", value(left, low), value(left, high))
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::from("0x");
    for byte in bytes {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}
