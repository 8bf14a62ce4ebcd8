//! `iptables-save` text as kube-proxy's iptables mode writes it (pkg/proxy/iptables):
//! KUBE-SERVICES / KUBE-NODEPORTS frontends jump to per-Service-port chains that share
//! one hash (KUBE-SVC-H, KUBE-SVL-H, KUBE-EXT-H, KUBE-FW-H); KUBE-SVC-H / KUBE-SVL-H hold
//! the `--probability` waterfall to KUBE-SEP-* chains, which DNAT. iptables-nft and
//! legacy print the same text; option order differs between kube-proxy's input and
//! iptables-save's output, so rules are read as option sets, not by position.

mod services;
mod tokenize;
mod waterfall;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::{RulesError, ServicePort};

/// One `-A` line, reduced to the options kube-proxy's chains use.
#[derive(Debug, Default)]
struct Rule {
    line: usize,
    /// `-d` when not negated: (address, prefix length).
    dst: Option<(IpAddr, u8)>,
    proto: Option<String>,
    dport: Option<String>,
    jump: Option<String>,
    comment: Option<String>,
    probability: Option<String>,
    to_destination: Option<String>,
    /// `-m recent --rcheck`: a session-affinity shortcut, not part of the waterfall.
    rcheck: bool,
    /// `--dst-type LOCAL`: a NodePort-style match on any local address.
    dst_local: bool,
}

#[derive(Debug, Default)]
struct Table {
    chains: BTreeMap<String, Vec<Rule>>,
}

/// Every table of one `iptables-save` dump, parsed, so that chains can be replaced one
/// by one as they change (`iptables -t TABLE -S CHAIN`) without parsing the rest again.
#[derive(Debug, Default)]
pub struct Tables(HashMap<String, Table>);

impl Tables {
    pub fn parse(text: &str) -> Result<Tables, RulesError> {
        let mut tables = read_tables(text)?;
        // Kept for long: no room for rules that will not come (a chain has one to three).
        for table in tables.values_mut() {
            table.chains.values_mut().for_each(Vec::shrink_to_fit);
        }
        Ok(Tables(tables))
    }

    /// The Service ports the tables define.
    pub fn ports(&self) -> Result<Vec<ServicePort>, RulesError> {
        let mut ports = match self.0.get("nat") {
            Some(nat) => services::from_nat(nat)?,
            None => Vec::new(),
        };
        if let Some(filter) = self.0.get("filter") {
            services::add_no_endpoint_services(filter, &mut ports)?;
        }
        Ok(ports)
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
                    let rule = tokenize::parse_rule(&words, line)?.1;
                    if services::is_read(table, chain, &rule) {
                        rules.push(rule);
                    }
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
        rules.shrink_to_fit();
        self.0
            .entry(table.to_owned())
            .or_default()
            .chains
            .insert(chain.to_owned(), rules);
        Ok(())
    }

    /// Forgets a chain that was deleted.
    pub fn remove_chain(&mut self, table: &str, chain: &str) {
        if let Some(table) = self.0.get_mut(table) {
            table.chains.remove(chain);
        }
    }
}

fn err(line: usize, message: impl Into<String>) -> RulesError {
    RulesError::Iptables {
        line,
        message: super::error_text(message.into()),
    }
}

pub(super) fn parse(text: &str) -> Result<Vec<ServicePort>, RulesError> {
    Tables::parse(text)?.ports()
}

/// Every `*table` ... `COMMIT` block, by table name.
fn read_tables(text: &str) -> Result<HashMap<String, Table>, RulesError> {
    let mut tables: HashMap<String, Table> = HashMap::new();
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
            tables.entry(name.to_owned()).or_default();
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
        } else {
            let table = tables.entry(table_name.clone()).or_default();
            read_line(table_name, table, trimmed, line)?;
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
    table: &mut Table,
    trimmed: &str,
    line: usize,
) -> Result<(), RulesError> {
    if let Some(declaration) = trimmed.strip_prefix(':') {
        let chain = declaration.split_whitespace().next().unwrap_or_default();
        if chain.is_empty() {
            return Err(err(line, "chain declaration without a name"));
        }
        table.chains.entry(chain.to_owned()).or_default();
    } else if trimmed.starts_with("-A ") {
        let words = tokenize::tokenize(trimmed, line)?;
        let (chain, rule) = tokenize::parse_rule(&words, line)?;
        // Only what the parsers read is kept (the chain's name always is).
        let keep = services::is_read(table_name, &chain, &rule);
        let rules = table.chains.entry(chain).or_default();
        if keep {
            rules.push(rule);
        }
    } else {
        return Err(err(
            line,
            format!("not an iptables-save line: {}", clip(trimmed)),
        ));
    }
    Ok(())
}

fn clip(text: &str) -> String {
    const MAX: usize = 60;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}
