//! `observer mark NAME --log FILE`: writes a named moment into a log while `observer record`
//! writes it, so that `check` and `summary` can judge the traffic between two marks
//! (`--since-mark`, `--until-mark`).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use super::Outcome;
use crate::model::record::{LogLine, MarkRecord};

#[derive(Debug, Clone, clap::Args)]
pub struct MarkArgs {
    /// The mark's name (`rollout-start`): letters, digits, `-`, `_`, `.` and `:`.
    #[arg(value_name = "NAME", value_parser = mark_name)]
    pub name: String,
    /// The log `observer record -w FILE` is writing (or wrote).
    #[arg(long, value_name = "FILE")]
    pub log: PathBuf,
}

/// A name a shell and a CI file can pass around without quoting.
fn mark_name(text: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if text.is_empty() || text.len() > 128 || !text.chars().all(allowed) {
        return Err(format!(
            "`{text}` is not a mark name: use 1 to 128 letters, digits, `-`, `_`, `.` or `:`"
        ));
    }
    Ok(text.to_owned())
}

/// Appends one `{"type":"mark",...}` line to the log in a single write. `record` opens its
/// log for appending and writes whole lines, so the mark lands between two of its lines.
pub fn run(args: &MarkArgs) -> anyhow::Result<Outcome> {
    let path = &args.log;
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "no log at {}: start `observer record -w {0}` first",
            path.display()
        )
    })?;
    if !meta.is_file() {
        bail!(
            "{} is not a regular file: marks go into a log file",
            path.display()
        );
    }
    let mark = LogLine::Mark(MarkRecord {
        name: args.name.clone(),
        time: chrono::Utc::now(),
    });
    let line = serde_json::to_string(&mark)? + "\n";
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("cannot write to {}", path.display()))?;
    file.write_all(line.as_bytes())
        .with_context(|| format!("cannot write to {}", path.display()))?;
    Ok(Outcome::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::Recording;

    #[test]
    fn a_mark_is_appended_as_one_line_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("conns.jsonl");
        let original = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/keepalive.jsonl"
        ))
        .unwrap();
        std::fs::write(&log, &original).unwrap();
        let args = MarkArgs {
            name: "rollout-start".into(),
            log: log.clone(),
        };
        run(&args).unwrap();
        let recording = Recording::read(&log).unwrap();
        assert_eq!(recording.marks.len(), 1);
        assert_eq!(recording.marks[0].name, "rollout-start");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.starts_with(&original));
        assert!(
            text[original.len()..].starts_with(r#"{"type":"mark","name":"rollout-start","time":""#)
        );
    }

    #[test]
    fn bad_names_and_missing_logs_are_one_sentence() {
        assert!(
            mark_name("rollout start")
                .unwrap_err()
                .contains("is not a mark name")
        );
        assert!(mark_name("").is_err());
        assert_eq!(mark_name("v1.2:done").unwrap(), "v1.2:done");
        let args = MarkArgs {
            name: "x".into(),
            log: "/nonexistent/conns.jsonl".into(),
        };
        let err = format!("{:#}", run(&args).unwrap_err());
        assert!(
            err.starts_with("no log at /nonexistent/conns.jsonl: start `observer record -w /nonexistent/conns.jsonl` first"),
            "{err}"
        );
    }
}
