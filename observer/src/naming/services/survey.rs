//! What a node's Service datapath is, looked at once when observer starts: whether any
//! network namespace holds kube-proxy's rules (which observer follows), whether
//! kube-proxy runs in IPVS mode, and whether a kube-proxy-free datapath is loaded
//! (Cilium or Calico eBPF: their BPF programs pick a backend at connect time or in
//! BPF, which leaves no conntrack DNAT to see). Where observer would otherwise show "no
//! Service seen yet" forever, one sentence says what it found and what it cannot see.

use std::path::{Path, PathBuf};

/// What the look found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Survey {
    /// Network namespaces looked at.
    pub checked: usize,
    /// Those that hold kube-proxy's iptables or nftables rules.
    pub with_rules: usize,
    /// Those that hold only DNAT rules no kube-proxy chain name or comment names (such
    /// as Docker's for its embedded DNS server, in a container on a user-defined
    /// network): observer follows them and shows their connections by address.
    pub with_other_dnat: usize,
    /// IPVS holds virtual services (kube-proxy's IPVS mode).
    pub ipvs: bool,
    /// A kube-proxy-free datapath's name and some of its loaded programs' names.
    pub bpf_datapath: Option<(&'static str, Vec<String>)>,
}

impl Survey {
    /// One sentence when observer will not see (all) Service traffic here; `None` when
    /// kube-proxy's rules were found and nothing else balances Services.
    pub fn sentence(&self) -> Option<String> {
        let datapath = self.bpf_datapath.as_ref().map(|(name, programs)| {
            format!(
                "{name}'s BPF programs are loaded ({}), which pick backends at connect time or in BPF, where conntrack shows no DNAT",
                programs.join(", ")
            )
        });
        match (self.with_rules > 0, self.ipvs, datapath) {
            (true, _, None) => None,
            (true, _, Some(datapath)) => Some(format!(
                "kube-proxy's rules are in {} network namespace{}, but {datapath}: observer sees only the connections kube-proxy's rules DNAT",
                self.with_rules,
                plural(self.with_rules)
            )),
            (false, _, Some(datapath)) => Some(format!(
                "no kube-proxy rules in any of {} network namespace{} looked at; this node is kube-proxy-free: {datapath}: observer cannot see its Service decisions",
                self.checked,
                plural(self.checked)
            )),
            (false, true, None) => Some(format!(
                "no kube-proxy iptables or nftables rules in any of {} network namespace{} looked at, and IPVS holds virtual services: kube-proxy runs in IPVS mode, whose choices observer does not read: connections show without a Service",
                self.checked,
                plural(self.checked)
            )),
            (false, false, None) => Some(format!(
                "no kube-proxy rules in any of {} network namespace{} looked at, no IPVS, no kube-proxy-free datapath: nothing here DNATs Service traffic as kube-proxy does, so observer will show no Service{}",
                self.checked,
                plural(self.checked),
                self.other_dnat()
            )),
        }
    }

    /// What the sentence adds when other DNAT rules were found.
    fn other_dnat(&self) -> String {
        match self.with_other_dnat {
            0 => String::new(),
            n => format!(
                " (DNAT rules that no kube-proxy chain or comment names, in {n} of them, are followed: their connections show by address)"
            ),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Which kube-proxy-free datapath a loaded BPF program belongs to, by its name's
/// prefix: Cilium names its programs `cil_*` (`cil_sock4_connect`, `cil_from_container`),
/// Calico `calico_*`/`cali_*` (`calico_connect_v4`, `cali_tc_preamble`).
pub fn datapath_of(program: &str) -> Option<&'static str> {
    if program.starts_with("cil_") {
        Some("Cilium")
    } else if program.starts_with("calico_") || program.starts_with("cali_") {
        Some("Calico eBPF")
    } else {
        None
    }
}

/// Whether `/proc/net/ip_vs` text lists a virtual service (a `TCP`, `UDP` or `SCTP` line
/// after the header).
pub fn ipvs_has_services(text: &str) -> bool {
    text.lines().any(|line| {
        ["TCP ", "UDP ", "SCTP "]
            .iter()
            .any(|p| line.starts_with(p))
    })
}

/// The namespaces worth looking at, most likely a node's first: observer's own, those
/// of `kube-proxy` and `kubelet` processes, then those named in /run/netns (a lab's
/// nodes, and CNI's pod namespaces), at most `limit`.
pub fn candidate_namespaces(limit: usize) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("/proc/self/ns/net")];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            if matches!(comm.trim(), "kube-proxy" | "kubelet") {
                out.push(entry.path().join("ns/net"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        let mut named: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        named.sort();
        out.extend(named);
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|path| super::netns_inode(path).is_ok_and(|inode| seen.insert(inode)));
    out.truncate(limit);
    out
}

/// IPVS's table as a process of the namespace sees it (`/proc/<pid>/net/ip_vs`).
pub fn ipvs_in(namespace: &Path) -> bool {
    let net = namespace.parent().map(|ns| ns.with_file_name("net/ip_vs"));
    let path = match namespace.to_str() {
        Some("/proc/self/ns/net") => PathBuf::from("/proc/self/net/ip_vs"),
        _ => match net {
            Some(path) if namespace.starts_with("/proc") => path,
            _ => return false,
        },
    };
    std::fs::read_to_string(path).is_ok_and(|text| ipvs_has_services(&text))
}

/// Looks at the node: the candidate namespaces' rules (until one has kube-proxy's),
/// IPVS, and the BPF programs loaded.
pub fn look(source: &super::SystemSource) -> Survey {
    let mut survey = Survey::default();
    for path in candidate_namespaces(32) {
        survey.checked += 1;
        survey.ipvs |= ipvs_in(&path);
        let dumps = match source.dump_path(&path) {
            Ok(dumps) => dumps,
            Err(error) => {
                log::debug!("survey: {}: rules not read: {error}", path.display());
                continue;
            }
        };
        let map = super::parse_dumps(&dumps).0;
        if map.has_kube_proxy_services() {
            log::debug!("survey: {}: kube-proxy's rules", path.display());
            survey.with_rules += 1;
            break;
        }
        if !map.is_empty() {
            log::debug!("survey: {}: DNAT rules of others", path.display());
            survey.with_other_dnat += 1;
        }
    }
    survey.bpf_datapath = bpf_datapath();
    log::debug!("survey: {survey:?}");
    survey
}

/// The first kube-proxy-free datapath among the loaded BPF programs, with up to three
/// of its programs' names.
fn bpf_datapath() -> Option<(&'static str, Vec<String>)> {
    let mut found: Option<(&'static str, Vec<String>)> = None;
    for info in aya::programs::loaded_programs().flatten() {
        let Some(name) = info.name_as_str().map(str::to_owned) else {
            continue;
        };
        let Some(datapath) = datapath_of(&name) else {
            continue;
        };
        let entry = found.get_or_insert((datapath, Vec::new()));
        if entry.0 == datapath && entry.1.len() < 3 && !entry.1.contains(&name) {
            entry.1.push(name);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_node_that_hides_service_traffic_gets_a_sentence() {
        let healthy = Survey {
            checked: 3,
            with_rules: 1,
            ..Survey::default()
        };
        assert_eq!(healthy.sentence(), None);
        let cilium = Survey {
            checked: 1,
            with_rules: 0,
            with_other_dnat: 0,
            ipvs: false,
            bpf_datapath: Some(("Cilium", vec!["cil_sock4_connect".to_owned()])),
        };
        let text = cilium.sentence().unwrap();
        assert!(text.contains("kube-proxy-free"), "{text}");
        assert!(text.contains("cil_sock4_connect"), "{text}");
        let ipvs = Survey {
            checked: 2,
            ipvs: true,
            ..Survey::default()
        };
        assert!(ipvs.sentence().unwrap().contains("IPVS mode"));
        let nothing = Survey {
            checked: 2,
            ..Survey::default()
        };
        assert!(
            nothing
                .sentence()
                .unwrap()
                .starts_with("no kube-proxy rules in any of 2 network namespaces")
        );
        // Docker's embedded DNS rules (a container on a user-defined network) are no
        // kube-proxy rules; the sentence says they are followed.
        let docker_dns = Survey {
            checked: 2,
            with_other_dnat: 1,
            ..Survey::default()
        };
        let text = docker_dns.sentence().unwrap();
        assert!(
            text.starts_with("no kube-proxy rules in any of 2"),
            "{text}"
        );
        assert!(text.contains("observer will show no Service (DNAT rules that no kube-proxy chain or comment names, in 1 of them"), "{text}");
        let both = Survey {
            with_rules: 1,
            bpf_datapath: Some(("Calico eBPF", vec!["calico_connect_v4".to_owned()])),
            ..healthy
        };
        assert!(
            both.sentence()
                .unwrap()
                .contains("only the connections kube-proxy's rules DNAT")
        );
    }

    #[test]
    fn datapaths_by_program_name_and_ipvs_by_its_table() {
        assert_eq!(datapath_of("cil_from_container"), Some("Cilium"));
        assert_eq!(datapath_of("calico_connect_v4"), Some("Calico eBPF"));
        assert_eq!(datapath_of("net_dev_queue"), None);
        let header = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n";
        assert!(!ipvs_has_services(header));
        assert!(ipvs_has_services(&format!(
            "{header}TCP  0A60000A:0050 rr\n  -> 0AF40102:1F90      Masq    1      0          0\n"
        )));
    }
}
