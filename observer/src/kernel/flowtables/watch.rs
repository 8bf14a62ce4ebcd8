//! Saying each node namespace's flowtables once: read when a namespace is first watched
//! and every `EVERY` after, a warning per flowtable not said before, or, once per
//! namespace, why its flowtables could not be read. Both hooks use it: the netfilter
//! hook for the namespaces it links, `net_dev_queue` for those its connections are in.

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Flowtable;
use crate::netns;

/// How often watched namespaces are read again.
pub const EVERY: Duration = Duration::from_secs(10);

/// What was said, and when the watched namespaces were last read.
#[derive(Debug, Default)]
pub struct Watch {
    read_at: Option<Instant>,
    /// Flowtables (or unreadable namespaces, with `None`) said, by namespace inode.
    said: HashSet<(u64, Option<Flowtable>)>,
}

impl Watch {
    /// Whether the watched namespaces are due for another read; if so, they count as
    /// read now.
    pub fn due(&mut self, now: Instant) -> bool {
        let due = self.read_at.is_none_or(|at| now - at >= EVERY);
        if due {
            self.read_at = Some(now);
        }
        due
    }

    /// Reads the flowtables of namespace `inode` at `path` (entering it) and says what
    /// is new. A namespace gone meanwhile says nothing.
    pub fn read(&mut self, inode: u64, path: &Path, warnings: &mut Vec<String>) {
        let read = netns::run_in_file(path, netns::Kind::Network, super::in_current_namespace)
            .map_err(io::Error::from)
            .and_then(|read| read);
        if read
            .as_ref()
            .is_err_and(|err| err.kind() == io::ErrorKind::NotFound)
        {
            return;
        }
        self.say(inode, path, read, warnings);
    }

    /// One sentence per flowtable of namespace `inode` not said before, or, once, why
    /// its flowtables could not be read.
    pub fn say(
        &mut self,
        inode: u64,
        path: &Path,
        read: io::Result<Vec<Flowtable>>,
        warnings: &mut Vec<String>,
    ) {
        match read {
            Ok(found) => {
                for flowtable in found {
                    let sentence = format!(
                        "network namespace {inode} ({}) has nftables flowtable {flowtable}: the flows it offloads skip netfilter's hooks and carry no conntrack entry, so their packets after the first few are not counted",
                        path.display()
                    );
                    if self.said.insert((inode, Some(flowtable))) {
                        warnings.push(sentence);
                    }
                }
            }
            Err(err) => {
                if self.said.insert((inode, None)) {
                    warnings.push(format!(
                        "cannot tell whether network namespace {inode} ({}) offloads flows to an nftables flowtable: {err}",
                        path.display()
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flowtable(name: &str) -> Flowtable {
        Flowtable {
            family: 1,
            table: "filter".to_owned(),
            name: name.to_owned(),
            devices: vec!["eth0".to_owned()],
        }
    }

    #[test]
    fn each_flowtable_and_each_unreadable_namespace_is_said_once() {
        let mut watch = Watch::default();
        let path = Path::new("/run/netns/node");
        let mut said = Vec::new();
        watch.say(7, path, Ok(vec![flowtable("ft")]), &mut said);
        watch.say(
            7,
            path,
            Ok(vec![flowtable("ft"), flowtable("f2")]),
            &mut said,
        );
        watch.say(8, path, Ok(vec![flowtable("ft")]), &mut said);
        watch.say(9, path, Err(io::Error::other("refused")), &mut said);
        watch.say(9, path, Err(io::Error::other("refused")), &mut said);
        assert_eq!(said.len(), 4, "{said:#?}");
        assert!(said[0].contains(
            "network namespace 7 (/run/netns/node) has nftables flowtable inet filter/ft on eth0"
        ));
        assert!(said[3].starts_with("cannot tell whether network namespace 9"));
    }

    #[test]
    fn namespaces_are_read_again_every_ten_seconds() {
        let mut watch = Watch::default();
        let start = Instant::now();
        assert!(watch.due(start));
        assert!(!watch.due(start + Duration::from_secs(9)));
        assert!(watch.due(start + EVERY));
        assert!(!watch.due(start + EVERY));
    }
}
