//! One namespace's rules as last read, kept parsed so that an announced change is read
//! chain by chain: `iptables -t nat -S KUBE-SVC-...` takes milliseconds where
//! `iptables-save` of 5,000 Services takes a second, and only the chains read are
//! parsed again. kube-proxy's nftables table is patched from the announcements
//! themselves, which carry each new rule (only a changed named map is read again,
//! `nft -j list map`). Legacy tables are read whole.

use std::collections::BTreeSet;

use super::nft_changes::{Changes, Family, NftEvent};
use super::rules::{IptablesTables, NftTable, ServiceMap};
use super::{DumpFormat, DumpSource, Dumps, RulesPatchError};

/// Beyond this many changed iptables chains a full read is cheaper (each chain is one
/// `iptables -S`, milliseconds).
pub const MAX_PATCHED_CHAINS: usize = 100;

/// Beyond this many changed named sets or maps of kube-proxy's nftables table a full
/// read is as cheap (kube-proxy has seven).
pub const MAX_NFT_SETS: usize = 4;

/// One dump, parsed.
enum Part {
    /// `iptables-save` / `ip6tables-save` of nf_tables-backed tables.
    Patchable {
        family: Family,
        command: String,
        tables: IptablesTables,
        map: ServiceMap,
    },
    /// `nft -j list table ip kube-proxy` / `ip6`.
    Nft {
        family: Family,
        table: NftTable,
        map: ServiceMap,
    },
    /// Anything else: read whole when it changes.
    Fixed(ServiceMap),
}

/// The parsed dumps of one namespace.
pub struct ParsedRules {
    parts: Vec<Part>,
}

impl ParsedRules {
    /// Parses every dump. Parse errors are returned as messages naming the command;
    /// the other dumps still count.
    pub fn parse(dumps: &Dumps) -> (ParsedRules, Vec<String>) {
        let mut parts = Vec::new();
        let mut errors = Vec::new();
        for dump in &dumps.dumps {
            let parsed = match (dump.format, patchable_family(&dump.command, &dump.text)) {
                (DumpFormat::IptablesSave, Some(family)) => IptablesTables::parse(&dump.text)
                    .and_then(|tables| {
                        let map = ServiceMap::from_iptables_tables(&tables)?;
                        Ok(Part::Patchable {
                            family,
                            command: dump.command.clone(),
                            tables,
                            map,
                        })
                    }),
                (DumpFormat::IptablesSave, None) => {
                    ServiceMap::from_iptables_save(&dump.text).map(Part::Fixed)
                }
                (DumpFormat::NftJson, _) => NftTable::parse(&dump.text).and_then(|table| {
                    let map = ServiceMap::from_nft_table(&table)?;
                    Ok(match nft_family(&dump.command) {
                        Some(family) => Part::Nft { family, table, map },
                        None => Part::Fixed(map),
                    })
                }),
            };
            match parsed {
                Ok(part) => parts.push(part),
                Err(err) => errors.push(format!("{}: {err}", dump.command)),
            }
        }
        (ParsedRules { parts }, errors)
    }

    /// Every dump's Services, merged.
    pub fn map(&self) -> ServiceMap {
        let mut map = ServiceMap::default();
        for part in &self.parts {
            let (Part::Patchable { map: part, .. }
            | Part::Nft { map: part, .. }
            | Part::Fixed(part)) = part;
            map.merge(part.clone());
        }
        map
    }

    /// Reads the chains `changes` names from `source` and puts them in place. `Err`
    /// says why the namespace needs a full read instead (the parts may then be half
    /// patched: they are to be replaced).
    pub fn patch(
        &mut self,
        changes: &Changes,
        source: &mut dyn DumpSource,
        netns: u32,
    ) -> Result<usize, RulesPatchError> {
        let sets = changed_sets(changes)?;
        let mut touched = Vec::new();
        self.patch_chains(changes, source, netns, &mut touched)?;
        self.apply_nft_events(changes, &mut touched)?;
        self.reread_sets(sets, source, netns)?;
        self.rebuild_maps(touched)?;
        Ok(changes.len())
    }

    /// Replaces (or removes) each iptables-nft chain that changed with its listing now;
    /// adds the parts patched to `touched`.
    fn patch_chains(
        &mut self,
        changes: &Changes,
        source: &mut dyn DumpSource,
        netns: u32,
        touched: &mut Vec<usize>,
    ) -> Result<(), RulesPatchError> {
        for (chain, present) in &changes.chains {
            let index = self
                .parts
                .iter()
                .position(|part| matches!(part, Part::Patchable { family, .. } if *family == chain.family))
                .ok_or(RulesPatchError::NoIptablesNft(chain.family))?;
            let Part::Patchable {
                tables, command, ..
            } = &mut self.parts[index]
            else {
                unreachable!("found as patchable");
            };
            let table = chain.table.name();
            if *present {
                let listing = source.chain(netns, chain)?;
                tables
                    .replace_chain(table, &chain.chain, &listing)
                    .map_err(|err| RulesPatchError::ChainUnparsable {
                        command: command.clone(),
                        table,
                        chain: chain.chain.clone(),
                        err,
                    })?;
            } else {
                tables.remove_chain(table, &chain.chain);
            }
            if !touched.contains(&index) {
                touched.push(index);
            }
        }
        Ok(())
    }

    /// Applies the announced nftables events but set changes (re-read whole instead);
    /// adds the parts patched to `touched`.
    fn apply_nft_events(
        &mut self,
        changes: &Changes,
        touched: &mut Vec<usize>,
    ) -> Result<(), RulesPatchError> {
        for (family, event) in &changes.nft {
            let index = self.nft_part(*family)?;
            if let Part::Nft { table, .. } = &mut self.parts[index]
                && !matches!(event, NftEvent::Set { .. })
            {
                table.apply(event)?;
            }
            if !touched.contains(&index) {
                touched.push(index);
            }
        }
        Ok(())
    }

    /// Reads the named sets and maps that changed as they are now.
    fn reread_sets(
        &mut self,
        sets: BTreeSet<(Family, &str)>,
        source: &mut dyn DumpSource,
        netns: u32,
    ) -> Result<(), RulesPatchError> {
        // Named sets and maps as they are now, whatever the announcements said.
        for (family, name) in sets {
            let index = self.nft_part(family)?;
            let Part::Nft { table, .. } = &mut self.parts[index] else {
                unreachable!("found as an nftables table");
            };
            // A set the table has is listed as one; anything else is most likely a map.
            let listing = match table.is_set(name) {
                true => source.nft_object(netns, family, "set", name)?,
                false => match source.nft_object(netns, family, "map", name)? {
                    Some(listing) => Some(listing),
                    None => source.nft_object(netns, family, "set", name)?,
                },
            };
            table.replace_set(name, listing.as_deref()).map_err(|err| {
                RulesPatchError::SetUnparsable {
                    name: name.to_owned(),
                    err,
                }
            })?;
        }
        Ok(())
    }

    /// Rebuilds the Service map of every part that was patched.
    fn rebuild_maps(&mut self, touched: Vec<usize>) -> Result<(), RulesPatchError> {
        for index in touched {
            match &mut self.parts[index] {
                Part::Patchable {
                    tables,
                    map,
                    command,
                    ..
                } => {
                    *map = ServiceMap::from_iptables_tables(tables).map_err(|err| {
                        RulesPatchError::PatchedIptables {
                            command: command.clone(),
                            err,
                        }
                    })?;
                }
                Part::Nft { table, map, .. } => {
                    *map = ServiceMap::from_nft_table(table)
                        .map_err(|err| RulesPatchError::PatchedNft { err })?;
                }
                Part::Fixed(_) => {}
            }
        }
        Ok(())
    }

    /// The part holding kube-proxy's nftables table of `family`.
    fn nft_part(&self, family: Family) -> Result<usize, RulesPatchError> {
        self.parts
            .iter()
            .position(|part| matches!(part, Part::Nft { family: f, .. } if *f == family))
            .ok_or(RulesPatchError::NoNftTable(family))
    }
}

/// The nftables sets and maps that `changes` touch, or why `changes` cannot be patched
/// (not a chain's, or too many chains or sets).
fn changed_sets(changes: &Changes) -> Result<BTreeSet<(Family, &str)>, RulesPatchError> {
    if changes.everything {
        return Err(RulesPatchError::NotChainsOnly);
    }
    if changes.chains.len() > MAX_PATCHED_CHAINS {
        return Err(RulesPatchError::TooManyChains(changes.chains.len()));
    }
    let sets: BTreeSet<(Family, &str)> = changes
        .nft
        .iter()
        .filter_map(|(family, event)| match event {
            NftEvent::Set { name } => Some((*family, name.as_str())),
            _ => None,
        })
        .collect();
    if sets.len() > MAX_NFT_SETS {
        return Err(RulesPatchError::TooManySets(sets.len()));
    }
    Ok(sets)
}

/// The family of kube-proxy's nftables table a dump lists.
fn nft_family(command: &str) -> Option<Family> {
    match command {
        "nft -j list table ip kube-proxy" => Some(Family::V4),
        "nft -j list table ip6 kube-proxy" => Some(Family::V6),
        _ => None,
    }
}

/// The family of an iptables-nft dump (`# Generated by iptables-save v1.8.9
/// (nf_tables)`), whose changes nf_tables announces chain by chain.
fn patchable_family(command: &str, text: &str) -> Option<Family> {
    let family = match command {
        "iptables-save" => Family::V4,
        "ip6tables-save" => Family::V6,
        _ => return None,
    };
    text.lines()
        .take_while(|line| line.starts_with('#'))
        .any(|line| line.contains("(nf_tables)"))
        .then_some(family)
}

#[cfg(test)]
mod tests;
