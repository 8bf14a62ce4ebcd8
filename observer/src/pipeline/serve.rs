//! `observer serve`: a capture session whose updates feed the aggregates, and an HTTP/1.1
//! server (hyper) that answers `GET /metrics` with them (rendered by `sinks::metrics`).
//! It drives a whole session, so it lives here rather than among the sinks: the
//! dependency runs one way, pipeline -> sinks.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::kernel::capture::Capture;
use crate::model::record::CtStats;
use crate::model::record::SummaryRecord;
use crate::model::update::{CaptureStats, Update};
use crate::pipeline::{self, SessionOptions};
use crate::sinks::metrics::{self, Exposition};
use crate::stats::Aggregator;

/// What a scrape sees: the aggregates and the latest capture counters.
#[derive(Default)]
struct Served {
    aggregator: Aggregator,
    capture: CaptureStats,
    /// conntrack's latest figures per namespace.
    conntrack: BTreeMap<u32, CtStats>,
}

impl Served {
    fn exposition(&self) -> Exposition {
        let services = self.aggregator.services();
        let rollouts = services
            .iter()
            .filter_map(|service| {
                let rollout = self.aggregator.rollout(service)?;
                Some(((service.service.clone(), service.proto), rollout))
            })
            .collect();
        Exposition {
            services,
            capture: self.capture.clone(),
            conntrack: self.conntrack.clone(),
            rollouts,
        }
    }
}

/// How long a client may take to send a request's head.
const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(5);

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
                Update::Endpoints(change) => state.aggregator.add_endpoints(&change),
                Update::Dns(_) => {}
            }
        }
    };
    let scrape = move || {
        let exposition = served.lock().map(|state| state.exposition());
        exposition.map(metrics::render).unwrap_or_default()
    };
    let answer = answer_scrapes(listener, Arc::new(scrape));
    tokio::select! {
        summary = session => summary,
        () = consume => anyhow::bail!("the capture session stopped sending updates"),
        () = answer => anyhow::bail!("stopped accepting metrics requests"),
    }
}

/// Answers HTTP/1.1 requests on `listener`, each connection in a task of its own, with
/// [`respond`]; returns only if accepting fails for good.
async fn answer_scrapes(
    listener: tokio::net::TcpListener,
    scrape: Arc<dyn Fn() -> String + Send + Sync>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: let some close before trying again.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let scrape = scrape.clone();
        let service = hyper::service::service_fn(move |request| {
            let response = respond(request.method(), request.uri().path(), &*scrape);
            std::future::ready(Ok::<_, Infallible>(response))
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(REQUEST_HEAD_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            // A client that goes away or sends garbage ends only its own connection.
            let _ = connection.await;
        });
    }
}

/// `GET /metrics` gets the metrics, any other path 404, any other method 405.
fn respond(method: &Method, path: &str, scrape: &dyn Fn() -> String) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (method, path) {
        (&Method::GET, "/metrics") => (StatusCode::OK, metrics::CONTENT_TYPE, scrape()),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "observer serves /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    if status == StatusCode::METHOD_NOT_ALLOWED {
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    /// `request` sent over a real socket to [`answer_scrapes`]; the whole response.
    fn exchange(request: &str) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let request = request.to_owned();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let server = answer_scrapes(listener, Arc::new(|| "m 1\n".to_owned()));
            let client = tokio::task::spawn_blocking(move || {
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream.write_all(request.as_bytes()).unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                response
            });
            tokio::select! {
                () = server => unreachable!("the server stopped accepting"),
                response = client => response.unwrap(),
            }
        })
    }

    #[test]
    fn only_get_metrics_is_served() {
        let close = "Host: x\r\nConnection: close\r\n\r\n";
        let ok = exchange(&format!("GET /metrics HTTP/1.1\r\n{close}"));
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nm 1\n"), "{ok}");
        let lower = ok.to_ascii_lowercase();
        assert!(lower.contains("content-length: 4\r\n"), "{ok}");
        assert!(
            lower.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{ok}"
        );
        let other = exchange(&format!("GET / HTTP/1.1\r\n{close}"));
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        let post = exchange(&format!(
            "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n{close}"
        ));
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(
            post.to_ascii_lowercase().contains("allow: get\r\n"),
            "{post}"
        );
        // Not HTTP: hyper answers 400 and closes.
        let garbage = exchange("\r\n\r\nnonsense\r\n\r\n");
        assert!(
            garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
            "{garbage}"
        );
    }

    #[test]
    fn keep_alive_serves_several_scrapes_on_one_connection() {
        let one = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        let last = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let responses = exchange(&format!("{one}{one}{last}"));
        assert_eq!(
            responses.matches("HTTP/1.1 200 OK").count(),
            3,
            "{responses}"
        );
    }
}
