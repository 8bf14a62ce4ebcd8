//! Writes the connection log (JSON Lines), counting what it wrote.

use std::io::Write;

use serde::Serialize;

use crate::model::record::{ConnRecord, ServiceRecord, SummaryRecord};

/// A borrowed log line: serializes exactly like `record::LogLine` without cloning.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum LineRef<'a> {
    Conn(&'a ConnRecord),
    Service(&'a ServiceRecord),
    Summary(&'a SummaryRecord),
}

pub struct LogWriter {
    out: Box<dyn Write + Send>,
    /// Where the log goes, for messages: a path or `-` for stdout.
    pub name: String,
    connections: u64,
}

impl LogWriter {
    /// Creates (truncates) `path`, or writes to stdout for `-`. Fails with one sentence
    /// naming the path before anything is attached.
    pub fn create(path: &str) -> anyhow::Result<LogWriter> {
        let out: Box<dyn Write + Send> = if path == "-" {
            Box::new(std::io::BufWriter::new(std::io::stdout()))
        } else {
            let file = std::fs::File::create(path).map_err(|err| {
                anyhow::anyhow!("cannot write the connection log to {path}: {err}")
            })?;
            Box::new(std::io::BufWriter::new(file))
        };
        Ok(LogWriter::new(out, path))
    }

    pub fn new(out: Box<dyn Write + Send>, name: &str) -> LogWriter {
        LogWriter {
            out,
            name: name.to_owned(),
            connections: 0,
        }
    }

    pub fn connections(&self) -> u64 {
        self.connections
    }

    pub fn conn(&mut self, record: &ConnRecord) -> std::io::Result<()> {
        self.connections += 1;
        self.line(&LineRef::Conn(record))
    }

    pub fn service(&mut self, record: &ServiceRecord) -> std::io::Result<()> {
        self.line(&LineRef::Service(record))
    }

    /// Writes the summary line and flushes.
    pub fn summary(&mut self, summary: &SummaryRecord) -> std::io::Result<()> {
        self.line(&LineRef::Summary(summary))?;
        self.out.flush()
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    fn line(&mut self, line: &LineRef<'_>) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, line)?;
        self.out.write_all(b"\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::{LogLine, Recording};

    /// What the writer writes reads back as the same records (the same schema as
    /// `record::LogLine`).
    #[test]
    fn written_lines_read_back() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/mixed.jsonl"
        ))
        .unwrap();
        let original = Recording::parse("mixed.jsonl", &text).unwrap();
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Shared {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().write(bytes)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut writer = LogWriter::new(Box::new(Shared(buffer.clone())), "test");
        for service in &original.services {
            writer.service(service).unwrap();
        }
        for conn in &original.conns {
            writer.conn(conn).unwrap();
        }
        writer.summary(original.summary.as_ref().unwrap()).unwrap();
        assert_eq!(writer.connections(), original.conns.len() as u64);
        let written = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert_eq!(Recording::parse("written", &written).unwrap(), original);
        let first: LogLine = serde_json::from_str(written.lines().next().unwrap()).unwrap();
        assert!(matches!(first, LogLine::Service(_)));
    }
}
