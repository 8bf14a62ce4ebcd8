//! `observer rules`: what kube-proxy's rules say, per network namespace: each Service
//! port, its frontends, and its endpoints with the share of new connections the rules
//! give each.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use chrono::Utc;

use crate::naming::{NetnsInfo, SystemSource, list_namespaces, netns_inode, parse_dumps};
use crate::record::{EndpointShare, Frontend, FrontendKind, LogLine};
use crate::rules::{ServiceMap, ServicePort};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct RulesArgs {
    /// Print one JSON service record per line (the connection log's format).
    #[arg(long)]
    pub json: bool,
    /// Only this network namespace: a path (/run/netns/NAME, /proc/PID/ns/net) or its
    /// inode number. Default: every namespace that has kube-proxy rules.
    #[arg(long, value_name = "PATH|INODE")]
    pub netns: Option<String>,
}

pub fn run(args: &RulesArgs) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    render(args, &mut stdout)
}

/// Writes what `run` prints to `out`.
pub fn render(args: &RulesArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let source = SystemSource::new();
    let mut found = Vec::new();
    match &args.netns {
        Some(wanted) => {
            let info = resolve(wanted)?;
            let dumps = source
                .dump_path(&info.path)
                .map_err(anyhow::Error::msg)
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
    if args.json {
        let now = Utc::now();
        for (info, map) in &found {
            for record in map.service_records(info.inode, now) {
                serde_json::to_writer(&mut *out, &LogLine::Service(record))?;
                writeln!(out)?;
            }
        }
    } else {
        out.write_all(format_tables(&found).as_bytes())?;
    }
    out.flush()?;
    Ok(())
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

fn frontend_text(frontend: &Frontend) -> String {
    let addr = |ip: std::net::IpAddr| std::net::SocketAddr::new(ip, frontend.port).to_string();
    match (frontend.kind, frontend.ip) {
        (FrontendKind::NodePort, _) | (_, None) => format!("NodePort {}", frontend.port),
        (FrontendKind::ClusterIp, Some(ip)) => addr(ip),
        (FrontendKind::ExternalIp, Some(ip)) => format!("{} (external)", addr(ip)),
        (FrontendKind::LoadBalancer, Some(ip)) => format!("{} (LB)", addr(ip)),
    }
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn local_share(port: &ServicePort, endpoint: &EndpointShare) -> String {
    port.local_endpoints
        .iter()
        .flatten()
        .find(|local| local.addr == endpoint.addr)
        .map_or_else(String::new, |local| percent(local.expected_share))
}

/// One aligned table per namespace; a Service port takes as many rows as it has
/// frontends or endpoints.
pub fn format_tables(found: &[(NetnsInfo, ServiceMap)]) -> String {
    let mut text = String::new();
    for (index, (info, map)) in found.iter().enumerate() {
        if index > 0 {
            text.push('\n');
        }
        text.push_str(&format!("netns {} ({})\n", info.inode, info.path.display()));
        let with_local = map.services().any(|p| p.local_endpoints.is_some());
        let mut rows: Vec<Vec<String>> = vec![
            [
                "SERVICE",
                "PROTO",
                "FRONTEND",
                "ENDPOINT",
                "SHARE",
                "LOCAL SHARE",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for port in map.services() {
            let frontends: Vec<String> = port.frontends.iter().map(frontend_text).collect();
            let endpoints: Vec<(String, String, String)> = if port.endpoints.is_empty() {
                vec![("(no endpoints)".to_owned(), String::new(), String::new())]
            } else {
                port.endpoints
                    .iter()
                    .map(|e| {
                        (
                            e.addr.to_string(),
                            percent(e.expected_share),
                            local_share(port, e),
                        )
                    })
                    .collect()
            };
            for row in 0..frontends.len().max(endpoints.len()) {
                let (endpoint, share, local) = endpoints.get(row).cloned().unwrap_or_default();
                let first = row == 0;
                rows.push(vec![
                    if first {
                        port.name.clone()
                    } else {
                        String::new()
                    },
                    if first {
                        port.proto.to_string()
                    } else {
                        String::new()
                    },
                    frontends.get(row).cloned().unwrap_or_default(),
                    endpoint,
                    share,
                    local,
                ]);
            }
        }
        let columns = if with_local { 6 } else { 5 };
        let widths: Vec<usize> = (0..columns)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for row in &rows {
            let mut line = String::new();
            for (c, cell) in row.iter().take(columns).enumerate() {
                // Shares are right-aligned so the decimal points line up.
                let right = c >= 4;
                let cell = if right {
                    format!("{cell:>width$}", width = widths[c])
                } else {
                    format!("{cell:<width$}", width = widths[c])
                };
                line.push_str(&cell);
                line.push_str("  ");
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lists_frontends_endpoints_and_shares_aligned() {
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/rules/iptables/mixed-v4-full.saved"
        ));
        let map = ServiceMap::from_iptables_save(text).unwrap();
        let info = NetnsInfo {
            inode: 4026532301,
            path: PathBuf::from("/run/netns/node1"),
        };
        let table = format_tables(&[(info, map)]);
        let expected = "\
netns 4026532301 (/run/netns/node1)
SERVICE                          PROTO  FRONTEND                     ENDPOINT           SHARE  LOCAL SHARE
kube-system/kube-dns:dns-tcp     tcp    10.96.0.10:53                10.244.0.2:53      50.0%
                                                                     10.244.0.3:53      50.0%
shop/checkout:http               tcp    10.96.35.226:80              10.244.1.13:3000   33.3%
                                                                     10.244.1.14:3000   33.3%
                                                                     10.244.2.7:3000    33.3%
shop/checkout:metrics            tcp    10.96.35.226:9090            10.244.1.13:9100  100.0%
shop/empty:http                  tcp    10.96.200.1:80               (no endpoints)
                                        NodePort 30200
web-team/front-end.v2:https-alt  tcp    10.96.77.7:443               10.244.1.20:8443   25.0%        50.0%
                                        NodePort 30443               10.244.1.21:8443   25.0%        50.0%
                                        203.0.113.10:443 (external)  10.244.2.20:8443   25.0%
                                        198.51.100.20:443 (LB)       10.244.3.20:8443   25.0%
kube-system/kube-dns:dns         udp    10.96.0.10:53                10.244.0.2:53      50.0%
                                                                     10.244.0.3:53      50.0%
";
        assert_eq!(table, expected);
    }
}
