//! What a value or a match comes to for a packet, given what is known of it: its
//! destination, protocol and port, the `ct mark` rules set on its way; its client only
//! when checking a guard against a connection.

use std::net::IpAddr;

use super::{Daddr, Packet, set_name};
use crate::naming::services::rules::program::{
    Bytes, CT_STATE_NEW, CmpOp, Cond, Data, Expr, Field, Program, RTN_LOCAL, Set, padded,
};

/// How a match comes out for a packet.
pub(super) enum Decision {
    /// With these probabilities (iptables' `--probability`, `numgen` compared).
    Known(Vec<(f64, bool)>),
    /// Depends on the client: both ways, guarded.
    Guard,
    /// A lookup of the client in a set the packets fill (session affinity): false for a
    /// new client; the set's timeout.
    Affinity(Option<u64>),
    Unfollowed(String),
}

/// What a value is, given the packet.
pub(super) struct Ctx<'p> {
    pub program: &'p Program,
    pub packet: Packet,
    pub saddr: Option<IpAddr>,
    pub saddr_local: Option<bool>,
    pub ct_mark: Bytes,
}

/// The values an expression can take, each with its probability; `None`: a lookup
/// that found nothing.
pub(super) type Values = Vec<(f64, Option<Bytes>)>;

/// Why a value is not known before a connection (its client), or cannot be computed.
enum Unknown {
    Client,
    /// An expression observer does not model, by its text.
    Opaque(String),
    Unfollowed(String),
}

impl From<Unknown> for String {
    fn from(unknown: Unknown) -> String {
        match unknown {
            Unknown::Client => "a value only the connection's client tells".to_owned(),
            Unknown::Opaque(text) | Unknown::Unfollowed(text) => text,
        }
    }
}

impl Ctx<'_> {
    pub(super) fn values(&self, expr: &Expr) -> Result<Values, String> {
        self.value(expr).map_err(String::from)
    }

    fn value(&self, expr: &Expr) -> Result<Values, Unknown> {
        let one = |bytes: Bytes| Ok(vec![(1.0, Some(bytes))]);
        match expr {
            Expr::Field(Field::Daddr) => match self.packet.daddr {
                Daddr::Addr(ip) => one(octets(ip)),
                Daddr::NodeLocal => Err(Unknown::Client),
            },
            Expr::Field(Field::Saddr) => match self.saddr {
                Some(ip) => one(octets(ip)),
                None => Err(Unknown::Client),
            },
            Expr::Field(Field::L4Proto) => one(vec![self.packet.proto]),
            Expr::Field(Field::Dport) => one(self.packet.dport.to_be_bytes().to_vec()),
            Expr::Field(Field::Sport) => Err(Unknown::Client),
            Expr::CtMark => one(self.ct_mark.clone()),
            Expr::Mark => one(vec![0; 4]),
            Expr::CtState => one(CT_STATE_NEW.to_ne_bytes().to_vec()),
            Expr::FibType { source: false } => match self.packet.daddr {
                Daddr::NodeLocal => one(RTN_LOCAL.to_ne_bytes().to_vec()),
                // RTN_UNICAST: a Service address is no address of the node.
                Daddr::Addr(_) => one(1u32.to_ne_bytes().to_vec()),
            },
            Expr::FibType { source: true } => match self.saddr_local {
                Some(true) => one(RTN_LOCAL.to_ne_bytes().to_vec()),
                Some(false) => one(1u32.to_ne_bytes().to_vec()),
                None => Err(Unknown::Client),
            },
            Expr::Numgen { modulus, offset } => {
                if *modulus == 0 {
                    return Err(Unknown::Unfollowed("numgen mod 0".to_owned()));
                }
                let p = 1.0 / f64::from(*modulus);
                Ok((0..*modulus)
                    .map(|n| (p, Some(offset.wrapping_add(n).to_ne_bytes().to_vec())))
                    .collect())
            }
            Expr::Const(bytes) => one(bytes.clone()),
            Expr::Concat(parts) => {
                let mut out: Values = vec![(1.0, Some(Vec::new()))];
                for part in parts {
                    let values = self.value(part)?;
                    out = out
                        .iter()
                        .flat_map(|(p, prefix)| {
                            values.iter().map(move |(q, value)| {
                                let joined = prefix.as_ref().zip(value.as_ref()).map(|(a, b)| {
                                    let mut joined = a.clone();
                                    joined.extend_from_slice(b);
                                    joined.resize(a.len() + padded(b.len()), 0);
                                    joined
                                });
                                (p * q, joined)
                            })
                        })
                        .collect();
                }
                Ok(out)
            }
            Expr::Lookup { key, map } => {
                let set = self.program.set(map).ok_or_else(|| {
                    Unknown::Unfollowed(format!("a map {}, which does not exist", set_name(map)))
                })?;
                Ok(self
                    .value(key)?
                    .into_iter()
                    .map(|(p, key)| {
                        let data = key.and_then(|key| match set.find(&key)?.data.as_ref()? {
                            Data::Value(value) => Some(value.clone()),
                            Data::Verdict(_) => None,
                        });
                        (p, data)
                    })
                    .collect())
            }
            Expr::Slice { of, offset, len } => Ok(self
                .value(of)?
                .into_iter()
                .map(|(p, value)| {
                    (
                        p,
                        value.and_then(|v| v.get(*offset..offset + len).map(<[u8]>::to_vec)),
                    )
                })
                .collect()),
            Expr::Bitwise { of, mask, xor } => Ok(self
                .value(of)?
                .into_iter()
                .map(|(p, value)| {
                    let masked = value.map(|v| {
                        v.iter()
                            .enumerate()
                            .map(|(i, b)| {
                                (b & mask.get(i).copied().unwrap_or(0))
                                    ^ xor.get(i).copied().unwrap_or(0)
                            })
                            .collect()
                    });
                    (p, masked)
                })
                .collect()),
            Expr::Opaque(text) => Err(Unknown::Opaque(text.clone())),
        }
    }

    pub(super) fn decide(&self, cond: &Cond) -> Decision {
        let test = |left: &Expr, test: &dyn Fn(&[u8]) -> bool| match self.value(left) {
            Ok(values) => Decision::Known(merge(
                values
                    .into_iter()
                    .map(|(p, value)| (p, value.is_some_and(|v| test(&v)))),
            )),
            Err(Unknown::Client | Unknown::Opaque(_)) => Decision::Guard,
            Err(Unknown::Unfollowed(why)) => Decision::Unfollowed(why),
        };
        match cond {
            Cond::Cmp { left, op, right } => {
                // A node address is none of the addresses the rules name exactly.
                if self.packet.daddr == Daddr::NodeLocal
                    && *left == Expr::Field(Field::Daddr)
                    && matches!(op, CmpOp::Eq | CmpOp::Ne)
                {
                    return Decision::Known(vec![(1.0, *op == CmpOp::Ne)]);
                }
                test(left, &|value| compare(value, *op, right))
            }
            Cond::Range {
                left,
                low,
                high,
                negated,
            } => test(left, &|value| {
                (low.as_slice() <= value && value <= high.as_slice()) != *negated
            }),
            Cond::InSet { left, set, negated } => {
                let Some(set) = self.program.set(set) else {
                    return Decision::Unfollowed(format!(
                        "a set {}, which does not exist",
                        set_name(set)
                    ));
                };
                if set.dynamic {
                    return Decision::Affinity(set.timeout);
                }
                test(left, &|value| in_set(set, value) != *negated)
            }
            Cond::Probability(p) => Decision::Known(merge([(*p, true), (1.0 - p, false)])),
            Cond::Recent { seconds } => Decision::Affinity(*seconds),
            Cond::Opaque(_) => Decision::Guard,
        }
    }
}

fn in_set(set: &Set, value: &[u8]) -> bool {
    set.find(value).is_some()
}

/// Adds up the probabilities of the same outcome; drops impossible ones.
fn merge(outcomes: impl IntoIterator<Item = (f64, bool)>) -> Vec<(f64, bool)> {
    let (mut yes, mut no) = (0.0, 0.0);
    for (p, holds) in outcomes {
        if holds {
            yes += p;
        } else {
            no += p;
        }
    }
    [(yes, true), (no, false)]
        .into_iter()
        .filter(|(p, _)| *p > 0.0)
        .collect()
}

fn compare(value: &[u8], op: CmpOp, right: &[u8]) -> bool {
    let ordering = value.cmp(right);
    match op {
        CmpOp::Eq => ordering.is_eq(),
        CmpOp::Ne => ordering.is_ne(),
        CmpOp::Lt => ordering.is_lt(),
        CmpOp::Gt => ordering.is_gt(),
        CmpOp::Le => ordering.is_le(),
        CmpOp::Ge => ordering.is_ge(),
    }
}

pub fn octets(ip: IpAddr) -> Bytes {
    match ip {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    }
}
