//! The lab by prefix, without a [`crate::Lab`] value: what exists, its status, and its
//! removal (also of a crashed run's leftovers).

use anyhow::Context;

use crate::sys::{self, is_lab_netns, list_netns, state_dir};
use crate::{LabState, check_prefix, check_root, containerd, dns, node_container, spec};

/// The namespaces of the lab with this prefix that exist now.
pub fn namespaces(prefix: &str) -> anyhow::Result<Vec<String>> {
    check_prefix(prefix)?;
    let ip = sys::find_tool("ip", "iproute2")?;
    Ok(list_netns(&ip)?
        .into_iter()
        .filter(|n| is_lab_netns(prefix, n))
        .collect())
}

/// Removes everything the lab with this prefix made: its processes (found through its
/// namespaces), its namespaces and its state directory. Returns what it removed.
pub fn down(prefix: &str) -> anyhow::Result<Vec<String>> {
    check_root()?;
    let ip = sys::find_tool("ip", "iproute2")?;
    let mut removed = Vec::new();
    for ns in namespaces(prefix)? {
        sys::remove_netns(&ip, &ns)?;
        removed.push(ns);
    }
    removed.extend(containerd::remove(prefix, &ip)?);
    // A node container's init died with the node namespace's processes; its cgroup stays.
    if node_container::remove_cgroup(prefix) {
        removed.push(format!("the node container's cgroup of {prefix}"));
    }
    // The client's resolv.conf (`Lab::serve_dns`), if a crashed run left it.
    let _ = std::fs::remove_dir_all(dns::netns_etc(&format!("{prefix}-client")));
    let dir = state_dir(prefix);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("could not remove {}", dir.display()))?;
        removed.push(dir.display().to_string());
    }
    Ok(removed)
}

/// A human-readable account of the lab with this prefix: its configuration, namespaces
/// and processes.
pub fn status(prefix: &str) -> anyhow::Result<String> {
    check_prefix(prefix)?;
    let ip = sys::find_tool("ip", "iproute2")?;
    let found = namespaces(prefix)?;
    let dir = state_dir(prefix);
    if found.is_empty() && !dir.exists() {
        return Ok(format!(
            "no lab with prefix `{prefix}` (`cargo xtask lab up` builds one)\n"
        ));
    }
    let mut out = String::new();
    match std::fs::read_to_string(dir.join("lab.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<LabState>(&s).ok())
    {
        Some(state) => out.push_str(&format!(
            "lab `{prefix}`: {} topology, {} rules; state in {}\n",
            state.topology,
            state.rules,
            dir.display()
        )),
        None => out.push_str(&format!(
            "lab `{prefix}`: no readable state in {} (a crashed run?)\n",
            dir.display()
        )),
    }
    for ns in &found {
        let pids = sys::netns_pids(&ip, ns)?;
        out.push_str(&format!("  {ns:<28} {} process(es)\n", pids.len()));
    }
    let expected = 2 + spec::pods(prefix).len();
    if found.len() != expected {
        out.push_str(&format!(
            "  {} of {expected} namespaces exist: `cargo xtask lab down --prefix {prefix}` cleans up\n",
            found.len()
        ));
    }
    Ok(out)
}
