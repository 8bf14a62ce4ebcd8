//! One rule of nft's JSON into the program's statements: matches, verdicts, verdict
//! maps, `dnat` (to a constant or through a map), `ct mark set`. Set references are
//! typed by the expression they are looked up with, which types sets that declare no
//! type.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::json::{element, host_ones, host_zeros, path_err, verdict};
use super::types::Ty;
use crate::naming::services::rules::RulesError;
use crate::naming::services::rules::program::{
    Bytes, CmpOp, Cond, Expr, Family, Field, Rule, Set, SetRef, Stmt, Verdict, padded,
};

/// How rules look a named set up: its key's types, and its data's when a DNAT reads it.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub key: Option<Vec<Ty>>,
    pub data: Option<Vec<Ty>>,
}

pub struct RuleDecoder {
    family: Family,
    declared: Declared,
    usage: HashMap<String, Usage>,
}

/// Each named set's declared key and data types.
pub type Declared = HashMap<String, (Option<Vec<Ty>>, Option<Vec<Ty>>)>;

impl RuleDecoder {
    pub fn new(family: Family, declared: Declared) -> RuleDecoder {
        RuleDecoder {
            family,
            declared,
            usage: HashMap::new(),
        }
    }

    pub fn usage(&self) -> &HashMap<String, Usage> {
        &self.usage
    }

    /// `{"chain": C, "handle": H, "expr": [...], "comment": ...}` at `nftables[position]`.
    pub fn rule(&mut self, position: usize, rule: &Value) -> Result<(String, Rule), RulesError> {
        let chain = rule
            .get("chain")
            .and_then(Value::as_str)
            .ok_or_else(|| path_err(format!("nftables[{position}].rule"), "no chain"))?;
        let path = format!("nftables[{position}].rule({chain})");
        let mut stmts = Vec::new();
        for (index, stmt) in rule
            .get("expr")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            self.stmt(stmt, &format!("{path}.expr[{index}]"), &mut stmts)?;
        }
        Ok((
            chain.to_owned(),
            Rule {
                stmts,
                comment: rule
                    .get("comment")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                handle: rule.get("handle").and_then(Value::as_u64),
                origin: path,
            },
        ))
    }

    fn stmt(&mut self, stmt: &Value, path: &str, out: &mut Vec<Stmt>) -> Result<(), RulesError> {
        if let Some(v) = verdict(stmt) {
            out.push(Stmt::Verdict(v));
            return Ok(());
        }
        let Some((kind, body)) = stmt.as_object().and_then(|o| o.iter().next()) else {
            out.push(Stmt::Opaque(clip(stmt)));
            return Ok(());
        };
        match kind.as_str() {
            "match" => self.matching(body, path, out)?,
            "vmap" => {
                let key = self.expr(body.get("key").unwrap_or(&Value::Null));
                let map =
                    self.set_ref(&key, None, body.get("data"), &format!("{path}.vmap.data"))?;
                out.push(match map {
                    Some(map) => Stmt::Vmap { key, map },
                    None => Stmt::Opaque(clip(stmt)),
                });
            }
            "dnat" => out.push(self.dnat(body, stmt, path)?),
            "mangle" => {
                let key = body.get("key").unwrap_or(&Value::Null);
                out.push(match self.expr(key) {
                    Expr::CtMark => {
                        Stmt::SetCtMark(self.expr(body.get("value").unwrap_or(&Value::Null)))
                    }
                    Expr::Mark => Stmt::Inert,
                    _ => Stmt::Opaque(clip(stmt)),
                });
            }
            "reject" => out.push(Stmt::Verdict(Verdict::Reject)),
            // SNAT-type NAT ends a nat chain, with no DNAT.
            "masquerade" | "snat" => out.push(Stmt::Verdict(Verdict::Accept)),
            "counter" | "log" | "set" | "notrack" | "dup" | "meta" | "ct" => out.push(Stmt::Inert),
            // Rate limits stop a rule for some packets: which ones, only the packet tells.
            "limit" | "quota" => out.push(Stmt::Match(Cond::Opaque(clip(stmt)))),
            _ => out.push(Stmt::Opaque(clip(stmt))),
        }
        Ok(())
    }

    /// `{"op": OP, "left": L, "right": R}`.
    fn matching(
        &mut self,
        body: &Value,
        path: &str,
        out: &mut Vec<Stmt>,
    ) -> Result<(), RulesError> {
        let left_json = body.get("left").unwrap_or(&Value::Null);
        let left = self.expr(left_json);
        // `tcp dport 80` tests the protocol first (nft adds it in the bytecode).
        if let Some(proto) = left_json
            .get("payload")
            .and_then(|p| p.get("protocol"))
            .and_then(Value::as_str)
            .and_then(|p| match p {
                "tcp" => Some(6u8),
                "udp" => Some(17),
                "sctp" => Some(132),
                _ => None,
            })
        {
            out.push(Stmt::Match(Cond::Cmp {
                left: Expr::Field(Field::L4Proto),
                op: CmpOp::Eq,
                right: vec![proto],
            }));
        }
        let right = body.get("right").unwrap_or(&Value::Null);
        let op = body.get("op").and_then(Value::as_str).unwrap_or("==");
        let opaque = || Cond::Opaque(clip(body));
        let Some(types) = Ty::of(&left, self.family) else {
            out.push(Stmt::Match(opaque()));
            return Ok(());
        };
        let negated = op == "!=";
        let cond = if let Some(set) =
            self.set_ref(&left, None, Some(right), &format!("{path}.match.right"))?
        {
            Cond::InSet { left, set, negated }
        } else if let Some(range) = self.range(&types, right) {
            let (low, high) = range.map_err(|m| path_err(path.to_owned(), m))?;
            Cond::Range {
                left,
                low,
                high,
                negated,
            }
        } else if op == "in" {
            // Flags: `ct state new`, `ct state { established, related }`.
            match encode(&types, right) {
                Ok(mask) => Cond::Cmp {
                    left: Expr::Bitwise {
                        of: Box::new(left),
                        xor: vec![0; mask.len()],
                        mask: mask.clone(),
                    },
                    op: CmpOp::Ne,
                    right: vec![0; mask.len()],
                },
                Err(_) => opaque(),
            }
        } else {
            match (encode(&types, right), cmp_op(op)) {
                (Ok(right), Some(op)) => Cond::Cmp { left, op, right },
                _ => opaque(),
            }
        };
        out.push(Stmt::Match(cond));
        Ok(())
    }

    /// A prefix or range right-hand side, as an inclusive range.
    fn range(&self, types: &[Ty], right: &Value) -> Option<Result<(Bytes, Bytes), String>> {
        if let Some(prefix) = right.get("prefix") {
            let [ty] = types else { return None };
            let len = prefix.get("len").and_then(Value::as_u64).unwrap_or(0) as usize;
            return Some(
                ty.encode(prefix.get("addr").unwrap_or(&Value::Null))
                    .map(|addr| (host_zeros(&addr, len), host_ones(&addr, len))),
            );
        }
        let [low, high] = right.get("range")?.as_array()?.as_slice() else {
            return None;
        };
        Some(encode(types, low).and_then(|low| Ok((low, encode(types, high)?))))
    }

    /// A set on the right of a match or as a map's data: `"@name"` or `{"set": [...]}`;
    /// `None` when the value is no set. `data`: the map's data types, when a DNAT reads
    /// it.
    fn set_ref(
        &mut self,
        key: &Expr,
        data: Option<&[Ty]>,
        value: Option<&Value>,
        path: &str,
    ) -> Result<Option<SetRef>, RulesError> {
        let key_types = Ty::of(key, self.family);
        match value {
            Some(Value::String(name)) if name.starts_with('@') => {
                let name = &name[1..];
                let usage = self.usage.entry(name.to_owned()).or_default();
                if usage.key.is_none() {
                    usage.key = key_types;
                }
                if usage.data.is_none() {
                    usage.data = data.map(<[Ty]>::to_vec);
                }
                Ok(Some(SetRef::Named(name.to_owned())))
            }
            Some(value) => match value.get("set").and_then(Value::as_array) {
                Some(elements) => {
                    let Some(key_types) = key_types else {
                        return Ok(None);
                    };
                    let mut set = Set::default();
                    for (index, e) in elements.iter().enumerate() {
                        let e = element(&key_types, data, e)
                            .map_err(|m| path_err(format!("{path}.set[{index}]"), m))?;
                        set.push(e);
                    }
                    Ok(Some(SetRef::Inline(Arc::new(set))))
                }
                None => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// `{"dnat": {"addr": A, "port": P}}`; `A` may be `{"map": {"key": K, "data": D}}`
    /// whose data holds the address, or the address and port (`dnat ip addr . port to`).
    fn dnat(&mut self, body: &Value, stmt: &Value, path: &str) -> Result<Stmt, RulesError> {
        let addr_len = self.family.addr_len();
        let addr_ty = Ty::Addr(self.family);
        let port = match body.get("port") {
            None => None,
            Some(Value::Number(_) | Value::String(_)) => match Ty::Port.encode(&body["port"]) {
                Ok(port) => Some(Expr::Const(port)),
                Err(_) => return Ok(Stmt::Opaque(clip(stmt))),
            },
            Some(other) => match self.map_value(other, &[Ty::Port], path)? {
                Some(lookup) => Some(lookup),
                None => return Ok(Stmt::Opaque(clip(stmt))),
            },
        };
        let addr = match body.get("addr") {
            Some(Value::String(text)) => match addr_ty.encode(&Value::String(text.clone())) {
                Ok(addr) => Expr::Const(addr),
                Err(_) => return Ok(Stmt::Opaque(clip(stmt))),
            },
            Some(map @ Value::Object(_)) => {
                // Without a port of its own, the map's data is `addr . port`.
                let with_port = port.is_none() && self.data_has_port(map);
                let types: &[Ty] = if with_port {
                    &[addr_ty, Ty::Port]
                } else {
                    &[addr_ty]
                };
                let Some(lookup) = self.map_value(map, types, &format!("{path}.dnat.addr"))? else {
                    return Ok(Stmt::Opaque(clip(stmt)));
                };
                if with_port {
                    return Ok(Stmt::Dnat {
                        addr: slice(&lookup, 0, addr_len),
                        port: Some(slice(&lookup, padded(addr_len), 2)),
                    });
                }
                lookup
            }
            _ => return Ok(Stmt::Opaque(clip(stmt))),
        };
        Ok(Stmt::Dnat { addr, port })
    }

    /// Whether a `{"map": ...}`'s data are concatenations (an address and a port).
    fn data_has_port(&self, map: &Value) -> bool {
        let data = map.get("map").and_then(|m| m.get("data"));
        match data {
            Some(Value::String(name)) => name
                .strip_prefix('@')
                .and_then(|n| self.declared.get(n))
                .and_then(|(_, data)| data.as_ref())
                .is_some_and(|types| types.len() == 2),
            Some(inline) => inline
                .get("set")
                .and_then(Value::as_array)
                .and_then(|elements| elements.first())
                .and_then(|pair| pair.get(1))
                .is_some_and(|data| data.get("concat").is_some()),
            None => false,
        }
    }

    /// `{"map": {"key": K, "data": D}}` as a lookup whose data has `types`.
    fn map_value(
        &mut self,
        value: &Value,
        types: &[Ty],
        path: &str,
    ) -> Result<Option<Expr>, RulesError> {
        let Some(map) = value.get("map") else {
            return Ok(None);
        };
        let key = self.expr(map.get("key").unwrap_or(&Value::Null));
        Ok(self
            .set_ref(
                &key,
                Some(types),
                map.get("data"),
                &format!("{path}.map.data"),
            )?
            .map(|map| Expr::Lookup {
                key: Box::new(key),
                map,
            }))
    }

    /// An expression that yields a value.
    fn expr(&mut self, value: &Value) -> Expr {
        let Some((kind, body)) = value.as_object().and_then(|o| o.iter().next()) else {
            return Expr::Opaque(clip(value));
        };
        let text = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or_default();
        match kind.as_str() {
            "payload" => match (text("protocol"), text("field")) {
                ("ip" | "ip6", "saddr") => Expr::Field(Field::Saddr),
                ("ip" | "ip6", "daddr") => Expr::Field(Field::Daddr),
                ("ip", "protocol") | ("ip6", "nexthdr") => Expr::Field(Field::L4Proto),
                ("th" | "tcp" | "udp" | "sctp", "dport") => Expr::Field(Field::Dport),
                ("th" | "tcp" | "udp" | "sctp", "sport") => Expr::Field(Field::Sport),
                _ => Expr::Opaque(clip(value)),
            },
            "meta" => match text("key") {
                "l4proto" => Expr::Field(Field::L4Proto),
                "mark" => Expr::Mark,
                _ => Expr::Opaque(clip(value)),
            },
            "ct" => match text("key") {
                "mark" => Expr::CtMark,
                "state" => Expr::CtState,
                _ => Expr::Opaque(clip(value)),
            },
            "fib" if text("result") == "type" => {
                let flags = body.get("flags").and_then(Value::as_array);
                let source = flags.is_some_and(|f| f.iter().any(|f| f.as_str() == Some("saddr")));
                Expr::FibType { source }
            }
            "numgen" => Expr::Numgen {
                modulus: body.get("mod").and_then(Value::as_u64).unwrap_or(0) as u32,
                offset: body.get("offset").and_then(Value::as_u64).unwrap_or(0) as u32,
            },
            "concat" => Expr::Concat(
                body.as_array()
                    .into_iter()
                    .flatten()
                    .map(|part| self.expr(part))
                    .collect(),
            ),
            "&" => match body.as_array().map(Vec::as_slice) {
                Some([of, mask]) => {
                    let of = self.expr(of);
                    match Ty::of(&of, self.family).map(|types| encode(&types, mask)) {
                        Some(Ok(mask)) => Expr::Bitwise {
                            of: Box::new(of),
                            xor: vec![0; mask.len()],
                            mask,
                        },
                        _ => Expr::Opaque(clip(value)),
                    }
                }
                _ => Expr::Opaque(clip(value)),
            },
            _ => Expr::Opaque(clip(value)),
        }
    }
}

fn slice(of: &Expr, offset: usize, len: usize) -> Expr {
    Expr::Slice {
        of: Box::new(of.clone()),
        offset,
        len,
    }
}

fn encode(types: &[Ty], value: &Value) -> Result<Bytes, String> {
    super::types::encode_parts(types, value)
}

fn cmp_op(op: &str) -> Option<CmpOp> {
    Some(match op {
        "==" => CmpOp::Eq,
        "!=" => CmpOp::Ne,
        "<" => CmpOp::Lt,
        ">" => CmpOp::Gt,
        "<=" => CmpOp::Le,
        ">=" => CmpOp::Ge,
        _ => return None,
    })
}

/// A JSON value as short text, for messages.
fn clip(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(120) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
