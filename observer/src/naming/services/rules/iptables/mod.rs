//! `iptables-save` text as kube-proxy's iptables mode writes it (pkg/proxy/iptables):
//! KUBE-SERVICES / KUBE-NODEPORTS frontends jump to per-Service-port chains that share
//! one hash (KUBE-SVC-H, KUBE-SVL-H, KUBE-EXT-H, KUBE-FW-H); KUBE-SVC-H / KUBE-SVL-H hold
//! the `--probability` waterfall to KUBE-SEP-* chains, which DNAT. iptables-nft and
//! legacy print the same text; option order differs between kube-proxy's input and
//! iptables-save's output, so rules are read as option sets, not by position.

mod options;
mod tokenize;

use std::collections::HashMap;
use std::sync::Arc;

use super::RulesError;
use super::program::{Base, Chain, ChainType, Family, Hook, Program};

/// The tables whose rules decide and refuse Service connections.
const READ_TABLES: [&str; 2] = ["nat", "filter"];

/// Every table of one `iptables-save` dump that observer reads (`nat`, `filter`),
/// decoded, so that chains can be replaced one by one as they change (`iptables -t
/// TABLE -S CHAIN`) without parsing the rest again.
#[derive(Debug)]
pub struct Tables {
    family: Family,
    /// Shared with the Service maps made from them; patched copy-on-write.
    tables: HashMap<String, Arc<Program>>,
}

impl Tables {
    pub fn parse(text: &str) -> Result<Tables, RulesError> {
        let family = family(text);
        let tables = read_tables(family, text)?
            .into_iter()
            .map(|(name, program)| (name, Arc::new(program)))
            .collect();
        Ok(Tables { family, tables })
    }

    /// The tables in the order a packet meets them: nat (DNAT at PREROUTING), then
    /// filter (FORWARD and INPUT, where kube-proxy rejects).
    pub fn programs(&self) -> Vec<&Arc<Program>> {
        READ_TABLES
            .iter()
            .filter_map(|name| self.tables.get(*name))
            .collect()
    }

    /// Replaces one chain with what `iptables -t table -S chain` printed: `-N chain` or
    /// `-P chain POLICY`, then its `-A chain` rules.
    pub fn replace_chain(
        &mut self,
        table: &str,
        chain: &str,
        listing: &str,
    ) -> Result<(), RulesError> {
        let mut rules = Vec::new();
        let mut declared = false;
        for (index, raw) in listing.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            let mut words = trimmed.split_whitespace();
            match (words.next(), words.next()) {
                (None, _) => {}
                (Some("-N" | "-P"), Some(name)) if name == chain => declared = true,
                (Some("-A"), Some(name)) if name == chain => {
                    let words = tokenize::tokenize(trimmed, line)?;
                    rules.push(options::parse_rule(self.family, &words, line)?.1);
                }
                _ => {
                    return Err(err(
                        line,
                        format!("not a line of chain {chain}: {}", clip(trimmed)),
                    ));
                }
            }
        }
        if !declared {
            return Err(err(1, format!("chain {chain} is not declared")));
        }
        let program = Arc::make_mut(
            self.tables
                .entry(table.to_owned())
                .or_insert_with(|| Arc::new(Program::new(self.family))),
        );
        let entry = program
            .chains
            .entry(chain.to_owned())
            .or_insert_with(|| Chain {
                rules: Vec::new(),
                base: base(table, chain),
            });
        entry.rules = rules;
        Ok(())
    }

    /// Forgets a chain that was deleted.
    pub fn remove_chain(&mut self, table: &str, chain: &str) {
        if let Some(program) = self.tables.get_mut(table) {
            Arc::make_mut(program).chains.remove(chain);
        }
    }
}

/// The family of a dump: IPv6 when its first address is.
fn family(text: &str) -> Family {
    let mut words = text.split_whitespace();
    while let Some(word) = words.next() {
        if matches!(word, "-s" | "-d" | "--to-destination")
            && let Some(value) = words.next()
        {
            let ip = value
                .split('/')
                .next()
                .unwrap_or_default()
                .trim_matches(['[', ']']);
            if let Ok(ip) = ip.parse::<std::net::IpAddr>() {
                return Family::of(ip);
            }
            if value.starts_with('[') {
                return Family::V6;
            }
        }
    }
    Family::V4
}

/// The hook of a built-in chain.
fn base(table: &str, chain: &str) -> Option<Base> {
    let hook = match chain {
        "PREROUTING" => Hook::Prerouting,
        "INPUT" => Hook::Input,
        "FORWARD" => Hook::Forward,
        "OUTPUT" => Hook::Output,
        "POSTROUTING" => Hook::Postrouting,
        _ => return None,
    };
    let (kind, priority) = match table {
        "nat" => (
            ChainType::Nat,
            if hook == Hook::Postrouting { 100 } else { -100 },
        ),
        _ => (ChainType::Filter, 0),
    };
    Some(Base {
        kind,
        hook,
        priority,
    })
}

fn err(line: usize, message: impl Into<String>) -> RulesError {
    RulesError::Iptables {
        line,
        message: super::error_text(message.into()),
    }
}

/// Every `*table` ... `COMMIT` block, by table name.
fn read_tables(family: Family, text: &str) -> Result<HashMap<String, Program>, RulesError> {
    let mut tables: HashMap<String, Program> = HashMap::new();
    let mut current: Option<String> = None;
    let mut last_line = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        last_line = line;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('*') {
            if let Some(open) = &current {
                return Err(err(
                    line,
                    format!("table {name} starts before table {open} got its COMMIT"),
                ));
            }
            current = Some(name.to_owned());
            continue;
        }
        let Some(table_name) = &current else {
            return Err(err(
                line,
                format!(
                    "not iptables-save output (outside any *table): {}",
                    clip(trimmed)
                ),
            ));
        };
        if trimmed == "COMMIT" {
            current = None;
        } else if READ_TABLES.contains(&table_name.as_str()) {
            let table = tables
                .entry(table_name.clone())
                .or_insert_with(|| Program::new(family));
            read_line(table_name, table, trimmed, line)?;
        } else {
            check_line(trimmed, line)?;
        }
    }
    if let Some(name) = current {
        return Err(err(
            last_line,
            format!("table {name} has no COMMIT (truncated dump?)"),
        ));
    }
    Ok(tables)
}

/// A chain declaration or an `-A` rule inside a table.
fn read_line(
    table_name: &str,
    table: &mut Program,
    trimmed: &str,
    line: usize,
) -> Result<(), RulesError> {
    check_line(trimmed, line)?;
    if let Some(declaration) = trimmed.strip_prefix(':') {
        let chain = declaration.split_whitespace().next().unwrap_or_default();
        table
            .chains
            .entry(chain.to_owned())
            .or_insert_with(|| Chain {
                rules: Vec::new(),
                base: base(table_name, chain),
            });
    } else {
        let words = tokenize::tokenize(trimmed, line)?;
        let (chain, rule) = options::parse_rule(table.family, &words, line)?;
        table
            .chains
            .entry(chain.clone())
            .or_insert_with(|| Chain {
                rules: Vec::new(),
                base: base(table_name, &chain),
            })
            .rules
            .push(rule);
    }
    Ok(())
}

/// A line inside a table must declare a chain or append a rule.
fn check_line(trimmed: &str, line: usize) -> Result<(), RulesError> {
    if let Some(declaration) = trimmed.strip_prefix(':') {
        if declaration.split_whitespace().next().is_none() {
            return Err(err(line, "chain declaration without a name"));
        }
        return Ok(());
    }
    if trimmed.starts_with("-A ") {
        return Ok(());
    }
    Err(err(
        line,
        format!("not an iptables-save line: {}", clip(trimmed)),
    ))
}

fn clip(text: &str) -> String {
    const MAX: usize = 60;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}
