//! Chains and rules that change nothing a DNAT decision depends on: kube-proxy's
//! masquerade marking (`KUBE-MARK-MASQ`, `mark-for-masquerade`) and the rules that
//! jump there. The evaluator passes them by without splitting on their matches (which
//! test the client: `ip saddr != 10.0.0.0/8 jump mark-for-masquerade`).

use std::collections::{BTreeMap, HashSet};

use crate::naming::services::rules::program::{Program, Rule, Stmt, Verdict};

/// Which chains, and which rules of each chain, change nothing.
#[derive(Debug, Default)]
pub struct Inert {
    chains: HashSet<String>,
    rules: HashSet<(String, usize)>,
}

impl Inert {
    pub fn of(program: &Program) -> Inert {
        // The greatest set of chains whose statements are all harmless given it: start
        // from every chain without a harmful statement, drop those that lead to a chain
        // outside the set, until nothing changes.
        let mut chains: HashSet<String> = program
            .chains
            .iter()
            .filter(|(_, chain)| {
                chain.base.is_none() && chain.rules.iter().all(|r| harmless(r, None))
            })
            .map(|(name, _)| name.clone())
            .collect();
        loop {
            let before = chains.len();
            let keep: Vec<String> = chains
                .iter()
                .filter(|name| {
                    program.chains[name.as_str()]
                        .rules
                        .iter()
                        .all(|rule| harmless(rule, Some(&chains)))
                })
                .cloned()
                .collect();
            chains = keep.into_iter().collect();
            if chains.len() == before {
                break;
            }
        }
        let mut rules = HashSet::new();
        let by_chain: &BTreeMap<String, _> = &program.chains;
        for (name, chain) in by_chain {
            for (index, rule) in chain.rules.iter().enumerate() {
                if skippable(rule, &chains) {
                    rules.insert((name.clone(), index));
                }
            }
        }
        Inert { chains, rules }
    }

    pub fn is_inert(&self, chain: &str) -> bool {
        self.chains.contains(chain)
    }

    /// Whether the rule, matched or not, changes nothing: the evaluator skips it
    /// without testing its matches.
    pub fn skips_rule(&self, chain: &str, rule: usize) -> bool {
        !self.rules.is_empty() && self.rules.contains(&(chain.to_owned(), rule))
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
