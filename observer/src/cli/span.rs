//! `--since`, `--until`, `--since-mark`, `--until-mark` of `check` and `summary`: which part
//! of a recording to judge ([`crate::model::span`] says what belongs to it).

use anyhow::bail;
use chrono::{DateTime, Utc};

use crate::model::record::Recording;
use crate::model::span::Span;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct SpanArgs {
    /// Only the traffic from TIME on (RFC 3339, e.g. 2026-08-06T13:46:36Z): connections
    /// open at any moment since, with all their requests.
    #[arg(long, value_name = "TIME", value_parser = rfc3339, conflicts_with = "since_mark")]
    pub since: Option<DateTime<Utc>>,
    /// Only the traffic before TIME (RFC 3339), judged against the rules as they were then.
    #[arg(long, value_name = "TIME", value_parser = rfc3339, conflicts_with = "until_mark")]
    pub until: Option<DateTime<Utc>>,
    /// From the mark NAME on (written by `observer mark NAME --log FILE` while recording).
    #[arg(long, value_name = "NAME")]
    pub since_mark: Option<String>,
    /// Until the mark NAME.
    #[arg(long, value_name = "NAME")]
    pub until_mark: Option<String>,
}

fn rfc3339(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|time| time.with_timezone(&Utc))
        .map_err(|_| format!("`{text}` is not an RFC 3339 time (e.g. 2026-08-06T13:46:36Z)"))
}

impl SpanArgs {
    /// The window asked for, marks looked up in `recording` (`file` names it in errors);
    /// `None` when no flag was given.
    pub fn span(&self, recording: &Recording, file: &str) -> anyhow::Result<Option<Span>> {
        let mark = |name: &Option<String>| -> anyhow::Result<Option<DateTime<Utc>>> {
            let Some(name) = name else {
                return Ok(None);
            };
            let found: Vec<_> = recording.marks.iter().filter(|m| &m.name == name).collect();
            match found[..] {
                [mark] => Ok(Some(mark.time)),
                [] => {
                    let known: Vec<&str> =
                        recording.marks.iter().map(|m| m.name.as_str()).collect();
                    bail!(
                        "{file} has no mark {name:?} (it has: {})",
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    )
                }
                _ => bail!(
                    "{file} has the mark {name:?} {} times; give each mark its own name",
                    found.len()
                ),
            }
        };
        let span = Span {
            since: self.since.or(mark(&self.since_mark)?),
            until: self.until.or(mark(&self.until_mark)?),
        };
        if let (Some(since), Some(until)) = (span.since, span.until)
            && until <= since
        {
            bail!("the window is empty: its end ({until}) is not after its start ({since})");
        }
        Ok((span != Span::default()).then_some(span))
    }
}
