//! Why kube-proxy's rules of a namespace could not be read.

use std::path::PathBuf;
use std::process::ExitStatus;

use super::nft_changes::Family;
use super::rules::RulesError;

/// Why reading a namespace's rules (a whole dump, one chain, one nftables object)
/// failed. `Display` is the sentence that ends up in warnings and debug lines.
#[derive(Debug, thiserror::Error)]
pub enum RulesReadError {
    /// No process or `/run/netns` entry opens the namespace.
    #[error("no process or /run/netns entry is in this namespace")]
    NamespaceUnreachable,
    /// The namespace file's inode could not be read.
    #[error("{}: {err}", path.display())]
    NamespaceUnknown { path: PathBuf, err: std::io::Error },
    /// A namespace file to enter could not be opened.
    #[error("cannot open {}: {err}", path.display())]
    CannotOpen { path: PathBuf, err: std::io::Error },
    /// Neither this root nor the node's holds a tool; the sentence says why and what to do.
    #[error("{0}")]
    NoTools(String),
    /// This process lacks a capability that running the tools needs.
    #[error("this process lacks {cap}, which observer needs {why}")]
    MissingCapability {
        cap: &'static str,
        why: &'static str,
    },
    /// The one tool that reads this object is not installed.
    #[error("{program} not found")]
    ToolMissing { program: &'static str },
    /// The tool could not be started.
    #[error("{command}: {err}")]
    CannotRun {
        command: String,
        err: std::io::Error,
    },
    /// The tool failed; `stderr` is the first line it printed there.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    /// The tool printed something that is not UTF-8.
    #[error("{command}: not UTF-8")]
    NotUtf8 { command: String },
    /// The source reads namespaces whole only.
    #[error("this source reads no single chains")]
    NoSingleChains,
    /// The source reads namespaces whole only.
    #[error("this source reads no single nftables objects")]
    NoSingleObjects,
    /// A source other than the node's tools (fixtures, replays), in its own words.
    #[error("{0}")]
    Source(String),
}

/// Why announced changes could not be patched into a namespace's parsed rules: the
/// namespace is then read whole.
#[derive(Debug, thiserror::Error)]
pub enum RulesPatchError {
    /// A change other than a chain's or a set's (or lost announcements).
    #[error("a change that is not a chain's")]
    NotChainsOnly,
    /// So many chains changed that a full read is cheaper.
    #[error("{0} chains changed")]
    TooManyChains(usize),
    /// So many named sets or maps changed that a full read is as cheap.
    #[error("{0} nftables sets or maps changed")]
    TooManySets(usize),
    /// A chain changed in a family whose iptables-nft tables were not read.
    #[error("no {0:?} iptables-nft tables were read")]
    NoIptablesNft(Family),
    /// An nftables change in a family whose kube-proxy table was not read.
    #[error("no {0:?} nftables table kube-proxy was read")]
    NoNftTable(Family),
    /// A chain or set could not be read.
    #[error(transparent)]
    Read(#[from] RulesReadError),
    /// A chain's listing could not be parsed.
    #[error("{command} -t {table} -S {chain}: {err}")]
    ChainUnparsable {
        command: String,
        table: &'static str,
        chain: String,
        err: RulesError,
    },
    /// A named set or map's listing could not be parsed.
    #[error("nft -j list map {name}: {err}")]
    SetUnparsable { name: String, err: RulesError },
    /// The patched iptables tables no longer make a Service map.
    #[error("{command} patched: {err}")]
    PatchedIptables { command: String, err: RulesError },
    /// The patched nftables table no longer makes a Service map.
    #[error("kube-proxy's nftables table patched: {err}")]
    PatchedNft { err: RulesError },
    /// A named set's change is read with nft, not taken from announcements.
    #[error("set {name} is read with nft, not from announcements")]
    SetAnnounced { name: String },
    /// A rule uses an anonymous map whose elements were not announced.
    #[error("the elements of {set} were not announced")]
    ElementsNotAnnounced { set: String },
}

/// Why a namespace's rule changes cannot be watched (announced or polled): its rules are
/// then re-read on a timer.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {}: {failure}", path.display())]
pub struct WatchError {
    /// The file that opens the namespace.
    pub path: PathBuf,
    pub failure: WatchFailure,
}

/// What failed in [`WatchError`].
#[derive(Debug, thiserror::Error)]
pub enum WatchFailure {
    /// The namespace could not be entered.
    #[error("{0}")]
    Enter(crate::netns::EnterError),
    /// No netlink socket for nf_tables' announcements.
    #[error("netlink socket: {0}")]
    NetlinkSocket(nix::errno::Errno),
    /// The netlink socket could not join nf_tables' announcements.
    #[error("joining nf_tables' announcements: {0}")]
    JoinAnnouncements(nix::errno::Errno),
    /// No raw socket to read legacy tables through.
    #[error("raw socket: {0}")]
    RawSocket(nix::errno::Errno),
}
