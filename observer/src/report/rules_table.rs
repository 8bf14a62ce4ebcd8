//! What `observer rules` prints: per network namespace, each Service port, its
//! frontends, and its endpoints with the share of new connections the rules give each.

use chrono::Utc;

use crate::model::record::{EndpointShare, Frontend, FrontendKind, LogLine};
use crate::naming::services::NetnsInfo;
use crate::naming::services::rules::{ServiceMap, ServicePort};

/// One JSON service record per line (the connection log's `service` lines).
pub fn json_lines(found: &[(NetnsInfo, ServiceMap)]) -> serde_json::Result<String> {
    let now = Utc::now();
    let mut out = String::new();
    for (info, map) in found {
        for record in map.service_records(info.inode, now) {
            out.push_str(&serde_json::to_string(&LogLine::Service(record))?);
            out.push('\n');
        }
    }
    Ok(out)
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
    use std::path::PathBuf;

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
