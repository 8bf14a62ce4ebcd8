//! A program prepared for running many packets: chains by number, the chains and rules
//! that change nothing a DNAT decision depends on (kube-proxy's masquerade marking,
//! which the evaluator passes by without splitting on its matches of the client), and,
//! for long chains, which rules a destination address can match at all (iptables'
//! KUBE-SERVICES has a rule per Service address: a packet visits only its own).

use std::collections::{HashMap, HashSet};

use super::Daddr;
use crate::naming::services::rules::program::{
    Bytes, Chain, CmpOp, Cond, Expr, Field, Program, Rule, Stmt, Verdict,
};

/// Chains shorter than this are walked rule by rule.
const INDEXED_FROM: usize = 16;

/// Rules of one chain by the exact destination address they require.
struct DaddrIndex {
    by_addr: HashMap<Bytes, Vec<usize>>,
    /// Rules that require no exact address.
    other: Vec<usize>,
}

pub struct Compiled<'p> {
    pub program: &'p Program,
    names: Vec<&'p str>,
    ids: HashMap<&'p str, usize>,
    chains: Vec<&'p Chain>,
    inert: Vec<bool>,
    skip: Vec<Vec<bool>>,
    daddr: Vec<Option<DaddrIndex>>,
}

impl<'p> Compiled<'p> {
    pub fn new(program: &'p Program) -> Compiled<'p> {
        let names: Vec<&str> = program.chains.keys().map(String::as_str).collect();
        let ids: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let chains: Vec<&Chain> = program.chains.values().collect();
        let inert_names = inert_chains(program);
        let inert: Vec<bool> = names.iter().map(|n| inert_names.contains(*n)).collect();
        let skip = chains
            .iter()
            .map(|chain| {
                chain
                    .rules
                    .iter()
                    .map(|rule| skippable(rule, &inert_names))
                    .collect()
            })
            .collect();
        let daddr = chains.iter().map(|chain| daddr_index(chain)).collect();
        Compiled {
            program,
            names,
            ids,
            chains,
            inert,
            skip,
            daddr,
        }
    }

    pub fn id(&self, name: &str) -> Option<usize> {
        self.ids.get(name).copied()
    }

    pub fn name(&self, id: usize) -> &'p str {
        self.names[id]
    }

    pub fn chain(&self, id: usize) -> &'p Chain {
        self.chains[id]
    }

    pub fn is_inert(&self, id: usize) -> bool {
        self.inert[id]
    }

    pub fn skips(&self, chain: usize, rule: usize) -> bool {
        self.skip[chain].get(rule).copied().unwrap_or(false)
    }

    /// The first rule at or after `from` that a packet to `daddr` can match.
    pub fn next_rule(&self, chain: usize, from: usize, daddr: Daddr) -> usize {
        let Some(index) = &self.daddr[chain] else {
            return from;
        };
        let first_at = |rules: &[usize]| {
            let at = rules.partition_point(|r| *r < from);
            rules.get(at).copied()
        };
        let other = first_at(&index.other);
        let own = match daddr {
            Daddr::Addr(ip) => index
                .by_addr
                .get(&super::octets(ip))
                .and_then(|rules| first_at(rules)),
            // A node address is none of the addresses rules name exactly.
            Daddr::NodeLocal => None,
        };
        let end = self.chains[chain].rules.len();
        other.into_iter().chain(own).min().unwrap_or(end)
    }
}

/// The exact destination a rule requires (`ip daddr X`, `-d X/32`) before it does
/// anything, if any.
fn required_daddr(rule: &Rule) -> Option<&Bytes> {
    let matches = rule
        .stmts
        .iter()
        .take_while(|s| matches!(s, Stmt::Match(_)));
    matches.into_iter().find_map(|stmt| match stmt {
        Stmt::Match(Cond::Cmp {
            left: Expr::Field(Field::Daddr),
            op: CmpOp::Eq,
            right,
        }) => Some(right),
        _ => None,
    })
}

fn daddr_index(chain: &Chain) -> Option<DaddrIndex> {
    if chain.rules.len() < INDEXED_FROM {
        return None;
    }
    let mut index = DaddrIndex {
        by_addr: HashMap::new(),
        other: Vec::new(),
    };
    for (i, rule) in chain.rules.iter().enumerate() {
        match required_daddr(rule) {
            Some(addr) => index.by_addr.entry(addr.clone()).or_default().push(i),
            None => index.other.push(i),
        }
    }
    Some(index)
}

/// The greatest set of chains whose statements are all harmless given it: start from
/// every regular chain without a harmful statement, drop those that lead to a chain
/// outside the set, until nothing changes.
fn inert_chains(program: &Program) -> HashSet<String> {
    let mut chains: HashSet<String> = program
        .chains
        .iter()
        .filter(|(_, chain)| chain.base.is_none() && chain.rules.iter().all(|r| harmless(r, None)))
        .map(|(name, _)| name.clone())
        .collect();
    loop {
        let keep: HashSet<String> = chains
            .iter()
            .filter(|name| {
                program.chains[name.as_str()]
                    .rules
                    .iter()
                    .all(|rule| harmless(rule, Some(&chains)))
            })
            .cloned()
            .collect();
        if keep.len() == chains.len() {
            return keep;
        }
        chains = keep;
    }
}

/// Whether a rule of an inert chain may have these statements: matches, inert
/// statements, returns, and jumps or gotos to inert chains (`inert`, once known).
fn harmless(rule: &Rule, inert: Option<&HashSet<String>>) -> bool {
    rule.stmts.iter().all(|stmt| match stmt {
        Stmt::Match(_) | Stmt::Inert => true,
        Stmt::Verdict(Verdict::Return | Verdict::Continue) => true,
        Stmt::Verdict(Verdict::Jump(to) | Verdict::Goto(to)) => {
            inert.is_none_or(|c| c.contains(to))
        }
        _ => false,
    })
}

/// Whether a rule changes nothing whether or not it matches: matches, inert
/// statements, and no verdict but a jump to an inert chain (which comes back).
fn skippable(rule: &Rule, inert: &HashSet<String>) -> bool {
    rule.stmts.iter().all(|stmt| match stmt {
        Stmt::Match(_) | Stmt::Inert | Stmt::Verdict(Verdict::Continue) => true,
        Stmt::Verdict(Verdict::Jump(to)) => inert.contains(to),
        _ => false,
    })
}
