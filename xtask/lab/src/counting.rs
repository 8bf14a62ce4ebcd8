//! The kernel's own count of DNAT decisions in the node: packet counters of the rules
//! that DNAT. Only a connection's first packet traverses the nat rules, so each
//! counted packet is one decision.

use super::sys::{in_netns, run};
use super::{Lab, RuleMode};

impl Lab {
    /// Makes `dnat_decisions` countable: nftables rules carry no counters as kube-proxy
    /// writes them, so each endpoint chain gets a `counter` rule in front of its
    /// `dnat`; iptables counts every rule already.
    pub fn install_dnat_counters(&self) -> anyhow::Result<()> {
        if self.config.rules == RuleMode::Iptables {
            return Ok(());
        }
        for chain in dnat_chains(&self.nft_listing()?) {
            run(
                in_netns(&self.tools.ip, &self.node_ns, &self.tools.nft).args([
                    "insert",
                    "rule",
                    "ip",
                    "kube-proxy",
                    &chain,
                    "counter",
                ]),
            )?;
        }
        Ok(())
    }

    /// DNAT decisions the node's rules made so far (compare two readings).
    pub fn dnat_decisions(&self) -> anyhow::Result<u64> {
        match self.config.rules {
            RuleMode::Iptables => {
                let out = run(
                    in_netns(&self.tools.ip, &self.node_ns, &self.tools.iptables_save)
                        .args(["-c", "-t", "nat"]),
                )?;
                Ok(iptables_dnat_packets(&String::from_utf8_lossy(&out.stdout)))
            }
            _ => Ok(nft_counter_packets(&self.nft_listing()?)),
        }
    }

    /// First packets of a new flow that conntrack merged into an entry another CPU made
    /// for the same flow a moment before (`conntrack -S`'s `clash_resolve`, summed over
    /// CPUs; compare two readings). Each also traversed the nat rules as NEW, so the
    /// rules' counters count one decision more for one connection: a UDP flow whose
    /// first datagrams the sender's migration put on two CPUs' backlogs at once.
    pub fn clashes_resolved(&self) -> anyhow::Result<u64> {
        let out = run(in_netns(&self.tools.ip, &self.node_ns, &self.tools.conntrack).arg("-S"))?;
        Ok(clash_resolve_sum(&String::from_utf8_lossy(&out.stdout)))
    }

    fn nft_listing(&self) -> anyhow::Result<String> {
        let out = run(
            in_netns(&self.tools.ip, &self.node_ns, &self.tools.nft).args([
                "list",
                "table",
                "ip",
                "kube-proxy",
            ]),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Chains of an `nft list table` listing that hold a `dnat` rule.
fn dnat_chains(listing: &str) -> Vec<String> {
    let mut chains = Vec::new();
    let mut current = None;
    for line in listing.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix("chain ")
            .and_then(|l| l.strip_suffix(" {"))
        {
            current = Some(name.trim_matches('"').to_owned());
        } else if line.contains("dnat to")
            && let Some(chain) = current.take()
        {
            chains.push(chain);
        }
    }
    chains
}

/// The sum of `counter packets N` in an `nft list` listing.
fn nft_counter_packets(listing: &str) -> u64 {
    listing
        .lines()
        .filter_map(|line| {
            let rest = line.split("counter packets ").nth(1)?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The sum of `clash_resolve=N` over the per-CPU lines of `conntrack -S` (0 where the
/// kernel does not count them).
fn clash_resolve_sum(stats: &str) -> u64 {
    stats
        .split_whitespace()
        .filter_map(|field| field.strip_prefix("clash_resolve=")?.parse::<u64>().ok())
        .sum()
}

/// The sum of the packet counters of `-j DNAT` rules in `iptables-save -c` output.
fn iptables_dnat_packets(save: &str) -> u64 {
    save.lines()
        .filter(|line| line.contains(" -j DNAT "))
        .filter_map(|line| {
            let counters = line.strip_prefix('[')?.split(']').next()?;
            counters.split(':').next()?.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_iptables_save_and_nft_listings() {
        let save = "*nat\n:KUBE-SEP-A - [0:0]\n[7:420] -A KUBE-SEP-A -s 10.244.1.12/32 -j KUBE-MARK-MASQ\n[7:420] -A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.12:8080\n[5:300] -A KUBE-SEP-B -p tcp -m tcp -j DNAT --to-destination 10.244.1.13:8080\nCOMMIT\n";
        assert_eq!(iptables_dnat_packets(save), 12);
        let listing = "table ip kube-proxy {\n\tchain endpoint-A-shop/checkout/http__10.244.1.12/8080 {\n\t\tcounter packets 4 bytes 240\n\t\tip saddr 10.244.1.12 jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat to 10.244.1.12:8080\n\t}\n\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n\tchain endpoint-B {\n\t\tmeta l4proto udp dnat to 10.244.1.20:5353\n\t}\n}\n";
        assert_eq!(
            dnat_chains(listing),
            [
                "endpoint-A-shop/checkout/http__10.244.1.12/8080",
                "endpoint-B"
            ]
        );
        assert_eq!(nft_counter_packets(listing), 4);
        let stats = "cpu=0   \tfound=0 invalid=2 insert=0 insert_failed=0 drop=0 early_drop=0 error=0 search_restart=0 clash_resolve=1 chaintoolong=0 \ncpu=1   \tfound=0 invalid=0 insert=0 insert_failed=0 drop=0 early_drop=0 error=0 search_restart=0 clash_resolve=2 chaintoolong=0 \n";
        assert_eq!(clash_resolve_sum(stats), 3);
        assert_eq!(clash_resolve_sum("cpu=0 found=0 insert_failed=0\n"), 0);
    }
}
