//! `nft -j list table ip|ip6 kube-proxy`, decoded into a [`Program`] that the evaluator
//! follows from the hooks down, whatever layout kube-proxy wrote: the `service-ips`
//! verdict map to per-Service chains (every version), `numgen random mod N vmap` to
//! endpoint chains that `dnat to` (up to 1.35), one `dnat ip addr . port to numgen
//! random mod N map { ... }` (1.36), a plain `dnat to` for one endpoint (1.37), or
//! shared `dispatch-N` chains that `ct mark set numgen ...` and DNAT through one
//! `@endpoints` map (proposed for 1.38). Kept decoded, so that announced changes are
//! applied rule by rule and a changed named map is read again alone.

mod json;
mod statements;
mod types;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::naming::services::RulesPatchError;
use crate::naming::services::nft_changes::{NftEvent, RawElement};

use super::RulesError;
use super::program::{Bytes, Element, Program, Rule, Set, SetRef, Stmt};
use statements::Usage;

/// One table's rules, decoded.
#[derive(Clone, Debug)]
pub struct Table {
    /// Shared with the Service maps made from it; patched copy-on-write.
    program: Arc<Program>,
    /// Named sets that are sets, not maps (a changed one is listed with `list set`).
    plain_sets: BTreeSet<String>,
    /// Anonymous sets' elements as announced, for the rules that use them.
    anonymous: HashMap<String, Vec<RawElement>>,
}

impl Table {
    pub fn parse(text: &str) -> Result<Table, RulesError> {
        let objects = json::objects(text)?;
        let (program, plain) = json::program(&objects)?;
        Ok(Table {
            program: Arc::new(program),
            plain_sets: plain.into_iter().collect(),
            anonymous: HashMap::new(),
        })
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// Applies one announcement about a chain's rules or an anonymous set; a named set
    /// or map is [`Table::replace_set`]'s. `Err` says why the table must be read whole.
    pub fn apply(&mut self, event: &NftEvent) -> Result<(), RulesPatchError> {
        match event {
            NftEvent::Rule {
                chain,
                handle,
                rule,
            } => {
                // An anonymous set is announced before its rule: one missing means
                // announcements were lost.
                if let Some(set) =
                    anonymous_sets(rule).find(|s| !self.program.sets.contains_key(*s))
                {
                    return Err(RulesPatchError::ElementsNotAnnounced {
                        set: set.to_owned(),
                    });
                }
                let program = Arc::make_mut(&mut self.program);
                let rules = &mut program.chains.entry(chain.clone()).or_default().rules;
                rules.retain(|r| r.handle != Some(*handle));
                rules.push(Rule {
                    handle: Some(*handle),
                    ..rule.clone()
                });
            }
            NftEvent::RuleGone { chain, handle } => {
                if let Some(chain) = Arc::make_mut(&mut self.program).chains.get_mut(chain) {
                    chain.rules.retain(|r| r.handle != Some(*handle));
                }
            }
            NftEvent::ChainGone { chain } => {
                Arc::make_mut(&mut self.program).chains.remove(chain);
            }
            NftEvent::AnonElements { set, elements } => {
                let raw = self.anonymous.entry(set.clone()).or_default();
                raw.extend(elements.iter().cloned());
                let built = anonymous_set(raw)?;
                Arc::make_mut(&mut self.program)
                    .sets
                    .insert(set.clone(), Arc::new(built));
            }
            NftEvent::AnonGone { set } => {
                self.anonymous.remove(set);
                Arc::make_mut(&mut self.program).sets.remove(set);
            }
            NftEvent::Set { name } => {
                return Err(RulesPatchError::SetAnnounced { name: name.clone() });
            }
        }
        Ok(())
    }

    /// Replaces the named map or set `name` with that of `listing` (`nft -j list map`
    /// or `list set`); `None`: it is gone.
    pub fn replace_set(&mut self, name: &str, listing: Option<&str>) -> Result<(), RulesError> {
        Arc::make_mut(&mut self.program).sets.remove(name);
        let Some(listing) = listing else {
            return Ok(());
        };
        if let Some((set, plain)) = json::listed_set(listing, name, &self.usage())? {
            if plain {
                self.plain_sets.insert(name.to_owned());
            }
            Arc::make_mut(&mut self.program)
                .sets
                .insert(name.to_owned(), Arc::new(set));
        }
        Ok(())
    }

    /// How the rules look named sets up (what types their keys and data have), for a
    /// set listed without its declaration's types.
    fn usage(&self) -> HashMap<String, Usage> {
        let family = self.program.family;
        let mut out: HashMap<String, Usage> = HashMap::new();
        let mut note = |key: &super::program::Expr, set: &SetRef| {
            if let SetRef::Named(name) = set {
                let usage = out.entry(name.clone()).or_default();
                if usage.key.is_none() {
                    usage.key = types::Ty::of(key, family);
                }
            }
        };
        for chain in self.program.chains.values() {
            for rule in &chain.rules {
                for stmt in &rule.stmts {
                    match stmt {
                        Stmt::Vmap { key, map } => note(key, map),
                        Stmt::Match(super::program::Cond::InSet { left, set, .. }) => {
                            note(left, set)
                        }
                        _ => {}
                    }
                }
            }
        }
        out
    }

    /// Whether the table has a set (not a map) named `name`.
    pub fn is_set(&self, name: &str) -> bool {
        self.plain_sets.contains(name)
    }
}

/// The anonymous sets (`__set0`, `__map3`) a rule names.
fn anonymous_sets(rule: &Rule) -> impl Iterator<Item = &str> {
    fn in_expr<'a>(expr: &'a super::program::Expr, out: &mut Vec<&'a str>) {
        use super::program::Expr;
        match expr {
            Expr::Lookup { key, map } => {
                if let SetRef::Named(name) = map {
                    out.push(name);
                }
                in_expr(key, out);
            }
            Expr::Slice { of, .. } | Expr::Bitwise { of, .. } => in_expr(of, out),
            Expr::Concat(parts) => parts.iter().for_each(|p| in_expr(p, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for stmt in &rule.stmts {
        match stmt {
            Stmt::Vmap { key, map }
            | Stmt::Match(super::program::Cond::InSet {
                left: key,
                set: map,
                ..
            }) => {
                if let SetRef::Named(name) = map {
                    out.push(name.as_str());
                }
                in_expr(key, &mut out);
            }
            Stmt::Dnat { addr, port } => {
                in_expr(addr, &mut out);
                if let Some(port) = port {
                    in_expr(port, &mut out);
                }
            }
            Stmt::SetCtMark(value) => in_expr(value, &mut out),
            _ => {}
        }
    }
    out.into_iter().filter(|name| name.starts_with("__"))
}

/// An anonymous set from its announced elements: exact keys, or, where elements mark
/// interval ends (`NFT_SET_ELEM_INTERVAL_END`), ranges from each start up to the key
/// before the next end.
fn anonymous_set(raw: &[RawElement]) -> Result<Set, RulesPatchError> {
    if !raw.iter().any(|e| e.interval_end) {
        return Ok(Set::new(
            raw.iter()
                .map(|e| Element {
                    key: e.key.clone(),
                    key_end: None,
                    data: e.data.clone(),
                    comment: None,
                })
                .collect(),
        ));
    }
    let mut sorted: Vec<&RawElement> = raw.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let mut elements = Vec::new();
    let mut start: Option<&RawElement> = None;
    for element in sorted {
        match (element.interval_end, start) {
            (false, _) => start = Some(element),
            (true, Some(open)) => {
                elements.push(Element {
                    key: open.key.clone(),
                    key_end: Some(before(&element.key)),
                    data: open.data.clone(),
                    comment: None,
                });
                start = None;
            }
            (true, None) => {}
        }
    }
    if let Some(open) = start {
        elements.push(Element {
            key: open.key.clone(),
            key_end: Some(vec![0xff; open.key.len()]),
            data: open.data.clone(),
            comment: None,
        });
    }
    Ok(Set::new(elements))
}

/// The key one below `key` (big-endian).
fn before(key: &[u8]) -> Bytes {
    let mut out = key.to_vec();
    for byte in out.iter_mut().rev() {
        if *byte == 0 {
            *byte = 0xff;
        } else {
            *byte -= 1;
            break;
        }
    }
    out
}
