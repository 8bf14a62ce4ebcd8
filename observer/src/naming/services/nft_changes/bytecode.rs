//! A rule's expressions as nf_tables announces them (`NFTA_RULE_EXPRESSIONS`), into the
//! program's statements, by following its registers: loads (`payload`, `meta`, `ct`,
//! `fib`, `numgen`, `immediate`, a map `lookup` with a destination) write a value into
//! registers, and `cmp`, `range`, `bitwise`, `lookup`, `nat` and `ct set` read them.
//! Registers are counted in 4-byte slots: `NFT_REG_1`..`NFT_REG_4` are 16 bytes each
//! (slots 0, 4, 8, 12), `NFT_REG32_00`.. (8..) one slot each; a concatenation is values
//! in consecutive slots, each padded to 4 bytes.
//!
//! Layouts: include/uapi/linux/netfilter/nf_tables.h. Numbers in attributes are
//! big-endian; data (`NFTA_DATA_VALUE`) is as the registers hold it.

use crate::naming::services::rules::program::{
    Bytes, CmpOp, Cond, Expr, Family, Field, Rule, SetRef, Stmt, Verdict,
};
use crate::netlink::Attrs;

use super::nftables::{be32, find, optional, string, verdict};

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;

/// One value in a register slot: which value, and which 4-byte chunk of it; `order`
/// is when it was written (a concatenation's parts are written one after another).
#[derive(Clone)]
struct Slot {
    value: Expr,
    chunk: usize,
    order: usize,
}

/// The registers of one rule as its expressions fill them.
struct Registers {
    slots: Vec<Option<Slot>>,
    writes: usize,
    family: Family,
}

/// Slots a value of unknown width (a map lookup's data) is assumed to take.
const UNKNOWN_WIDTH_SLOTS: usize = 8;

impl Registers {
    fn new(family: Family) -> Registers {
        Registers {
            slots: vec![None; 24],
            writes: 0,
            family,
        }
    }

    fn width(&self, value: &Expr) -> Option<usize> {
        value.width(self.family)
    }

    /// The first slot of register `number`; `None` for the verdict register.
    fn slot(number: u32) -> Option<usize> {
        match number {
            1..=4 => Some((number as usize - 1) * 4),
            8..=23 => Some(number as usize - 8),
            _ => None,
        }
    }

    fn write(&mut self, register: u32, value: Expr) -> Result<(), ()> {
        let start = Registers::slot(register).ok_or(())?;
        let chunks = self
            .width(&value)
            .map_or(UNKNOWN_WIDTH_SLOTS, |w| w.div_ceil(4).max(1));
        self.writes += 1;
        for chunk in 0..chunks {
            if let Some(slot) = self.slots.get_mut(start + chunk) {
                *slot = Some(Slot {
                    value: value.clone(),
                    chunk,
                    order: self.writes,
                });
            }
        }
        Ok(())
    }

    /// `len` bytes from `register`: one value, part of one, or a concatenation.
    fn read(&self, register: u32, len: usize) -> Result<Expr, ()> {
        let start = Registers::slot(register).ok_or(())?;
        let first = self.slots.get(start).cloned().flatten().ok_or(())?;
        if first.chunk > 0 || self.width(&first.value).is_none() {
            return Ok(Expr::Slice {
                of: Box::new(first.value),
                offset: first.chunk * 4,
                len,
            });
        }
        let mut parts = Vec::new();
        let mut at = start;
        let mut read = 0;
        let mut last_order = 0;
        while read < len {
            let slot = self.slots.get(at).cloned().flatten().ok_or(())?;
            if slot.chunk != 0 || slot.order < last_order {
                return Err(());
            }
            let width = self.width(&slot.value).unwrap_or(4);
            read += width.div_ceil(4) * 4;
            at += width.div_ceil(4).max(1);
            last_order = slot.order;
            parts.push(slot.value);
        }
        Ok(match parts.len() {
            1 => parts.pop().unwrap_or(Expr::Opaque(String::new())),
            _ => Expr::Concat(parts),
        })
    }

    /// The key a lookup reads from `register`: the values written there and in the
    /// slots after it one after another (a concatenation), or the one value.
    fn key(&self, register: u32) -> Result<Expr, ()> {
        let start = Registers::slot(register).ok_or(())?;
        let mut parts = Vec::new();
        let mut at = start;
        let mut last_order = 0;
        while let Some(Some(slot)) = self.slots.get(at) {
            if slot.chunk != 0 || slot.order <= last_order {
                break;
            }
            let chunks = self.width(&slot.value).map_or(1, |w| w.div_ceil(4).max(1));
            last_order = slot.order;
            parts.push(slot.value.clone());
            at += chunks;
        }
        match parts.len() {
            0 => Err(()),
            1 => Ok(parts.pop().unwrap_or(Expr::Opaque(String::new()))),
            _ => Ok(Expr::Concat(parts)),
        }
    }
}

/// The statements of one rule; `Err` when the expressions cannot be read at all.
pub(super) fn rule(list: &[u8], family: Family, comment: Option<String>) -> Result<Rule, ()> {
    let mut registers = Registers::new(family);
    let mut stmts = Vec::new();
    for attr in Attrs(list) {
        let (kind, element) = attr.map_err(drop)?;
        if kind != NFTA_LIST_ELEM {
            return Err(());
        }
        let name = string(element, NFTA_EXPR_NAME)?;
        let data = optional(element, NFTA_EXPR_DATA)?.unwrap_or_default();
        expression(&name, data, family, &mut registers, &mut stmts)?;
    }
    Ok(Rule {
        stmts,
        comment,
        handle: None,
        origin: "an announced rule".to_owned(),
    })
}

fn expression(
    name: &str,
    data: &[u8],
    family: Family,
    registers: &mut Registers,
    stmts: &mut Vec<Stmt>,
) -> Result<(), ()> {
    let attr = |wanted: u16| -> Result<u32, ()> { be32(find(data, wanted)?) };
    let opaque = || Stmt::Opaque(format!("an nf_tables `{name}` expression"));
    match name {
        // NFTA_PAYLOAD_DREG 1, BASE 2, OFFSET 3, LEN 4; with SREG 5 it writes.
        "payload" => {
            if optional(data, 5)?.is_some() {
                stmts.push(opaque());
                return Ok(());
            }
            let field = payload_field(family, attr(2)?, attr(3)?, attr(4)?);
            let value =
                field.map_or_else(|| Expr::Opaque("a packet field".to_owned()), Expr::Field);
            registers.write(attr(1)?, value)?;
        }
        // NFTA_META_DREG 1, KEY 2, SREG 3. NFT_META_MARK 3, NFT_META_L4PROTO 16.
        "meta" => match (optional(data, 1)?, attr(2)?) {
            (Some(_), 16) => registers.write(attr(1)?, Expr::Field(Field::L4Proto))?,
            (Some(_), 3) => registers.write(attr(1)?, Expr::Mark)?,
            (Some(_), key) => registers.write(attr(1)?, Expr::Opaque(format!("meta key {key}")))?,
            // `meta mark set ...`: masquerade marks.
            (None, 3) => stmts.push(Stmt::Inert),
            (None, _) => stmts.push(opaque()),
        },
        // NFTA_CT_DREG 1, KEY 2, SREG 4. NFT_CT_STATE 0, NFT_CT_MARK 3.
        "ct" => match (optional(data, 1)?, attr(2)?) {
            (Some(_), 0) => registers.write(attr(1)?, Expr::CtState)?,
            (Some(_), 3) => registers.write(attr(1)?, Expr::CtMark)?,
            (Some(_), key) => registers.write(attr(1)?, Expr::Opaque(format!("ct key {key}")))?,
            (None, 3) => stmts.push(Stmt::SetCtMark(registers.read(attr(4)?, 4)?)),
            (None, _) => stmts.push(opaque()),
        },
        // NFTA_FIB_DREG 1, RESULT 2 (NFT_FIB_RESULT_ADDRTYPE 3), FLAGS 3 (SADDR 1).
        "fib" => {
            let value = match attr(2)? {
                3 => Expr::FibType {
                    source: attr(3)? & 1 != 0,
                },
                _ => Expr::Opaque("a fib result".to_owned()),
            };
            registers.write(attr(1)?, value)?;
        }
        // NFTA_NG_DREG 1, MODULUS 2, TYPE 3, OFFSET 4: random and inc both spread
        // connections evenly.
        "numgen" => {
            let modulus = attr(2)?;
            let offset = optional(data, 4)?.map_or(Ok(0), be32)?;
            registers.write(attr(1)?, Expr::Numgen { modulus, offset })?;
        }
        // NFTA_IMMEDIATE_DREG 1, DATA 2.
        "immediate" => {
            let value = find(data, 2)?;
            match (
                optional(value, NFTA_DATA_VALUE)?,
                optional(value, NFTA_DATA_VERDICT)?,
            ) {
                (Some(bytes), _) => registers.write(attr(1)?, Expr::Const(bytes.to_vec()))?,
                (None, Some(v)) => stmts.push(match verdict(v)? {
                    Some(v) => Stmt::Verdict(v),
                    None => opaque(),
                }),
                (None, None) => return Err(()),
            }
        }
        // NFTA_CMP_SREG 1, OP 2, DATA 3.
        "cmp" => {
            let right = find(find(data, 3)?, NFTA_DATA_VALUE)?.to_vec();
            let op = match attr(2)? {
                0 => CmpOp::Eq,
                1 => CmpOp::Ne,
                2 => CmpOp::Lt,
                3 => CmpOp::Le,
                4 => CmpOp::Gt,
                5 => CmpOp::Ge,
                _ => return Err(()),
            };
            let left = registers.read(attr(1)?, right.len())?;
            stmts.push(Stmt::Match(Cond::Cmp { left, op, right }));
        }
        // NFTA_RANGE_SREG 1, OP 2, FROM_DATA 3, TO_DATA 4.
        "range" => {
            let low = find(find(data, 3)?, NFTA_DATA_VALUE)?.to_vec();
            let high = find(find(data, 4)?, NFTA_DATA_VALUE)?.to_vec();
            let left = registers.read(attr(1)?, low.len())?;
            stmts.push(Stmt::Match(Cond::Range {
                left,
                low,
                high,
                negated: attr(2)? == 1,
            }));
        }
        // NFTA_BITWISE_SREG 1, DREG 2, LEN 3, MASK 4, XOR 5, OP 6 (0: mask and xor).
        "bitwise" => {
            if optional(data, 6)?.map_or(Ok(0), be32)? != 0 {
                registers.write(attr(2)?, Expr::Opaque("a shifted value".to_owned()))?;
                return Ok(());
            }
            let len = attr(3)? as usize;
            let mask = find(find(data, 4)?, NFTA_DATA_VALUE)?.to_vec();
            let xor = find(find(data, 5)?, NFTA_DATA_VALUE)?.to_vec();
            let of = registers.read(attr(1)?, len)?;
            registers.write(
                attr(2)?,
                Expr::Bitwise {
                    of: Box::new(of),
                    mask,
                    xor,
                },
            )?;
        }
        // NFTA_LOOKUP_SET 1, SREG 2, DREG 3, FLAGS 5 (NFT_LOOKUP_F_INV 1).
        "lookup" => {
            let map = SetRef::Named(string(data, 1)?);
            let key = registers.key(attr(2)?)?;
            match optional(data, 3)?.map(be32).transpose()? {
                Some(0) => stmts.push(Stmt::Vmap { key, map }),
                Some(dreg) => registers.write(
                    dreg,
                    Expr::Lookup {
                        key: Box::new(key),
                        map,
                    },
                )?,
                None => stmts.push(Stmt::Match(Cond::InSet {
                    left: key,
                    set: map,
                    negated: optional(data, 5)?.map_or(Ok(0), be32)? & 1 != 0,
                })),
            }
        }
        "nat" => stmts.push(nat(data, family, registers)?),
        "masq" => stmts.push(Stmt::Verdict(Verdict::Accept)),
        "reject" => stmts.push(Stmt::Verdict(Verdict::Reject)),
        "counter" | "log" | "dynset" | "objref" | "notrack" | "dup" => stmts.push(Stmt::Inert),
        "limit" | "quota" => stmts.push(Stmt::Match(Cond::Opaque(format!("a `{name}`")))),
        _ => stmts.push(opaque()),
    }
    Ok(())
}

/// The packet field at `offset`/`len` of a header (`NFT_PAYLOAD_NETWORK_HEADER` 1,
/// `NFT_PAYLOAD_TRANSPORT_HEADER` 2).
fn payload_field(family: Family, base: u32, offset: u32, len: u32) -> Option<Field> {
    Some(match (base, family, offset, len) {
        (1, Family::V4, 12, 4) | (1, Family::V6, 8, 16) => Field::Saddr,
        (1, Family::V4, 16, 4) | (1, Family::V6, 24, 16) => Field::Daddr,
        (1, Family::V4, 9, 1) | (1, Family::V6, 6, 1) => Field::L4Proto,
        (2, _, 0, 2) => Field::Sport,
        (2, _, 2, 2) => Field::Dport,
        _ => return None,
    })
}

/// `NFTA_NAT_TYPE` 1 (`NFT_NAT_DNAT` 1), `FAMILY` 2, `REG_ADDR_MIN` 3,
/// `REG_PROTO_MIN` 5.
fn nat(data: &[u8], family: Family, registers: &Registers) -> Result<Stmt, ()> {
    if be32(find(data, 1)?)? != 1 {
        // SNAT ends the nat chain without a DNAT.
        return Ok(Stmt::Verdict(Verdict::Accept));
    }
    let Some(addr_register) = optional(data, 3)?.map(be32).transpose()? else {
        return Ok(Stmt::Opaque("a dnat to a port alone".to_owned()));
    };
    let addr = registers.read(addr_register, family.addr_len())?;
    let port = match optional(data, 5)?.map(be32).transpose()? {
        Some(register) => Some(registers.read(register, 2)?),
        None => None,
    };
    Ok(Stmt::Dnat { addr, port })
}

/// Bytes of a set element's key or data value.
pub(super) fn value(block: &[u8]) -> Result<Bytes, ()> {
    Ok(find(block, NFTA_DATA_VALUE)?.to_vec())
}
