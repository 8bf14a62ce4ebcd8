//! Announcements about kube-proxy's nftables table, decoded into what the rules'
//! program needs. A rule announcement carries the whole rule (`NFTA_RULE_EXPRESSIONS`),
//! decoded expression by expression ([`bytecode`](super::bytecode)), so a chain's change
//! needs no `nft -j list chain` (which, with nft 1.0.6, fetches every set's elements:
//! about a second on a 5,000-Service table). An anonymous set's or map's elements
//! arrive as their own announcements before its rule. A named set or map
//! (`service-ips`, ...) is only named here and read again whole.
//!
//! Layouts: include/uapi/linux/netfilter/nf_tables.h. Numbers inside expressions are
//! big-endian (`nla_put_be32`); keys and data are as the registers hold them.

use super::bytecode;
use super::{
    NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELSET, NFT_MSG_DELSETELEM, NFT_MSG_DESTROYCHAIN,
    NFT_MSG_DESTROYRULE, NFT_MSG_DESTROYSET, NFT_MSG_DESTROYSETELEM, NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFTA_CHAIN_NAME, NFTA_RULE_CHAIN,
    NFTA_SET_NAME,
};
use crate::naming::services::rules::program::{Bytes, Data, Family, Rule, Verdict};
use crate::netlink::{self, Attrs};

/// `NFTA_RULE_HANDLE`, `NFTA_RULE_EXPRESSIONS`, `NFTA_RULE_USERDATA`.
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
/// `NFTA_LIST_ELEM`.
const NFTA_LIST_ELEM: u16 = 1;
/// `NFTA_VERDICT_CODE`, `NFTA_VERDICT_CHAIN`.
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// `NFTA_SET_ELEM_LIST_ELEMENTS`; `NFTA_SET_ELEM_KEY`, `NFTA_SET_ELEM_DATA`,
/// `NFTA_SET_ELEM_FLAGS`; `NFT_SET_ELEM_INTERVAL_END`.
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;
/// `NFTA_DATA_VALUE`, `NFTA_DATA_VERDICT`.
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;

/// One element of an anonymous set or map, as announced.
#[derive(Clone, Debug, PartialEq)]
pub struct RawElement {
    pub key: Bytes,
    pub data: Option<Data>,
    /// The end of an interval (exclusive), which starts at the element before it.
    pub interval_end: bool,
}

/// One announcement about kube-proxy's nftables table.
#[derive(Clone, Debug, PartialEq)]
pub enum NftEvent {
    /// A rule added to `chain`.
    Rule {
        chain: String,
        handle: u64,
        rule: Rule,
    },
    /// A rule removed from `chain`.
    RuleGone { chain: String, handle: u64 },
    /// A chain deleted, with whatever rules it still had.
    ChainGone { chain: String },
    /// Elements added to an anonymous set or map.
    AnonElements {
        set: String,
        elements: Vec<RawElement>,
    },
    /// An anonymous set or map deleted (with its rule).
    AnonGone { set: String },
    /// A named set or map (`service-ips`, `cluster-ips`, ...) changed.
    Set { name: String },
}

/// What one message says; `Ok(None)` when it changes nothing the rules' program holds,
/// `Err` when it cannot be read (a full read then).
pub(super) fn event(
    message: u16,
    family: Family,
    attributes: &[u8],
) -> Result<Option<NftEvent>, ()> {
    Ok(Some(match message {
        NFT_MSG_NEWCHAIN => return Ok(None),
        NFT_MSG_DELCHAIN | NFT_MSG_DESTROYCHAIN => NftEvent::ChainGone {
            chain: string(attributes, NFTA_CHAIN_NAME)?,
        },
        NFT_MSG_NEWRULE => NftEvent::Rule {
            chain: string(attributes, NFTA_RULE_CHAIN)?,
            handle: be64(find(attributes, NFTA_RULE_HANDLE)?)?,
            rule: match optional(attributes, NFTA_RULE_EXPRESSIONS)? {
                Some(list) => {
                    let comment = optional(attributes, NFTA_RULE_USERDATA)?.and_then(comment);
                    bytecode::rule(list, family, comment)?
                }
                None => Rule::default(),
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

/// A rule's comment from its user data (libnftnl's TLVs: type 0, `NFTNL_UDATA_RULE_COMMENT`).
fn comment(userdata: &[u8]) -> Option<String> {
    let mut rest = userdata;
    while let [kind, len, tail @ ..] = rest {
        let value = tail.get(..usize::from(*len))?;
        if *kind == 0 {
            let text = value.strip_suffix(&[0]).unwrap_or(value);
            return std::str::from_utf8(text).ok().map(str::to_owned);
        }
        rest = &tail[usize::from(*len)..];
    }
    None
}

/// An anonymous set's elements: keys as the registers hold them, and their data.
fn elements(list: &[u8]) -> Result<Vec<RawElement>, ()> {
    let mut out = Vec::new();
    for attr in Attrs(list) {
        let (kind, element) = attr.map_err(drop)?;
        if kind != NFTA_LIST_ELEM {
            return Err(());
        }
        let flags = optional(element, NFTA_SET_ELEM_FLAGS)?.map_or(Ok(0), be32)?;
        let key = bytecode::value(find(element, NFTA_SET_ELEM_KEY)?)?;
        let data = match optional(element, NFTA_SET_ELEM_DATA)? {
            None => None,
            Some(data) => match (
                optional(data, NFTA_DATA_VALUE)?,
                optional(data, NFTA_DATA_VERDICT)?,
            ) {
                (Some(value), _) => Some(Data::Value(value.to_vec())),
                (None, Some(v)) => verdict(v)?.map(Data::Verdict),
                (None, None) => None,
            },
        };
        out.push(RawElement {
            key,
            data,
            interval_end: flags & NFT_SET_ELEM_INTERVAL_END != 0,
        });
    }
    Ok(out)
}

/// A verdict (`NFTA_DATA_VERDICT`'s body); `None` for one that is no packet verdict
/// (`NFT_BREAK`).
pub(super) fn verdict(body: &[u8]) -> Result<Option<Verdict>, ()> {
    let code = be32(find(body, NFTA_VERDICT_CODE)?)? as i32;
    Ok(Some(match code {
        0 => Verdict::Drop,
        1 => Verdict::Accept,
        -1 => Verdict::Continue,
        -3 => Verdict::Jump(string(body, NFTA_VERDICT_CHAIN)?),
        -4 => Verdict::Goto(string(body, NFTA_VERDICT_CHAIN)?),
        -5 => Verdict::Return,
        _ => return Ok(None),
    }))
}

/// A NUL-terminated string attribute.
pub(super) fn string(block: &[u8], wanted: u16) -> Result<String, ()> {
    super::string(block, wanted)
}

/// The value of the first attribute of type `wanted`, which must be there.
pub(super) fn find(block: &[u8], wanted: u16) -> Result<&[u8], ()> {
    optional(block, wanted)?.ok_or(())
}

/// The value of the first attribute of type `wanted`, if there is one.
pub(super) fn optional(block: &[u8], wanted: u16) -> Result<Option<&[u8]>, ()> {
    netlink::find(block, wanted).map_err(drop)
}

pub(super) fn be32(value: &[u8]) -> Result<u32, ()> {
    value.try_into().map(u32::from_be_bytes).map_err(|_| ())
}

fn be64(value: &[u8]) -> Result<u64, ()> {
    value.try_into().map(u64::from_be_bytes).map_err(|_| ())
}
