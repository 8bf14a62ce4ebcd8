//! Writes the connection log (JSON Lines), counting what it wrote.

use std::io::Write;

use serde::Serialize;

use crate::model::record::{
    ConnRecord, DnsRecord, EndpointsRecord, RejectRecord, ServiceRecord, SummaryRecord,
};
use crate::sinks::conn_line::ConnLine;

/// A borrowed log line: serializes exactly like `record::LogLine` without cloning
/// (connection lines are written by `ConnLine`).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum LineRef<'a> {
    Service(&'a ServiceRecord),
    Endpoints(&'a EndpointsRecord),
    Dns(&'a DnsRecord),
    Reject(&'a RejectRecord),
    Summary(&'a SummaryRecord),
}

/// A line that could not be written: the one error the log's writer gives, naming the log.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the connection log to {name}")]
pub struct LogError {
    name: String,
    #[source]
    source: std::io::Error,
}

pub struct LogWriter {
    out: Box<dyn Write + Send>,
    /// Where the log goes, for messages: a path or `-` for stdout.
    pub name: String,
    connections: u64,
    /// One line, serialized here first: one write per line instead of one per token.
    line: Vec<u8>,
    conn_line: ConnLine,
}

/// Bytes of log lines written in one system call (the log is flushed at every sweep as
/// well). Fewer, larger writes let the file system take the page cache in large folios:
/// with 8 KiB writes, allocating pages and buffer heads was a quarter of observer's CPU.
const LOG_BUFFER: usize = 256 * 1024;

/// Where the connection log will go, checked but not yet opened: an existing file is
/// replaced only when [`LogTarget::open`] is called, after the kernel programs attached,
/// so that a start that fails (no BTF, no privileges) leaves it byte-for-byte intact.
///
/// The log is then written in place, not to a temporary file renamed at the end: a run
/// that is killed leaves every line flushed so far (at most a second behind), which
/// `summary`, `check` and `--replay` read, saying the log was cut.
#[derive(Clone, Debug)]
pub struct LogTarget {
    path: String,
}

impl LogTarget {
    /// Fails with one sentence naming the path when the log could not be written there,
    /// without creating, truncating or touching anything. `-` is standard output.
    pub fn check(path: &str) -> anyhow::Result<LogTarget> {
        if path != "-" {
            writable(std::path::Path::new(path)).map_err(|err| {
                anyhow::anyhow!("cannot write the connection log to {path}: {err}")
            })?;
        }
        Ok(LogTarget {
            path: path.to_owned(),
        })
    }

    /// Creates (or replaces) the file, or takes standard output for `-`.
    pub fn open(self) -> anyhow::Result<LogWriter> {
        let path = self.path;
        let out: Box<dyn Write + Send> = if path == "-" {
            Box::new(std::io::BufWriter::with_capacity(
                LOG_BUFFER,
                std::io::stdout(),
            ))
        } else {
            // Appending, and whole lines per write: a line `observer mark` appends to the
            // file meanwhile lands between two lines, never inside one.
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)
                .and_then(|file| {
                    // A regular file is emptied; a device or pipe (/dev/null, a FIFO)
                    // cannot be truncated and needs not be.
                    if file.metadata()?.is_file() {
                        file.set_len(0)?;
                    }
                    Ok(file)
                })
                .map_err(|err| {
                    anyhow::anyhow!("cannot write the connection log to {path}: {err}")
                })?;
            Box::new(WholeLines {
                out: file,
                buffer: Vec::with_capacity(LOG_BUFFER),
            })
        };
        Ok(LogWriter::new(out, &path))
    }

    pub fn name(&self) -> &str {
        &self.path
    }
}

/// Buffers whole lines (each `write` is one) and hands them on in a single write when the
/// buffer is full or on flush, so that no write ends inside a line: with the file opened
/// for appending, each such write lands whole at the end of the file.
struct WholeLines<W: Write> {
    out: W,
    buffer: Vec<u8>,
}

impl<W: Write> Write for WholeLines<W> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        if !self.buffer.is_empty() && self.buffer.len() + line.len() > LOG_BUFFER {
            self.flush()?;
        }
        self.buffer.extend_from_slice(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buffer.is_empty() {
            self.out.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        self.out.flush()
    }
}

impl<W: Write> Drop for WholeLines<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// Whether `path` could be opened for writing, leaving it as it is: an existing regular
/// file is opened without truncation; a missing one is tried as a fresh file beside it,
/// removed at once.
fn writable(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "it is a directory",
        )),
        Ok(meta) if meta.is_file() => std::fs::OpenOptions::new().write(true).open(path).map(drop),
        // A FIFO or device would block or act on open: ask the kernel instead.
        Ok(meta) if meta.file_type().is_fifo() || meta.file_type().is_char_device() => {
            nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).map_err(std::io::Error::from)
        }
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => std::path::Path::new("."),
            };
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let probe = dir.join(format!(".{name}.observer-{}", std::process::id()));
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&probe)?;
            std::fs::remove_file(&probe)
        }
        Err(err) => Err(err),
    }
}

impl LogWriter {
    pub fn new(out: Box<dyn Write + Send>, name: &str) -> LogWriter {
        LogWriter {
            out,
            name: name.to_owned(),
            connections: 0,
            line: Vec::with_capacity(512),
            conn_line: ConnLine::default(),
        }
    }

    pub fn connections(&self) -> u64 {
        self.connections
    }

    pub fn conn(&mut self, record: &ConnRecord) -> Result<(), LogError> {
        self.connections += 1;
        self.line.clear();
        let written = self
            .conn_line
            .write(&mut self.line, record)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                self.line.push(b'\n');
                self.out.write_all(&self.line)
            });
        self.named(written)
    }

    pub fn service(&mut self, record: &ServiceRecord) -> Result<(), LogError> {
        self.line(&LineRef::Service(record))
    }

    pub fn endpoints(&mut self, record: &EndpointsRecord) -> Result<(), LogError> {
        self.line(&LineRef::Endpoints(record))
    }

    pub fn dns(&mut self, record: &DnsRecord) -> Result<(), LogError> {
        self.line(&LineRef::Dns(record))
    }

    pub fn reject(&mut self, record: &RejectRecord) -> Result<(), LogError> {
        self.line(&LineRef::Reject(record))
    }

    /// Writes the summary line and flushes.
    pub fn summary(&mut self, summary: &SummaryRecord) -> Result<(), LogError> {
        self.line(&LineRef::Summary(summary))?;
        self.flush()
    }

    pub fn flush(&mut self) -> Result<(), LogError> {
        let flushed = self.out.flush();
        self.named(flushed)
    }

    fn line(&mut self, line: &LineRef<'_>) -> Result<(), LogError> {
        self.line.clear();
        let written = serde_json::to_writer(&mut self.line, line)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                self.line.push(b'\n');
                self.out.write_all(&self.line)
            });
        self.named(written)
    }

    fn named(&self, result: std::io::Result<()>) -> Result<(), LogError> {
        result.map_err(|source| LogError {
            name: self.name.clone(),
            source,
        })
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

    /// Every line of a log with `dns` lines, written again by the writer, is the same
    /// text byte for byte.
    #[test]
    fn dns_lines_are_written_as_read() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/dns.jsonl"
        ))
        .unwrap();
        let mut out = Vec::new();
        for line in text.lines() {
            let mut writer = LogWriter::new(Box::new(std::io::sink()), "test");
            writer.line.clear();
            match serde_json::from_str::<LogLine>(line).unwrap() {
                LogLine::Dns(record) => writer.line(&LineRef::Dns(&record)).unwrap(),
                LogLine::Reject(record) => writer.line(&LineRef::Reject(&record)).unwrap(),
                LogLine::Service(record) => writer.line(&LineRef::Service(&record)).unwrap(),
                LogLine::Summary(record) => writer.line(&LineRef::Summary(&record)).unwrap(),
                LogLine::Conn(record) => {
                    writer.line.clear();
                    writer.conn_line.write(&mut writer.line, &record).unwrap();
                    writer.line.push(b'\n');
                }
                LogLine::Endpoints(record) => writer.line(&LineRef::Endpoints(&record)).unwrap(),
                LogLine::Mark(_) => unreachable!("no marks in dns.jsonl"),
            }
            out.extend_from_slice(&writer.line);
        }
        assert_eq!(String::from_utf8(out).unwrap(), text);
        let recording = Recording::parse("dns.jsonl", &text).unwrap();
        assert_eq!(recording.dns.len(), 11);
        assert_eq!(recording.dns[10].rcode, None);
        assert_eq!(recording.summary.unwrap().dns_malformed, 2);
    }
}
