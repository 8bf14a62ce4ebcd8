//! Runs a [`Program`] for one connection's first packet, as the kernel would, from the
//! hooks down: jumps, gotos and returns, verdict maps, map lookups, `numgen` (each
//! number equally likely), `ct mark set`, iptables' `--probability`, and `dnat`. What
//! the rules test of the client (its address, whether it is the node itself) is not
//! known in advance: a match on it splits the run in two, each side remembering the
//! [`Guard`] it assumed, so a connection is later judged by the side its client is on.
//!
//! What is assumed of an address of the node itself (a NodePort's destination,
//! [`Daddr::NodeLocal`]): it is none of the Service addresses the rules compare with
//! or look up exactly; prefixes, ranges and sets of addresses are guards.

use std::net::{IpAddr, SocketAddr};

use super::{Bytes, Cond, Data, Program, SetRef, Stmt, Verdict};

mod compiled;
mod describe;
mod dnat;
mod values;

pub use compiled::Compiled;
pub use describe::describe;
use dnat::dnat;
pub use values::octets;
use values::{Ctx, Decision};

/// The destination of the first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Daddr {
    Addr(IpAddr),
    /// One of the node's own addresses (a NodePort).
    NodeLocal,
}

/// A connection's first packet, as far as it is known before any client dials.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub daddr: Daddr,
    /// IP protocol number (6 TCP, 17 UDP).
    pub proto: u8,
    pub dport: u16,
}

/// What one connection's client is: what the guards test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    pub saddr: IpAddr,
    /// What it dialed (a NodePort's node address, say).
    pub daddr: IpAddr,
    /// Whether the client is the node itself (`fib saddr type local`); `None`: unknown.
    pub local: Option<bool>,
}

/// A match on what only the connection tells, and which way a branch took it.
#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    pub cond: Cond,
    pub holds: bool,
    /// `cond` as text: identity and display.
    pub text: String,
}

impl Guard {
    /// Whether `client` takes this branch; `None` when it cannot be told (an opaque
    /// match).
    pub fn check(&self, client: &Client, packet: &Packet) -> Option<bool> {
        let program = Program::new(super::Family::of(client.daddr));
        let ctx = Ctx {
            program: &program,
            packet: Packet {
                daddr: Daddr::Addr(client.daddr),
                ..*packet
            },
            saddr: Some(client.saddr),
            saddr_local: client.local,
            ct_mark: vec![0; 4],
        };
        match ctx.decide(&self.cond) {
            Decision::Known(outcomes) => {
                let truth = outcomes.iter().any(|(p, holds)| *holds && *p > 0.0);
                Some(truth == self.holds)
            }
            Decision::Affinity(_) => Some(!self.holds),
            Decision::Guard | Decision::Unfollowed(_) => None,
        }
    }
}

/// Where a branch ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Dnat(SocketAddr),
    /// Accepted (or fell off every chain) without DNAT.
    Pass,
    Drop,
    Reject,
    /// A rule observer could not follow, named.
    Unfollowed(String),
}

/// What a branch passed through: what names it and why it ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trail {
    pub chains: Vec<String>,
    /// Comments of the rules that matched, and of the map elements that were hit.
    pub comments: Vec<String>,
    /// Named sets and maps a hit came from.
    pub sets: Vec<String>,
    /// ClientIP session affinity on the way: its timeout (seconds) when known.
    pub affinity: Option<Option<u64>>,
    /// The chain of the rule whose verdict ended the branch, and that rule's comment.
    pub end: Option<(String, Option<String>)>,
}

/// One way the rules can go for a connection.
#[derive(Clone, Debug, PartialEq)]
pub struct Branch {
    pub guards: Vec<Guard>,
    pub probability: f64,
    pub target: Target,
    pub trail: Trail,
}

/// The chains to run, in order, in one program: the next runs when the last accepted.
pub struct Stage<'c, 'p> {
    pub compiled: &'c Compiled<'p>,
    pub roots: &'c [usize],
}

/// Beyond this many branches per packet observer gives up on the packet (a rule set
/// that forks on every rule).
const MAX_BRANCHES: usize = 4096;
/// nf_tables allows 16 nested jumps; iptables more. Deeper is a loop.
const MAX_DEPTH: usize = 64;

/// Every way `packet` can go through `stages`.
pub fn evaluate(stages: &[Stage<'_, '_>], packet: Packet) -> Vec<Branch> {
    let mut done = Vec::new();
    let mut pending = vec![Branch {
        guards: Vec::new(),
        probability: 1.0,
        target: Target::Pass,
        trail: Trail::default(),
    }];
    for stage in stages {
        let mut next = Vec::new();
        for root in stage.roots {
            let mut passed = Vec::new();
            for branch in pending.drain(..) {
                run_chain(stage, *root, packet, branch, &mut passed, &mut done);
            }
            if passed.len() + done.len() > MAX_BRANCHES {
                return vec![too_many()];
            }
            pending = passed;
        }
        next.append(&mut pending);
        pending = next;
    }
    done.append(&mut pending);
    done
}

fn too_many() -> Branch {
    Branch {
        guards: Vec::new(),
        probability: 1.0,
        target: Target::Unfollowed(format!("more than {MAX_BRANCHES} ways through the rules")),
        trail: Trail::default(),
    }
}

/// Where a walk is: a chain, a rule, a statement.
#[derive(Clone)]
struct Position {
    chain: usize,
    rule: usize,
    stmt: usize,
}

#[derive(Clone)]
struct Walk {
    at: Position,
    /// Where each `jump` returns to.
    stack: Vec<Position>,
    branch: Branch,
    ct_mark: Bytes,
}

/// Runs one root chain for one branch: branches that accepted go to `passed`, those
/// that ended (DNAT, drop, reject, not followed) to `done`.
fn run_chain(
    stage: &Stage<'_, '_>,
    root: usize,
    packet: Packet,
    branch: Branch,
    passed: &mut Vec<Branch>,
    done: &mut Vec<Branch>,
) {
    let mut walks = vec![Walk {
        at: Position {
            chain: root,
            rule: 0,
            stmt: 0,
        },
        stack: Vec::new(),
        branch,
        ct_mark: vec![0; 4],
    }];
    let mut ended = Vec::new();
    let mut steps = 0usize;
    while let Some(walk) = walks.pop() {
        steps += 1;
        if steps > MAX_BRANCHES * 256 || walks.len() + ended.len() > MAX_BRANCHES {
            done.push(too_many());
            return;
        }
        step(stage, packet, walk, &mut walks, &mut ended);
    }
    for branch in ended {
        if branch.target == Target::Pass {
            passed.push(branch);
        } else {
            done.push(branch);
        }
    }
}

/// Advances a walk by one statement: what goes on is pushed to `walks`, what ended to
/// `ended`.
fn step(
    stage: &Stage<'_, '_>,
    packet: Packet,
    mut walk: Walk,
    walks: &mut Vec<Walk>,
    ended: &mut Vec<Branch>,
) {
    let compiled = stage.compiled;
    let program = compiled.program;
    let chain = compiled.chain(walk.at.chain);
    if walk.at.stmt == 0 {
        // Straight to the next rule this destination can match.
        let next = compiled.next_rule(walk.at.chain, walk.at.rule, packet.daddr);
        if next != walk.at.rule {
            walk.at.rule = next;
            walks.push(walk);
            return;
        }
    }
    let Some(rule) = chain.rules.get(walk.at.rule) else {
        return chain_end(walk, walks, ended);
    };
    if walk.at.stmt == 0 && compiled.skips(walk.at.chain, walk.at.rule) {
        return next_rule(walk, walks);
    }
    let Some(stmt) = rule.stmts.get(walk.at.stmt) else {
        return next_rule(walk, walks);
    };
    let ctx = Ctx {
        program,
        packet,
        saddr: None,
        saddr_local: None,
        ct_mark: walk.ct_mark.clone(),
    };
    match stmt {
        Stmt::Match(cond) => match ctx.decide(cond) {
            Decision::Known(outcomes) => {
                for (probability, holds) in outcomes {
                    let mut fork = walk.clone();
                    fork.branch.probability *= probability;
                    if holds {
                        fork.at.stmt += 1;
                        walks.push(fork);
                    } else {
                        next_rule(fork, walks);
                    }
                }
            }
            Decision::Guard => {
                let text = describe(cond);
                // Decided already on this branch: the same way again (or never).
                if let Some(earlier) = walk.branch.guards.iter().find(|g| g.text == text) {
                    if earlier.holds {
                        walk.at.stmt += 1;
                        walks.push(walk);
                    } else {
                        next_rule(walk, walks);
                    }
                    return;
                }
                let cond = resolve_sets(program, cond);
                let mut taken = walk.clone();
                taken.branch.guards.push(Guard {
                    cond: cond.clone(),
                    holds: true,
                    text: text.clone(),
                });
                taken.at.stmt += 1;
                walks.push(taken);
                walk.branch.guards.push(Guard {
                    cond,
                    holds: false,
                    text,
                });
                next_rule(walk, walks);
            }
            Decision::Affinity(timeout) => {
                walk.branch.trail.affinity = Some(timeout);
                next_rule(walk, walks);
            }
            Decision::Unfollowed(why) => end(walk, Target::Unfollowed(why), ended),
        },
        Stmt::SetCtMark(expr) => match ctx.values(expr) {
            Ok(values) => {
                for (probability, value) in values {
                    let Some(value) = value else { continue };
                    let mut fork = walk.clone();
                    fork.branch.probability *= probability;
                    fork.ct_mark = value;
                    fork.at.stmt += 1;
                    walks.push(fork);
                }
            }
            Err(why) => end(walk, Target::Unfollowed(why), ended),
        },
        Stmt::Dnat { addr, port } => dnat(
            &ctx,
            rule.comment.as_deref(),
            addr,
            port.as_ref(),
            walk,
            walks,
            ended,
        ),
        Stmt::Inert => {
            walk.at.stmt += 1;
            walks.push(walk);
        }
        Stmt::Verdict(verdict) => {
            note_comment(&mut walk, rule.comment.as_deref());
            walk.branch.trail.end = Some((
                compiled.name(walk.at.chain).to_owned(),
                rule.comment.clone(),
            ));
            apply(stage, walk, verdict.clone(), walks, ended);
        }
        Stmt::Vmap { key, map } => {
            let Some(set) = program.set(map) else {
                let why = format!("a verdict map {}, which does not exist", set_name(map));
                return end(walk, Target::Unfollowed(why), ended);
            };
            let keys = match ctx.values(key) {
                Ok(keys) => keys,
                // A node address is no Service address (see the module's doc).
                Err(_) if packet.daddr == Daddr::NodeLocal => vec![(1.0, None)],
                Err(why) => return end(walk, Target::Unfollowed(why), ended),
            };
            for (probability, key) in keys {
                let mut fork = walk.clone();
                fork.branch.probability *= probability;
                let element = key.as_deref().and_then(|key| set.find(key));
                match element.and_then(|e| e.data.as_ref().map(|d| (e, d))) {
                    Some((element, Data::Verdict(verdict))) => {
                        note_comment(&mut fork, rule.comment.as_deref());
                        note_comment(&mut fork, element.comment.as_deref());
                        if let SetRef::Named(name) = map {
                            fork.branch.trail.sets.push(name.clone());
                        }
                        fork.branch.trail.end = Some((
                            compiled.name(fork.at.chain).to_owned(),
                            rule.comment.clone(),
                        ));
                        apply(stage, fork, verdict.clone(), walks, ended);
                    }
                    _ => next_rule(fork, walks),
                }
            }
        }
        Stmt::Opaque(text) => end(walk, Target::Unfollowed(text.clone()), ended),
    }
}

fn note_comment(walk: &mut Walk, comment: Option<&str>) {
    if let Some(comment) = comment {
        walk.branch.trail.comments.push(comment.to_owned());
    }
}

fn end(walk: Walk, target: Target, ended: &mut Vec<Branch>) {
    ended.push(Branch {
        target,
        ..walk.branch
    });
}

fn next_rule(mut walk: Walk, walks: &mut Vec<Walk>) {
    walk.at.rule += 1;
    walk.at.stmt = 0;
    walks.push(walk);
}

/// The end of a chain: back to where it was jumped from, or, in a root chain, its
/// policy (kube-proxy's and iptables' built-in chains accept).
fn chain_end(mut walk: Walk, walks: &mut Vec<Walk>, ended: &mut Vec<Branch>) {
    match walk.stack.pop() {
        Some(back) => {
            walk.at = back;
            walks.push(walk);
        }
        None => end(walk, Target::Pass, ended),
    }
}

fn apply(
    stage: &Stage<'_, '_>,
    mut walk: Walk,
    verdict: Verdict,
    walks: &mut Vec<Walk>,
    ended: &mut Vec<Branch>,
) {
    let compiled = stage.compiled;
    let (chain, goto) = match &verdict {
        Verdict::Accept => return end(walk, Target::Pass, ended),
        Verdict::Drop => return end(walk, Target::Drop, ended),
        Verdict::Reject => return end(walk, Target::Reject, ended),
        Verdict::Continue => return next_rule(walk, walks),
        Verdict::Return => return chain_end(walk, walks, ended),
        Verdict::Jump(chain) => (chain, false),
        Verdict::Goto(chain) => (chain, true),
    };
    let Some(id) = compiled.id(chain) else {
        let why = format!("a jump to chain {chain}, which does not exist");
        return end(walk, Target::Unfollowed(why), ended);
    };
    // A chain that changes nothing a DNAT depends on (masquerade marks): a jump there
    // goes on with the next rule, a goto returns.
    if compiled.is_inert(id) {
        return match goto {
            false => next_rule(walk, walks),
            true => chain_end(walk, walks, ended),
        };
    }
    if !goto {
        if walk.stack.len() >= MAX_DEPTH {
            let why = format!("jumps nested deeper than {MAX_DEPTH} at chain {chain}");
            return end(walk, Target::Unfollowed(why), ended);
        }
        walk.stack.push(Position {
            rule: walk.at.rule + 1,
            stmt: 0,
            chain: walk.at.chain,
        });
    }
    walk.branch.trail.chains.push(chain.clone());
    walk.at = Position {
        chain: id,
        rule: 0,
        stmt: 0,
    };
    walks.push(walk);
}

pub(super) fn set_name(set: &SetRef) -> &str {
    match set {
        SetRef::Named(name) => name,
        SetRef::Inline(_) => "(inline)",
    }
}

/// A guard's condition with its named sets copied in, so that it can be checked
/// against a connection without the program.
fn resolve_sets(program: &Program, cond: &Cond) -> Cond {
    match cond {
        Cond::InSet {
            left,
            set: SetRef::Named(name),
            negated,
        } => match program.sets.get(name) {
            Some(set) => Cond::InSet {
                left: left.clone(),
                set: SetRef::Inline(set.clone()),
                negated: *negated,
            },
            None => cond.clone(),
        },
        _ => cond.clone(),
    }
}
