//! The one way out of the pipeline: every record a session makes leaves through
//! [`Output::emit`], which writes its line to the connection log (when there is one) and
//! hands it to the live view (when there is one). Warnings and the live view's own
//! updates (progress, capture counters, conntrack readings) leave here too.

use std::collections::VecDeque;

use tokio::sync::mpsc;

use crate::model::record::{
    ConnRecord, DnsRecord, EndpointsRecord, RejectRecord, ServiceRecord, SummaryRecord,
};
use crate::model::update::{ConnId, Update};
use crate::sinks::log::{LogError, LogWriter};

/// A record leaving the pipeline: a line of the connection log, and an update of the
/// live view.
pub(super) enum Emitted {
    Conn { id: ConnId, record: ConnRecord },
    Service(ServiceRecord),
    Endpoints(EndpointsRecord),
    Dns(DnsRecord),
    Reject(RejectRecord),
}

pub(super) struct Output {
    log: Option<LogWriter>,
    view: Option<mpsc::Sender<Update>>,
    /// Updates the live view has not taken yet: records and Service definitions are
    /// never dropped (progress updates are, the next sweep repeats them).
    pending: VecDeque<Update>,
    warn: Box<dyn FnMut(String) + Send>,
    /// DNS and reject lines emitted (the summary line's counts).
    dns: u64,
    rejects: u64,
}

impl Output {
    /// Warnings quote the node's text (rule lines, paths, hostnames): each leaves as
    /// printable text, whichever side quoted it.
    pub fn new(
        log: Option<LogWriter>,
        view: Option<mpsc::Sender<Update>>,
        warn: Box<dyn FnMut(String) + Send>,
    ) -> Output {
        Output {
            log,
            view,
            pending: VecDeque::new(),
            warn,
            dns: 0,
            rejects: 0,
        }
    }

    /// Writes `record`'s line and shows it in the live view.
    pub fn emit(&mut self, record: Emitted) -> Result<(), LogError> {
        match &record {
            Emitted::Dns(_) => self.dns += 1,
            Emitted::Reject(_) => self.rejects += 1,
            _ => {}
        }
        if let Some(log) = self.log.as_mut() {
            match &record {
                Emitted::Conn { record, .. } => log.conn(record),
                Emitted::Service(service) => log.service(service),
                Emitted::Endpoints(change) => log.endpoints(change),
                Emitted::Dns(dns) => log.dns(dns),
                Emitted::Reject(reject) => log.reject(reject),
            }?;
        }
        // Checked first: no update is even built without a live view (a connection
        // record is 240 bytes to move).
        if self.view.is_some() {
            self.show(match record {
                Emitted::Conn { id, record } => Update::Conn { id, record },
                Emitted::Service(service) => Update::Service(service),
                Emitted::Endpoints(change) => Update::Endpoints(change),
                Emitted::Dns(dns) => Update::Dns(dns),
                Emitted::Reject(reject) => Update::Reject(reject),
            });
        }
        Ok(())
    }

    /// Whether a live view takes updates (it alone shows connections before they end).
    pub fn has_view(&self) -> bool {
        self.view.is_some()
    }

    /// An update the live view must not miss, in order, queued while its channel is full.
    pub fn show(&mut self, update: Update) {
        if self.view.is_some() {
            self.pending.push_back(update);
            self.flush_pending();
        }
    }

    /// A connection still open, for the live view. Dropped when the view is behind: it
    /// gets this connection's counters from the next sweep.
    pub fn progress(&mut self, id: ConnId, record: ConnRecord) {
        self.flush_pending();
        if self.pending.is_empty()
            && let Some(view) = &self.view
        {
            let _ = view.try_send(Update::Conn { id, record });
        }
    }

    pub fn warn(&mut self, warning: String) {
        use crate::naming::printable::{MESSAGE_BYTES, printable};
        (self.warn)(printable(warning, MESSAGE_BYTES));
    }

    /// Pushes what the log buffered to its file.
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.log.as_mut().map_or(Ok(()), LogWriter::flush)
    }

    /// Writes the summary line, last, and flushes.
    pub fn summary(&mut self, summary: &SummaryRecord) -> Result<(), LogError> {
        self.log.as_mut().map_or(Ok(()), |log| log.summary(summary))
    }

    /// Connection lines written.
    pub fn connections(&self) -> u64 {
        self.log.as_ref().map_or(0, LogWriter::connections)
    }

    /// DNS query lines emitted.
    pub fn dns_written(&self) -> u64 {
        self.dns
    }

    /// Reject lines emitted.
    pub fn rejects_written(&self) -> u64 {
        self.rejects
    }

    /// Where the log goes (a path, or `-`).
    pub fn recording(&self) -> Option<String> {
        self.log.as_ref().map(|log| log.name.clone())
    }

    fn flush_pending(&mut self) {
        let Some(view) = &self.view else {
            return;
        };
        while let Some(update) = self.pending.pop_front() {
            match view.try_send(update) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(update)) => {
                    self.pending.push_front(update);
                    return;
                }
                // The view has quit; the session is about to be stopped.
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.pending.clear();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::RejectRecord;

    /// A log that refuses every write, as a full disk does.
    struct Full;

    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_write_names_the_log_once() {
        let warnings = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let said = warnings.clone();
        let mut output = Output::new(
            Some(LogWriter::new(Box::new(Full), "/var/log/conns.jsonl")),
            None,
            Box::new(move |warning| said.lock().unwrap().push(warning)),
        );
        let err = output
            .emit(Emitted::Reject(RejectRecord::example()))
            .unwrap_err();
        let message = format!("{:#}", anyhow::Error::from(err));
        assert!(
            message.starts_with("cannot write the connection log to /var/log/conns.jsonl: "),
            "{message}"
        );
        assert_eq!(message.matches("connection log").count(), 1, "{message}");
        // Warnings leave printable.
        output.warn("rule \u{1b}[2J".to_owned());
        assert!(!warnings.lock().unwrap()[0].contains('\u{1b}'));
    }

    #[test]
    fn records_reach_the_view_in_order_and_progress_only_when_it_keeps_up() {
        let (view, mut shown) = mpsc::channel(1);
        let mut output = Output::new(None, Some(view), Box::new(|_| {}));
        let id = ConnId {
            conntrack: 1,
            start_ns: 2,
        };
        let record = crate::model::record::ConnRecord::example("10.244.1.12:8080");
        for _ in 0..3 {
            output
                .emit(Emitted::Reject(RejectRecord::example()))
                .unwrap();
        }
        // The channel holds one; the others wait, in order, and are never dropped;
        // progress is dropped while records wait or the channel is full.
        for _ in 0..3 {
            assert!(matches!(shown.try_recv(), Ok(Update::Reject(_))));
            output.progress(id, record.clone());
        }
        // Only the last, sent once the view had caught up.
        assert!(matches!(shown.try_recv(), Ok(Update::Conn { .. })));
        assert!(shown.try_recv().is_err());
    }
}
