//! Words shared by what is drawn (`view`) and what is exported (`export`).

use crate::model::record::Close;

/// How a connection ended, as the STATE column and `close` field say it.
pub fn close_text(close: Close) -> &'static str {
    match close {
        Close::Open => "open",
        Close::Fin => "fin",
        Close::Rst => "rst",
        Close::Timeout => "timeout",
        Close::Expired => "expired",
    }
}
