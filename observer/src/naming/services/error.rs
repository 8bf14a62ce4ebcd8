//! Why kube-proxy's rules of a namespace could not be read.

use std::path::PathBuf;
use std::process::ExitStatus;

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
