//! Names addresses by pod. [`runtime`] finds the sandbox bundles of the container
//! runtime (and, for netns no bundle names, the hostnames of their processes) and reads
//! each pod's addresses; [`bundles`] is the pure part (a bundle's pod, a scan's map).
//! [`PodNamer`] keeps the result and refreshes it on a background thread, so naming a
//! connection is a map lookup and never waits.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::NetMap;
use crate::model::record::Name;
use crate::naming::printable::{MESSAGE_BYTES, NAME_BYTES, printable};
use bundles::PodScan;

pub mod bundles;
mod hostnames;
pub mod runtime;

pub use runtime::{DEFAULT_RUNTIME_ROOTS, RuntimeSource};

/// Something that can list the node's pods; tests inject fixed scans.
pub trait PodSource: Send + 'static {
    fn scan(&mut self) -> PodScan;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodNamerConfig {
    /// A scan older than this is refreshed on the next lookup (pods come and go).
    pub max_age: Duration,
    /// An unknown address asks for a refresh at most this often.
    pub min_interval: Duration,
}

impl Default for PodNamerConfig {
    fn default() -> Self {
        PodNamerConfig {
            max_age: Duration::from_secs(30),
            min_interval: Duration::from_secs(2),
        }
    }
}

#[derive(Default)]
struct Shared {
    pods: NetMap<IpAddr, Name>,
    /// Every cause seen, for warnings; `warned` marks how many were reported.
    skipped: Vec<String>,
    scans: u64,
}

/// Names addresses by pod. The first scan runs in `start`; later ones on a background
/// thread, asked for when the last one is older than `max_age` or an address is unknown
/// (at most every `min_interval`).
pub struct PodNamer {
    config: PodNamerConfig,
    shared: Arc<Mutex<Shared>>,
    refresh: SyncSender<()>,
    asked_at: Instant,
    warned: HashSet<String>,
    skipped_total: u64,
    /// Scans whose causes were looked at already.
    scans_warned: u64,
}

impl PodNamer {
    pub fn start(config: PodNamerConfig, mut source: Box<dyn PodSource>) -> PodNamer {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let first = source.scan();
        store(&shared, first);
        let (refresh, wanted) = mpsc::sync_channel::<()>(1);
        let background = Arc::clone(&shared);
        // A thread, not a task: a scan enters pods' namespaces (setns, see netns::run_in)
        // and reads the container runtime's files, blocking work kept off the loop that
        // drains the kernel. Asked through a channel of one (a refresh waiting is as good
        // as two). Ends when the namer (the only sender) is dropped.
        let spawned = std::thread::Builder::new()
            .name("observer-pods".to_owned())
            .spawn(move || {
                while wanted.recv().is_ok() {
                    let scan = source.scan();
                    store(&background, scan);
                }
            });
        if let Err(err) = spawned {
            shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .skipped
                .push(format!(
                    "cannot start the pod-name thread ({err}): names stay as first read"
                ));
        }
        PodNamer {
            config,
            shared,
            refresh,
            asked_at: Instant::now(),
            warned: HashSet::new(),
            skipped_total: 0,
            scans_warned: 0,
        }
    }

    /// `namespace/name` of the pod that owns `ip`, as of the latest scan.
    pub fn name(&mut self, ip: IpAddr, now: Instant) -> Option<Name> {
        let name = self
            .shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .get(&ip)
            .cloned();
        let since = now.saturating_duration_since(self.asked_at);
        if since >= self.config.max_age || (name.is_none() && since >= self.config.min_interval) {
            self.ask_refresh(now);
        }
        name
    }

    fn ask_refresh(&mut self, now: Instant) {
        match self.refresh.try_send(()) {
            // Full: a refresh is already waiting, which is as good.
            Ok(()) | Err(TrySendError::Full(())) => self.asked_at = now,
            Err(TrySendError::Disconnected(())) => {}
        }
    }

    /// Scans done so far (the first one included).
    pub fn scans(&self) -> u64 {
        self.shared.lock().unwrap_or_else(|e| e.into_inner()).scans
    }

    /// One warning per bundle or namespace that could not be read, with the count so far.
    pub fn take_warnings(&mut self) -> Vec<String> {
        let skipped = {
            let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            // Called per connection: only a new scan can bring new causes.
            if shared.scans == self.scans_warned {
                return Vec::new();
            }
            self.scans_warned = shared.scans;
            shared.skipped.clone()
        };
        let mut warnings = Vec::new();
        for cause in skipped {
            if self.warned.insert(cause.clone()) {
                self.skipped_total += 1;
                warnings.push(format!(
                    "pod names: skipped {cause} ({} skipped so far; its addresses stay unnamed)",
                    self.skipped_total
                ));
            }
        }
        warnings
    }
}

/// Keeps a scan's names and causes, as printable text: where the node's hostnames and
/// bundle annotations enter observer.
fn store(shared: &Mutex<Shared>, scan: PodScan) {
    let pods = scan
        .pods
        .into_iter()
        .map(|(ip, name)| (ip, Name::from(printable(name, NAME_BYTES))))
        .collect();
    let skipped = scan
        .skipped
        .into_iter()
        .map(|cause| printable(cause, MESSAGE_BYTES))
        .collect();
    let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    shared.pods = pods;
    shared.skipped = skipped;
    shared.scans += 1;
}

#[cfg(test)]
mod containerd_tests;
#[cfg(test)]
mod tests;
