//! `d`: the DNS screen. Per client (most queries first): lookups, queries per lookup,
//! NXDOMAIN share, unanswered queries, then its walks (`www.example.com ->
//! www.example.com: 8 queries, 6 NXDOMAIN`), from the latest queries the view keeps.

use ratatui::layout::Rect;
use ratatui::text::Line;

use super::widgets::truncate;
use super::{BOLD, DIM};
use crate::report::dns::walk_line;
use crate::stats::dns::{CLUSTER_DOMAIN, per_client};
use crate::tui::state::App;

pub(super) fn dns_screen(app: &App, area: Rect) -> Vec<Line<'static>> {
    let width = usize::from(area.width);
    let name = width.saturating_sub(2 + 8 + 8 + 9 + 9 + 11).max(8);
    let mut lines = vec![Line::styled(
        truncate(
            &format!(
                "  {:<name$}{:>8}{:>8}{:>9}{:>9}{:>11}",
                "CLIENT", "LOOKUPS", "QUERIES", "Q/LOOKUP", "NXDOMAIN", "UNANSWERED"
            ),
            width,
        ),
        BOLD,
    )];
    let records: Vec<_> = app.dns.iter().cloned().collect();
    let clients = per_client(&records, CLUSTER_DOMAIN);
    if clients.is_empty() {
        lines.push(Line::styled(
            "  no DNS query to a port-53 Service seen yet",
            DIM,
        ));
        return lines;
    }
    let rows = usize::from(area.height).saturating_sub(1);
    for client in clients {
        let label = match (&client.client_pod, app.pod_names) {
            (Some(pod), true) => pod.clone(),
            _ => client.client.to_string(),
        };
        lines.push(Line::raw(truncate(
            &format!(
                "  {:<name$}{:>8}{:>8}{:>9.2}{:>8.0}%{:>11}",
                truncate(&label, name.saturating_sub(1)),
                client.lookups,
                client.queries,
                client.queries_per_lookup,
                client.nxdomain_share * 100.0,
                client.unanswered
            ),
            width,
        )));
        for walk in &client.walks {
            lines.push(Line::styled(
                truncate(&format!("    {}", walk_line(walk)), width),
                DIM,
            ));
        }
    }
    lines.truncate(rows.max(2));
    lines
}
