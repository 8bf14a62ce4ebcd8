//! `observer serve`: a capture session whose updates feed the aggregates, and a small
//! HTTP server that answers `GET /metrics` with them (rendered by `sinks::metrics`).
//! It drives a whole session, so it lives here rather than among the sinks: the
//! dependency runs one way, pipeline -> sinks.

use std::collections::BTreeMap;
use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::conntrack::CtStats;
use crate::kernel::capture::Capture;
use crate::model::record::SummaryRecord;
use crate::model::update::{CaptureStats, Update};
use crate::pipeline::{self, SessionOptions};
use crate::stats::Aggregator;

/// What a scrape sees: the aggregates and the latest capture counters.
#[derive(Default)]
struct Served {
    aggregator: Aggregator,
    capture: CaptureStats,
    /// conntrack's latest figures per namespace.
    conntrack: BTreeMap<u32, CtStats>,
}

/// Largest request head read from a scraper.
const MAX_REQUEST: usize = 8192;

/// Runs until `stop` completes; `listener` is already bound (so a busy port fails
/// before anything is attached).
pub async fn run(
    listener: std::net::TcpListener,
    capture: Capture,
    mut options: SessionOptions,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<SummaryRecord> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let served = Arc::new(Mutex::new(Served::default()));
    let (send, mut receive) = tokio::sync::mpsc::channel(65536);
    options.updates = Some(send);
    let session = pipeline::run(capture, options, stop);
    let state = served.clone();
    let consume = async move {
        while let Some(update) = receive.recv().await {
            let Ok(mut state) = state.lock() else { return };
            match update {
                Update::Conn { id, record } => state.aggregator.apply(id, &record),
                Update::Service(service) => state.aggregator.add_service(&service),
                Update::Reject(reject) => state.aggregator.add_reject(&reject),
                Update::Stats(stats) => state.capture = stats,
                Update::Conntrack {
                    netns,
                    reading: Some(reading),
                } => {
                    state.conntrack.insert(netns, reading.stats);
                }
                Update::Conntrack {
                    netns,
                    reading: None,
                } => {
                    state.conntrack.remove(&netns);
                }
                // Metrics carry no timeline and no DNS.
                Update::Endpoints(_) | Update::Dns(_) => {}
            }
        }
    };
    let answer = async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors, say: let some close before trying again.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            tokio::spawn(answer_one(stream, served.clone()));
        }
    };
    tokio::select! {
        summary = session => summary,
        () = consume => anyhow::bail!("the capture session stopped sending updates"),
        () = answer => anyhow::bail!("stopped accepting metrics requests"),
    }
}

/// Reads one request head (5 s at most) and writes the response.
async fn answer_one(mut stream: tokio::net::TcpStream, served: Arc<Mutex<Served>>) {
    // `read_buf` appends to the buffer's spare capacity: no copy through a stack buffer.
    let mut head = bytes::BytesMut::with_capacity(1024);
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            match stream.read_buf(&mut head).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .is_err()
    {
        return;
    }
    let response = crate::sinks::metrics::respond(&String::from_utf8_lossy(&head), || {
        served
            .lock()
            .map(|state| {
                let mut metrics =
                    crate::sinks::metrics::render(&state.aggregator.services(), &state.capture);
                metrics.push_str(&crate::sinks::metrics::render_conntrack(&state.conntrack));
                metrics
            })
            .unwrap_or_default()
    });
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
