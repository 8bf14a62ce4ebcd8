//! Writes the connection log (JSON Lines), counting what it wrote.

use std::io::Write;

use crate::record::{ConnRecord, LogLine, ServiceRecord, SummaryRecord};

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
        self.line(&LogLine::Conn(record.clone()))
    }

    pub fn service(&mut self, record: &ServiceRecord) -> std::io::Result<()> {
        self.line(&LogLine::Service(record.clone()))
    }

    /// Writes the summary line and flushes.
    pub fn summary(&mut self, summary: &SummaryRecord) -> std::io::Result<()> {
        self.line(&LogLine::Summary(summary.clone()))?;
        self.out.flush()
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    fn line(&mut self, line: &LogLine) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, line)?;
        self.out.write_all(b"\n")
    }
}
