//! What a Service port puts into kube-proxy's sets and maps, and its chains' names.

use super::{ENDPOINTS_MAP, Layout, REJECT_CHAIN};
use crate::names::{nft_endpoint_base, nft_service_base};
use crate::spec::{Family, Service};

/// One element of a set or map: what kube-proxy's `ensureElem` is handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Element {
    pub(super) container: &'static str,
    pub(super) key: String,
    pub(super) value: Option<String>,
    pub(super) comment: Option<String>,
}

impl Element {
    /// `add element` into `table` (such as `ip kube-proxy`).
    pub(super) fn add(&self, table: &str) -> String {
        let comment = self
            .comment
            .as_ref()
            .map(|c| format!(" comment \"{c}\""))
            .unwrap_or_default();
        let value = self
            .value
            .as_ref()
            .map(|v| format!(" : {v}"))
            .unwrap_or_default();
        format!(
            "add element {table} {} {{ {}{comment}{value} }}",
            self.container, self.key
        )
    }

    pub(super) fn delete(table: &str, container: &str, key: &str) -> String {
        format!("delete element {table} {container} {{ {key} }}")
    }
}

/// The chain names kube-proxy derives for one Service port.
pub(super) struct Names {
    pub(super) service: String,
    /// The Local policy's chain (this node's endpoints).
    pub(super) local: String,
    pub(super) external: String,
    /// Each endpoint's chain, in kube-proxy's order.
    pub(super) endpoints: Vec<(std::net::SocketAddr, String)>,
    /// Each endpoint's ClientIP affinity set, in the same order.
    pub(super) affinity: Vec<String>,
}

pub(super) fn names(svc: &Service, family: Family) -> Names {
    let proto = svc.proto.as_str();
    let base = nft_service_base(&svc.namespace, &svc.name, proto, &svc.port_name);
    let bases: Vec<(std::net::SocketAddr, String)> = svc
        .endpoint_addrs_in(family)
        .into_iter()
        .map(|ep| {
            let b = nft_endpoint_base(&svc.namespace, &svc.name, proto, &svc.port_name, ep);
            (ep, b)
        })
        .collect();
    Names {
        service: format!("service-{base}"),
        local: format!("local-{base}"),
        external: format!("external-{base}"),
        affinity: bases.iter().map(|(_, b)| format!("affinity-{b}")).collect(),
        endpoints: bases
            .into_iter()
            .map(|(ep, b)| (ep, format!("endpoint-{b}")))
            .collect(),
    }
}

/// The elements a Service port puts into kube-proxy's sets and maps.
pub(super) fn elements(svc: &Service, family: Family, layout: Layout) -> Vec<Element> {
    let n = names(svc, family);
    let cluster_ip = family.ip(svc.cluster_ip);
    let proto = svc.proto.as_str();
    let has_endpoints = !svc.endpoints.is_empty();
    let spn = svc.port_name_string();
    let ip_key = format!("{cluster_ip} . {proto} . {}", svc.port);
    let mut out = vec![Element {
        container: "cluster-ips",
        key: cluster_ip.to_string(),
        value: None,
        comment: None,
    }];
    if has_endpoints && layout == Layout::Dispatch {
        let endpoints = svc.endpoint_addrs_in(family);
        for (i, ep) in endpoints.iter().enumerate() {
            out.push(Element {
                container: ENDPOINTS_MAP,
                key: format!("{ip_key} . {i}"),
                value: Some(format!("{} . {}", ep.ip(), ep.port())),
                comment: None,
            });
        }
        out.push(Element {
            container: "service-ips",
            key: ip_key,
            value: Some(format!("goto dispatch-{}", endpoints.len())),
            comment: Some(spn.clone()),
        });
    } else if has_endpoints {
        out.push(Element {
            container: "service-ips",
            key: ip_key,
            value: Some(format!("goto {}", super::policies::internal_chain(svc, &n))),
            comment: None,
        });
    } else {
        out.push(Element {
            container: "no-endpoint-services",
            key: ip_key,
            value: Some(format!("goto {REJECT_CHAIN}")),
            comment: Some(spn.clone()),
        });
    }
    if let Some(np) = svc.node_port {
        let key = format!("{proto} . {np}");
        if has_endpoints {
            out.push(Element {
                container: "service-nodeports",
                key: key.clone(),
                value: Some(format!("goto {}", n.external)),
                comment: None,
            });
        }
        // No endpoints (reject), or none on this node for the Local policy (drop what
        // the external chain did not short-circuit).
        let no_local = svc.traffic.external_local && svc.local_endpoint_addrs().is_empty();
        if !has_endpoints || no_local {
            let verdict = match has_endpoints {
                true => "drop".to_owned(),
                false => format!("goto {REJECT_CHAIN}"),
            };
            out.push(Element {
                container: "no-endpoint-nodeports",
                key,
                value: Some(verdict),
                comment: Some(spn),
            });
        }
    }
    out
}
