//! Announcements about kube-proxy's nftables table, decoded as far as observer's parser
//! needs them. A rule announcement carries the whole rule (`NFTA_RULE_EXPRESSIONS`), so
//! a chain's change needs no `nft -j list chain` (which, with nft 1.0.6, fetches every
//! set's elements: about a second on a 5,000-Service table). Of a rule only two shapes
//! matter (see `rules::nft::dispatch`): `numgen random mod N vmap { ... }` (a `numgen`
//! expression whose register a `lookup` of an anonymous map reads into the verdict) and
//! `dnat to ADDR:PORT` (`immediate` values in registers, read by a `nat` expression).
//! The anonymous map's elements arrive as their own announcements before the rule. A
//! named set or map (`service-ips`, ...) is only named here and read again whole.
//!
//! Layouts: include/uapi/linux/netfilter/nf_tables.h. Numbers inside expressions are
//! big-endian (`nla_put_be32`); a numgen map key is a host-endian u32 (a register).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELSET, NFT_MSG_DELSETELEM, NFT_MSG_DESTROYCHAIN,
    NFT_MSG_DESTROYRULE, NFT_MSG_DESTROYSET, NFT_MSG_DESTROYSETELEM, NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFTA_CHAIN_NAME, NFTA_RULE_CHAIN,
    NFTA_SET_NAME, string,
};
use crate::netlink::{self, Attrs};

/// `NFTA_RULE_HANDLE`, `NFTA_RULE_EXPRESSIONS`.
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
/// `NFTA_LIST_ELEM`; `NFTA_EXPR_NAME`, `NFTA_EXPR_DATA`.
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
/// `NFTA_NG_DREG`, `NFTA_NG_MODULUS`, `NFTA_NG_TYPE`, `NFTA_NG_OFFSET`.
const NFTA_NG_DREG: u16 = 1;
const NFTA_NG_MODULUS: u16 = 2;
const NFTA_NG_TYPE: u16 = 3;
const NFTA_NG_OFFSET: u16 = 4;
/// `NFT_NG_RANDOM`.
const NFT_NG_RANDOM: u32 = 1;
/// `NFTA_LOOKUP_SET`, `NFTA_LOOKUP_SREG`, `NFTA_LOOKUP_DREG`.
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_DREG: u16 = 3;
/// `NFT_REG_VERDICT`: a lookup that yields a verdict (a vmap).
const NFT_REG_VERDICT: u32 = 0;
/// `NFTA_IMMEDIATE_DREG`, `NFTA_IMMEDIATE_DATA`; `NFTA_DATA_VALUE`, `NFTA_DATA_VERDICT`.
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
/// `NFTA_VERDICT_CODE`, `NFTA_VERDICT_CHAIN`; `NFT_JUMP`, `NFT_GOTO`.
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
/// `NFTA_NAT_TYPE`, `NFTA_NAT_FAMILY`, `NFTA_NAT_REG_ADDR_MIN`, `NFTA_NAT_REG_PROTO_MIN`;
/// `NFT_NAT_DNAT`.
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFT_NAT_DNAT: u32 = 1;
/// `NFTA_SET_ELEM_LIST_ELEMENTS`; `NFTA_SET_ELEM_KEY`, `NFTA_SET_ELEM_DATA`,
/// `NFTA_SET_ELEM_FLAGS`; `NFT_SET_ELEM_INTERVAL_END`.
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;
/// `NFPROTO_IPV4`, `NFPROTO_IPV6` as a nat expression's family.
const NAT_IPV4: u32 = 2;
const NAT_IPV6: u32 = 10;

/// A jump or goto to a chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftVerdict {
    pub goto: bool,
    pub chain: String,
}

/// The parts of a rule the parser uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NftExpr {
    /// `numgen random mod MODULUS offset OFFSET vmap @SET` (an anonymous map).
    NumgenVmap {
        modulus: u32,
        offset: u32,
        set: String,
    },
    /// `dnat to ADDR:PORT`.
    Dnat { addr: IpAddr, port: u16 },
}

/// One announcement about kube-proxy's nftables table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NftEvent {
    /// A rule added to `chain`.
    Rule {
        chain: String,
        handle: u64,
        exprs: Vec<NftExpr>,
    },
    /// A rule removed from `chain`.
    RuleGone { chain: String, handle: u64 },
    /// A chain deleted, with whatever rules it still had.
    ChainGone { chain: String },
    /// Elements added to an anonymous map: numgen number, and where it leads (`None`:
    /// a verdict that is no jump or goto).
    AnonElements {
        set: String,
        elements: Vec<(u32, Option<NftVerdict>)>,
    },
    /// An anonymous set or map deleted (with its rule).
    AnonGone { set: String },
    /// A named set or map (`service-ips`, `cluster-ips`, ...) changed.
    Set { name: String },
}

/// What one message says; `Ok(None)` when it changes nothing the parser reads, `Err`
/// when it cannot be read (a full read then).
pub(super) fn event(message: u16, attributes: &[u8]) -> Result<Option<NftEvent>, ()> {
    Ok(Some(match message {
        NFT_MSG_NEWCHAIN => return Ok(None),
        NFT_MSG_DELCHAIN | NFT_MSG_DESTROYCHAIN => NftEvent::ChainGone {
            chain: string(attributes, NFTA_CHAIN_NAME)?,
        },
        NFT_MSG_NEWRULE => NftEvent::Rule {
            chain: string(attributes, NFTA_RULE_CHAIN)?,
            handle: be64(find(attributes, NFTA_RULE_HANDLE)?)?,
            exprs: match optional(attributes, NFTA_RULE_EXPRESSIONS)? {
                Some(list) => expressions(list)?,
                None => Vec::new(),
            },
        },
        NFT_MSG_DELRULE | NFT_MSG_DESTROYRULE => NftEvent::RuleGone {
            chain: string(attributes, NFTA_RULE_CHAIN)?,
            handle: be64(find(attributes, NFTA_RULE_HANDLE)?)?,
        },
        NFT_MSG_NEWSET | NFT_MSG_DELSET | NFT_MSG_DESTROYSET => {
            let set = string(attributes, NFTA_SET_NAME)?;
            match (set.starts_with("__"), message) {
                // An anonymous set is made with its rule; its elements follow.
                (true, NFT_MSG_NEWSET) => return Ok(None),
                (true, _) => NftEvent::AnonGone { set },
                (false, _) => NftEvent::Set { name: set },
            }
        }
        NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM | NFT_MSG_DESTROYSETELEM => {
            let set = string(attributes, NFTA_SET_NAME)?;
            match (set.starts_with("__"), message) {
                (true, NFT_MSG_NEWSETELEM) => NftEvent::AnonElements {
                    elements: elements(find(attributes, NFTA_SET_ELEM_LIST_ELEMENTS)?)?,
                    set,
                },
                // Elements leave an anonymous set only with the set (or never).
                (true, _) => return Err(()),
                (false, _) => NftEvent::Set { name: set },
            }
        }
        // Tables, objects, flowtables: not read chain by chain.
        _ => return Err(()),
    }))
}

/// A register's content as `immediate` or `numgen` left it.
enum Register<'a> {
    Value(&'a [u8]),
    Numgen { modulus: u32, offset: u32 },
}

/// The registers a rule's expressions loaded so far, last written last.
type Registers<'a> = Vec<(u32, Register<'a>)>;

/// What register `number` holds now.
fn register<'r, 'a>(registers: &'r Registers<'a>, number: u32) -> Option<&'r Register<'a>> {
    registers
        .iter()
        .rev()
        .find(|(n, _)| *n == number)
        .map(|(_, held)| held)
}

/// The expressions of one rule that the parser uses.
fn expressions(list: &[u8]) -> Result<Vec<NftExpr>, ()> {
    let mut registers: Registers<'_> = Vec::new();
    let mut exprs = Vec::new();
    for attr in Attrs(list) {
        let (kind, element) = attr.map_err(drop)?;
        if kind != NFTA_LIST_ELEM {
            return Err(());
        }
        let name = string(element, NFTA_EXPR_NAME)?;
        let data = optional(element, NFTA_EXPR_DATA)?.unwrap_or_default();
        match name.as_str() {
            "numgen" => registers.push(numgen(data)?),
            "immediate" => registers.extend(immediate(data)?),
            "lookup" => exprs.extend(numgen_vmap(data, &registers)?),
            "nat" => exprs.extend(dnat(data, &registers)?),
            _ => {}
        }
    }
    Ok(exprs)
}

/// `numgen random mod M offset O` into its register.
fn numgen(data: &[u8]) -> Result<(u32, Register<'_>), ()> {
    let modulus = be32(find(data, NFTA_NG_MODULUS)?)?;
    let offset = optional(data, NFTA_NG_OFFSET)?.map_or(Ok(0), be32)?;
    if be32(find(data, NFTA_NG_TYPE)?)? != NFT_NG_RANDOM {
        // `numgen inc`: not kube-proxy's; the full read says what it is.
        return Err(());
    }
    let dreg = be32(find(data, NFTA_NG_DREG)?)?;
    Ok((dreg, Register::Numgen { modulus, offset }))
}

/// An immediate value into its register.
fn immediate(data: &[u8]) -> Result<Option<(u32, Register<'_>)>, ()> {
    let dreg = be32(find(data, NFTA_IMMEDIATE_DREG)?)?;
    // A verdict (`jump`, `goto`) goes to the verdict register: not kept.
    let value = optional(find(data, NFTA_IMMEDIATE_DATA)?, NFTA_DATA_VALUE)?;
    Ok(value.map(|value| (dreg, Register::Value(value))))
}

/// A verdict lookup keyed by a numgen register: kube-proxy's random pick of an endpoint.
fn numgen_vmap(data: &[u8], registers: &Registers<'_>) -> Result<Option<NftExpr>, ()> {
    let sreg = be32(find(data, NFTA_LOOKUP_SREG)?)?;
    let dreg = optional(data, NFTA_LOOKUP_DREG)?.map(be32).transpose()?;
    let from_numgen = match register(registers, sreg) {
        Some(Register::Numgen { modulus, offset }) => Some((*modulus, *offset)),
        _ => None,
    };
    let (Some(NFT_REG_VERDICT), Some((modulus, offset))) = (dreg, from_numgen) else {
        return Ok(None);
    };
    let set = string(data, NFTA_LOOKUP_SET)?;
    if !set.starts_with("__") {
        // A vmap over a named map: the parser wants it inline.
        return Err(());
    }
    Ok(Some(NftExpr::NumgenVmap {
        modulus,
        offset,
        set,
    }))
}

/// `dnat to ADDR:PORT` from immediate values; other NAT is not kept.
fn dnat(data: &[u8], registers: &Registers<'_>) -> Result<Option<NftExpr>, ()> {
    if be32(find(data, NFTA_NAT_TYPE)?)? != NFT_NAT_DNAT {
        return Ok(None);
    }
    let value = |attribute: u16| -> Result<&[u8], ()> {
        match register(registers, be32(find(data, attribute)?)?) {
            Some(Register::Value(value)) => Ok(value),
            _ => Err(()),
        }
    };
    let addr = match (
        be32(find(data, NFTA_NAT_FAMILY)?)?,
        value(NFTA_NAT_REG_ADDR_MIN)?,
    ) {
        (NAT_IPV4, &[a, b, c, d]) => IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        (NAT_IPV6, bytes) if bytes.len() == 16 => {
            let octets: [u8; 16] = bytes.try_into().map_err(|_| ())?;
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return Err(()),
    };
    let port = match value(NFTA_NAT_REG_PROTO_MIN)? {
        &[high, low] => u16::from_be_bytes([high, low]),
        _ => return Err(()),
    };
    Ok(Some(NftExpr::Dnat { addr, port }))
}

/// An anonymous map's elements: a 4-byte numgen number each, and its verdict.
fn elements(list: &[u8]) -> Result<Vec<(u32, Option<NftVerdict>)>, ()> {
    let mut out = Vec::new();
    for attr in Attrs(list) {
        let (kind, element) = attr.map_err(drop)?;
        if kind != NFTA_LIST_ELEM {
            return Err(());
        }
        let flags = optional(element, NFTA_SET_ELEM_FLAGS)?.map_or(Ok(0), be32)?;
        if flags & NFT_SET_ELEM_INTERVAL_END != 0 {
            // Ranges: not how kube-proxy writes its maps.
            return Err(());
        }
        let key: [u8; 4] = find(find(element, NFTA_SET_ELEM_KEY)?, NFTA_DATA_VALUE)?
            .try_into()
            .map_err(|_| ())?;
        let data = optional(element, NFTA_SET_ELEM_DATA)?;
        let verdict = match data
            .map(|data| optional(data, NFTA_DATA_VERDICT))
            .transpose()?
        {
            Some(Some(verdict)) => {
                let code = be32(find(verdict, NFTA_VERDICT_CODE)?)? as i32;
                match code {
                    NFT_JUMP | NFT_GOTO => Some(NftVerdict {
                        goto: code == NFT_GOTO,
                        chain: string(verdict, NFTA_VERDICT_CHAIN)?,
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        out.push((u32::from_ne_bytes(key), verdict));
    }
    Ok(out)
}

/// The value of the first attribute of type `wanted`, which must be there.
fn find(block: &[u8], wanted: u16) -> Result<&[u8], ()> {
    optional(block, wanted)?.ok_or(())
}

/// The value of the first attribute of type `wanted`, if there is one.
fn optional(block: &[u8], wanted: u16) -> Result<Option<&[u8]>, ()> {
    netlink::find(block, wanted).map_err(drop)
}

fn be32(value: &[u8]) -> Result<u32, ()> {
    value.try_into().map(u32::from_be_bytes).map_err(|_| ())
}

fn be64(value: &[u8]) -> Result<u64, ()> {
    value.try_into().map(u64::from_be_bytes).map_err(|_| ())
}
