//! `observer rules`: what kube-proxy's rules say, per network namespace (the table and
//! JSON writers are [`crate::report::rules_table`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::{FormatArg, Outcome, OutputFormat, emit};
use crate::naming::services::rules::ServiceMap;
use crate::naming::services::{NetnsInfo, SystemSource, list_namespaces, netns_inode, parse_dumps};
use crate::report::rules_table::{format_tables, json_lines};

#[derive(clap::Args, Debug, Clone, Default)]
#[command(mut_arg("format", |a| a.help(
    "`table` for people, `json` for one service record per line (the connection log's `service` lines)"
)))]
pub struct RulesArgs {
    #[command(flatten)]
    pub output: FormatArg,
    /// Only this network namespace: a path (/run/netns/NAME, /proc/PID/ns/net) or its
    /// inode number. Default: every namespace that has kube-proxy rules.
    #[arg(long, value_name = "PATH|INODE")]
    pub netns: Option<String>,
}

pub fn run(args: &RulesArgs) -> anyhow::Result<Outcome> {
    let found = read_rules(args.netns.as_deref())?;
    emit(&match args.output.format {
        OutputFormat::Json => json_lines(&found)?,
        OutputFormat::Table => format_tables(&found),
    })?;
    Ok(Outcome::Success)
}

/// The rules of the namespace `wanted` names, or of every namespace that has some.
fn read_rules(wanted: Option<&str>) -> anyhow::Result<Vec<(NetnsInfo, ServiceMap)>> {
    // Without the node's tools no namespace can be read: say why, not "no rules".
    SystemSource::check_tools()
        .map_err(|reason| anyhow::anyhow!("cannot read kube-proxy's rules: {reason}"))?;
    let source = SystemSource::new();
    let mut found = Vec::new();
    match wanted {
        Some(wanted) => {
            let info = resolve(wanted)?;
            let dumps = source
                .dump_path(&info.path)
                .with_context(|| format!("cannot read the rules of netns {}", info.inode))?;
            let (map, errors) = parse_dumps(&dumps);
            if map.is_empty() {
                if let Some(error) = errors.first() {
                    bail!("cannot read the rules of netns {}: {error}", info.inode);
                }
                bail!(
                    "netns {} ({}) has no kube-proxy rules{}",
                    info.inode,
                    info.path.display(),
                    problems_suffix(&dumps.problems)
                );
            }
            errors
                .iter()
                .for_each(|e| eprintln!("warning: netns {}: {e}", info.inode));
            found.push((info, map));
        }
        None => {
            for info in list_namespaces() {
                // Namespaces without rules, or whose rules cannot be read, are not listed.
                let Ok(dumps) = source.dump_path(&info.path) else {
                    continue;
                };
                let (map, errors) = parse_dumps(&dumps);
                errors
                    .iter()
                    .for_each(|e| eprintln!("warning: netns {}: {e}", info.inode));
                if !map.is_empty() {
                    found.push((info, map));
                }
            }
            if found.is_empty() {
                bail!(
                    "no network namespace has kube-proxy rules (iptables KUBE-SERVICES or nft table kube-proxy)"
                );
            }
        }
    }
    Ok(found)
}

fn problems_suffix(problems: &[String]) -> String {
    if problems.is_empty() {
        String::new()
    } else {
        format!(" ({})", problems.join("; "))
    }
}

/// A `--netns` argument: an inode number or a path.
fn resolve(wanted: &str) -> anyhow::Result<NetnsInfo> {
    if let Ok(inode) = wanted.parse::<u32>() {
        return list_namespaces()
            .into_iter()
            .find(|info| info.inode == inode)
            .with_context(|| format!("no process or /run/netns entry is in netns {inode}"));
    }
    let path = PathBuf::from(wanted);
    let inode = netns_inode(Path::new(&path))
        .with_context(|| format!("--netns {wanted}: not a network namespace path"))?;
    Ok(NetnsInfo { inode, path })
}
