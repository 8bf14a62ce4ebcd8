//! `dnat`: the (address, port) pairs a DNAT statement can take, each a branch ending
//! in that destination (or in the next rule, where a map lookup misses).

use std::net::{IpAddr, SocketAddr};

use super::super::{Bytes, Expr};
use super::values::Ctx;
use super::{Branch, Target, Walk, end, next_rule, note_comment};

pub(super) fn dnat(
    ctx: &Ctx<'_>,
    comment: Option<&str>,
    addr: &Expr,
    port: Option<&Expr>,
    walk: Walk,
    walks: &mut Vec<Walk>,
    ended: &mut Vec<Branch>,
) {
    let pairs = match dnat_values(ctx, addr, port) {
        Ok(pairs) => pairs,
        Err(why) => return end(walk, Target::Unfollowed(why), ended),
    };
    for (probability, addr, port) in &pairs {
        {
            let mut fork = walk.clone();
            fork.branch.probability *= probability;
            let (Some(addr), Some(port)) = (addr, port) else {
                // A map without an element for the key: the rule ends, the next runs.
                next_rule(fork, walks);
                continue;
            };
            note_comment(&mut fork, comment);
            let target = match socket(addr, port) {
                Some(to) => Target::Dnat(to),
                None => Target::Unfollowed(format!(
                    "a dnat to {} bytes of address and {} of port",
                    addr.len(),
                    port.len()
                )),
            };
            end(fork, target, ended);
        }
    }
}

/// One (address, port) a DNAT can take, with its probability; `None`: a lookup missed.
type DnatValue = (f64, Option<Bytes>, Option<Bytes>);

/// The (address, port) pairs a DNAT can take. Both read from one map lookup (`dnat ip
/// addr . port to ... map`) come from one lookup: one number drawn, not two.
fn dnat_values(ctx: &Ctx<'_>, addr: &Expr, port: Option<&Expr>) -> Result<Vec<DnatValue>, String> {
    if let (
        Expr::Slice {
            of: addr_of,
            offset: addr_at,
            len: addr_len,
        },
        Some(Expr::Slice {
            of: port_of,
            offset: port_at,
            len: port_len,
        }),
    ) = (addr, port)
        && addr_of == port_of
    {
        let cut = |value: &Option<Bytes>, at: usize, len: usize| {
            value
                .as_ref()
                .and_then(|v| v.get(at..at + len).map(<[u8]>::to_vec))
        };
        return Ok(ctx
            .values(addr_of)?
            .into_iter()
            .map(|(p, value)| {
                (
                    p,
                    cut(&value, *addr_at, *addr_len),
                    cut(&value, *port_at, *port_len),
                )
            })
            .collect());
    }
    let addrs = ctx.values(addr)?;
    // `dnat to ADDR` without a port keeps the port dialed.
    let ports = match port {
        Some(port) => ctx.values(port)?,
        None => vec![(1.0, Some(ctx.packet.dport.to_be_bytes().to_vec()))],
    };
    Ok(addrs
        .iter()
        .flat_map(|(p, a)| {
            ports
                .iter()
                .map(move |(q, b)| (p * q, a.clone(), b.clone()))
        })
        .collect())
}

/// An address (4 or 16 bytes) and a port (its first 2 bytes).
fn socket(addr: &[u8], port: &[u8]) -> Option<SocketAddr> {
    let ip = match addr.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(addr).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(addr).ok()?),
        _ => return None,
    };
    let port = u16::from_be_bytes(port.get(..2)?.try_into().ok()?);
    Some(SocketAddr::new(ip, port))
}
