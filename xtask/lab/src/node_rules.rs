//! Loading the generated kube-proxy rules into the node, as kube-proxy's sync loop does,
//! and reading them back.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::spec::{Family, Service};
use crate::sys::{in_netns, run, run_with_input};
use crate::{Lab, RuleMode, iptables, nftables};

impl Lab {
    /// The node's NAT rules: `iptables-save -t nat`, or `nft -j list table ip kube-proxy`
    /// (`ip6` when the Services are IPv6 only).
    pub fn rules_dump(&self) -> anyhow::Result<String> {
        let out = match self.config.rules {
            RuleMode::Iptables => {
                run(
                    in_netns(&self.tools.ip, &self.node_ns, &self.tools.iptables_save)
                        .args(["-t", "nat"]),
                )?
            }
            _ => run(
                in_netns(&self.tools.ip, &self.node_ns, &self.tools.nft).args([
                    "-j",
                    "list",
                    "table",
                    self.families[0].nft(),
                    "kube-proxy",
                ]),
            )?,
        };
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes the rules for the current Services, as kube-proxy's sync loop does:
    /// `previous = None` is its first (full) sync.
    pub(crate) fn sync_rules(&mut self, previous: Option<&[Service]>) -> anyhow::Result<()> {
        match self.config.rules {
            RuleMode::Iptables => self.sync_iptables(previous),
            _ => self.sync_nftables(previous),
        }
    }

    fn sync_iptables(&self, previous: Option<&[Service]>) -> anyhow::Result<()> {
        let ip = &self.tools.ip;
        let restore = || {
            let mut cmd = in_netns(ip, &self.node_ns, &self.tools.iptables_restore);
            cmd.args(["-w", "5", "--noflush", "--counters"]);
            cmd
        };
        let existing = match previous {
            None => {
                run_with_input(&mut restore(), &iptables::setup())
                    .context("could not load kube-proxy's iptables jump rules")?;
                Vec::new()
            }
            Some(_) => {
                let save = run(
                    in_netns(ip, &self.node_ns, &self.tools.iptables_save).args(["-t", "nat"])
                )?;
                iptables::chains_in_save(&String::from_utf8_lossy(&save.stdout))
            }
        };
        run_with_input(
            &mut restore(),
            &iptables::sync(&self.services, previous, &existing),
        )
        .context("could not load kube-proxy's iptables rules")?;
        Ok(())
    }

    fn sync_nftables(&mut self, previous: Option<&[Service]>) -> anyhow::Result<()> {
        let layout = self.config.rules.nft_layout();
        let special = self
            .services
            .iter()
            .find(|s| s.traffic != Default::default());
        if let (Some(svc), Some(layout)) = (special, layout)
            && layout != nftables::Layout::V1_35
        {
            anyhow::bail!(
                "the lab writes {}'s traffic policy or affinity in the 1.35 nftables layout only, not {}",
                svc.port_name_string(),
                self.config.rules
            );
        }
        for family in self.families.clone() {
            self.sync_nftables_family(family, previous)?;
        }
        Ok(())
    }

    /// One proxier's sync: `table ip kube-proxy` or `table ip6 kube-proxy`.
    fn sync_nftables_family(
        &mut self,
        family: Family,
        previous: Option<&[Service]>,
    ) -> anyhow::Result<()> {
        let ip = self.tools.ip.clone();
        let nft_f = || {
            let mut cmd = in_netns(&ip, &self.node_ns, &self.tools.nft);
            cmd.args(["-f", "-"]);
            cmd
        };
        let second_ago = Instant::now() - Duration::from_secs(1);
        let (old, young): (Vec<_>, Vec<_>) = std::mem::take(&mut self.stale_nft_chains)
            .into_iter()
            .partition(|(f, _, t)| *f == family && *t < second_ago);
        self.stale_nft_chains = young;
        if !old.is_empty() {
            let chains: Vec<String> = old.into_iter().map(|(_, c, _)| c).collect();
            run_with_input(&mut nft_f(), &nftables::delete_chains(family, &chains))
                .context("could not delete stale nftables chains")?;
        }
        let existing = match previous {
            None => Vec::new(),
            Some(_) => {
                let list = run(in_netns(&ip, &self.node_ns, &self.tools.nft).args([
                    "-j",
                    "list",
                    "chains",
                    family.nft(),
                ]))?;
                nftables::chains_in_json(&String::from_utf8_lossy(&list.stdout))
                    .context("could not read `nft -j list chains`")?
            }
        };
        let layout = self
            .config
            .rules
            .nft_layout()
            .unwrap_or(nftables::Layout::V1_35);
        let sync = nftables::sync_family(family, &self.services, previous, &existing, layout);
        run_with_input(&mut nft_f(), &sync.script)
            .context("could not load kube-proxy's nftables rules")?;
        let now = Instant::now();
        // A chain still waiting for its deletion is listed stale again by every sync
        // until then: it keeps its first date (deleting it twice would fail).
        for chain in sync.stale_chains {
            if !self
                .stale_nft_chains
                .iter()
                .any(|(f, c, _)| *f == family && *c == chain)
            {
                self.stale_nft_chains.push((family, chain, now));
            }
        }
        Ok(())
    }
}
