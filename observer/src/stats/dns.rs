//! DNS search walks: queries grouped into lookups, per client.
//!
//! A resolver with `search shop.svc.cluster.local svc.cluster.local cluster.local` and
//! `ndots:5` (every pod's resolv.conf in Kubernetes) turns one name into a walk of
//! queries: `www.example.com` is tried as `www.example.com.shop.svc.cluster.local`,
//! `...svc.cluster.local`, `...cluster.local`, then as itself, each for A and AAAA.
//!
//! Definitions:
//! - A query's candidate bases: its name, and its name without each search-like suffix
//!   it ends with: `<zone>`, `svc.<zone>` and `<label>.svc.<zone>` (any namespace, so
//!   the client's own namespace need not be known); `zone` is the cluster domain.
//! - A lookup: queries of one client (address, without port) in time order, each sent
//!   within [`LOOKUP_WINDOW`] of the lookup's previous query and sharing a candidate base
//!   with all of them; a query no longer joins once the lookup got an answer for another
//!   name, or when its name and type were already answered in it (a new lookup of the
//!   same name). The lookup's base is the shortest common candidate; its answer the first
//!   name that got NOERROR. A fully qualified query that hits at once (`name.` or the
//!   first search name) looks the same on the wire: its base is the short name.
//! - Per client: lookups, queries, queries per lookup, the NXDOMAIN share of queries,
//!   queries without a response, and each walk (base -> answer) with its counts.

use std::collections::BTreeMap;
use std::net::IpAddr;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;

use crate::model::record::DnsRecord;

/// Queries further apart than this are never one lookup.
pub const LOOKUP_WINDOW: TimeDelta = TimeDelta::seconds(1);

/// Kubernetes' default cluster domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// One lookup: the queries one name took.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    pub client: IpAddr,
    pub client_pod: Option<String>,
    pub base: String,
    /// The first name that got NOERROR; `None` when none did.
    pub answer: Option<String>,
    pub queries: u64,
    pub nxdomain: u64,
    /// Queries without a response.
    pub unanswered: u64,
    /// Distinct names tried, in order.
    pub names: Vec<String>,
    pub start: DateTime<Utc>,
    last: DateTime<Utc>,
    candidates: Vec<String>,
    answered: Vec<(String, String)>,
}

/// A walk: lookups of one base that ended the same way, with their counts summed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Walk {
    pub base: String,
    pub answer: Option<String>,
    pub lookups: u64,
    pub queries: u64,
    pub nxdomain: u64,
    /// Distinct names tried, in the order of the first lookup.
    pub names: Vec<String>,
}

/// One client's DNS.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClientDns {
    pub client: IpAddr,
    pub client_pod: Option<String>,
    pub lookups: u64,
    pub queries: u64,
    pub queries_per_lookup: f64,
    pub nxdomain: u64,
    /// `nxdomain / queries`.
    pub nxdomain_share: f64,
    pub unanswered: u64,
    /// Most queries first.
    pub walks: Vec<Walk>,
}

/// A name's candidate bases (see the module's definitions), shortest last.
pub fn candidates(name: &str, zone: &str) -> Vec<String> {
    let mut out = vec![name.to_owned()];
    let Some(rest) = name.strip_suffix(zone).and_then(|r| r.strip_suffix('.')) else {
        return out;
    };
    if rest.is_empty() {
        return out;
    }
    out.push(rest.to_owned());
    if let Some(rest) = rest.strip_suffix("svc").and_then(|r| r.strip_suffix('.'))
        && !rest.is_empty()
    {
        out.push(rest.to_owned());
        if let Some((before, _namespace)) = rest.rsplit_once('.') {
            out.push(before.to_owned());
        }
    }
    out
}

impl Lookup {
    fn start(record: &DnsRecord, zone: &str) -> Lookup {
        let mut lookup = Lookup {
            client: record.client.ip(),
            client_pod: record.client_pod.clone(),
            base: String::new(),
            answer: None,
            queries: 0,
            nxdomain: 0,
            unanswered: 0,
            names: Vec::new(),
            start: record.time,
            last: record.time,
            candidates: candidates(&record.name, zone),
            answered: Vec::new(),
        };
        lookup.add(record, zone);
        lookup
    }

    /// Whether `record` continues this lookup.
    fn takes(&self, record: &DnsRecord, zone: &str) -> bool {
        if record.client.ip() != self.client || record.time - self.last > LOOKUP_WINDOW {
            return false;
        }
        if self
            .answer
            .as_ref()
            .is_some_and(|answer| *answer != record.name)
        {
            return false;
        }
        if self
            .answered
            .iter()
            .any(|(name, qtype)| *name == record.name && *qtype == record.qtype)
        {
            return false;
        }
        candidates(&record.name, zone)
            .iter()
            .any(|c| self.candidates.contains(c))
    }

    fn add(&mut self, record: &DnsRecord, zone: &str) {
        let own = candidates(&record.name, zone);
        self.candidates.retain(|c| own.contains(c));
        self.base = self
            .candidates
            .iter()
            .min_by_key(|c| c.len())
            .cloned()
            .unwrap_or_else(|| record.name.clone());
        self.last = record.time.max(self.last);
        self.queries += 1;
        if self.client_pod.is_none() {
            self.client_pod = record.client_pod.clone();
        }
        if !self.names.contains(&record.name) {
            self.names.push(record.name.clone());
        }
        match record.rcode.as_deref() {
            None => self.unanswered += 1,
            Some(rcode) => {
                self.answered
                    .push((record.name.clone(), record.qtype.clone()));
                if rcode == "NXDOMAIN" {
                    self.nxdomain += 1;
                } else if rcode == "NOERROR" && self.answer.is_none() {
                    self.answer = Some(record.name.clone());
                }
            }
        }
    }
}

/// Groups queries into lookups (see the module's definitions), in time order.
pub fn lookups(records: &[DnsRecord], zone: &str) -> Vec<Lookup> {
    let mut sorted: Vec<&DnsRecord> = records.iter().collect();
    sorted.sort_by_key(|r| r.time);
    let mut done = Vec::new();
    // The open lookup of each client.
    let mut open: BTreeMap<IpAddr, Lookup> = BTreeMap::new();
    for record in sorted {
        let client = record.client.ip();
        match open.get_mut(&client) {
            Some(lookup) if lookup.takes(record, zone) => lookup.add(record, zone),
            _ => {
                if let Some(previous) = open.insert(client, Lookup::start(record, zone)) {
                    done.push(previous);
                }
            }
        }
    }
    done.extend(open.into_values());
    done.sort_by(|a, b| a.start.cmp(&b.start).then(a.client.cmp(&b.client)));
    done
}

/// Per client (by address), most queries first.
pub fn per_client(records: &[DnsRecord], zone: &str) -> Vec<ClientDns> {
    let mut clients: BTreeMap<IpAddr, ClientDns> = BTreeMap::new();
    for lookup in lookups(records, zone) {
        let client = clients.entry(lookup.client).or_insert_with(|| ClientDns {
            client: lookup.client,
            client_pod: None,
            lookups: 0,
            queries: 0,
            queries_per_lookup: 0.0,
            nxdomain: 0,
            nxdomain_share: 0.0,
            unanswered: 0,
            walks: Vec::new(),
        });
        if client.client_pod.is_none() {
            client.client_pod = lookup.client_pod.clone();
        }
        client.lookups += 1;
        client.queries += lookup.queries;
        client.nxdomain += lookup.nxdomain;
        client.unanswered += lookup.unanswered;
        match client
            .walks
            .iter_mut()
            .find(|w| w.base == lookup.base && w.answer == lookup.answer)
        {
            Some(walk) => {
                walk.lookups += 1;
                walk.queries += lookup.queries;
                walk.nxdomain += lookup.nxdomain;
            }
            None => client.walks.push(Walk {
                base: lookup.base,
                answer: lookup.answer,
                lookups: 1,
                queries: lookup.queries,
                nxdomain: lookup.nxdomain,
                names: lookup.names,
            }),
        }
    }
    let mut out: Vec<ClientDns> = clients.into_values().collect();
    for client in &mut out {
        client.queries_per_lookup = client.queries as f64 / client.lookups as f64;
        client.nxdomain_share = client.nxdomain as f64 / client.queries as f64;
        client
            .walks
            .sort_by(|a, b| b.queries.cmp(&a.queries).then(a.base.cmp(&b.base)));
    }
    out.sort_by(|a, b| b.queries.cmp(&a.queries).then(a.client.cmp(&b.client)));
    out
}

#[cfg(test)]
#[path = "tests/dns.rs"]
mod tests;
