//! What a run did through the proxy: the hosts it reached (connections,
//! bytes each way, failures), the hosts it was refused and why, the totals,
//! and which bound it hit. The proxy writes it; the run's result
//! (`network_denied`) and the audit log read it. It also holds the run's
//! transfer budget, so the byte bound and the byte count are one number.
//!
//! Memory stays bounded whatever the run does: at most [`MAX_HOSTS`]
//! distinct hosts are kept per list; beyond that they are only counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::policy::Denial;

/// Distinct hosts kept per list (allowed, denied).
pub const MAX_HOSTS: usize = 256;

/// A host the run reached (or tried to, and failed for a reason other than
/// the policy).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostTraffic {
    pub host: String,
    pub port: u16,
    /// CONNECT tunnels and forwarded requests opened.
    pub connections: u64,
    /// Attempts that failed after the policy allowed them (resolution,
    /// connection, timeout).
    pub failures: u64,
    /// Bytes from the sandbox to the host.
    pub bytes_sent: u64,
    /// Bytes from the host to the sandbox.
    pub bytes_received: u64,
}

/// A host the policy refused, or a request its rules refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeniedHost {
    pub host: String,
    pub port: u16,
    /// For a refused request: its method and path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `not-on-allowlist`, `refused-address` or `request-rule`.
    pub rule: &'static str,
    /// The full reason, as in the 403 body.
    pub reason: String,
    pub attempts: u64,
}

impl DeniedHost {
    /// The host, or for a refused request "METHOD host/path".
    pub fn subject(&self) -> String {
        match (&self.method, &self.path) {
            (Some(method), Some(path)) => format!("{method} {}{path}", self.host),
            _ => self.host.clone(),
        }
    }
}

/// A bound of the proxy that a run reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkLimit {
    /// `max_connections`: a connection was turned away.
    Connections,
    /// `transfer_mb`: traffic was cut off.
    Transfer,
}

/// A snapshot of a run's network use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NetworkReport {
    pub allowed: Vec<HostTraffic>,
    pub denied: Vec<DeniedHost>,
    /// Events (denials, connections, traffic) of hosts beyond the first
    /// [`MAX_HOSTS`] of a list: counted, not listed.
    pub unlisted_events: u64,
    pub connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub limits_reached: Vec<NetworkLimit>,
}

impl NetworkReport {
    /// What was refused, each once: the host names (what the agent asks
    /// the user to allow), and refused requests as "METHOD host/path".
    pub fn denied_subjects(&self) -> Vec<String> {
        let set: BTreeSet<String> = self.denied.iter().map(DeniedHost::subject).collect();
        set.into_iter().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.allowed.is_empty() && self.denied.is_empty() && self.unlisted_events == 0
    }
}

/// The live record of one run; clones share it.
#[derive(Debug, Clone, Default)]
pub struct RunRecord {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    tally: Mutex<Tally>,
    /// Bytes moved this run, both ways: the transfer budget's use.
    spent: AtomicU64,
}

#[derive(Debug, Default)]
struct Tally {
    allowed: BTreeMap<(String, u16), HostTraffic>,
    /// By what was refused ([`Denial::subject`]) and port.
    denied: BTreeMap<(String, u16), DeniedHost>,
    unlisted_events: u64,
    connections: u64,
    bytes_sent: u64,
    bytes_received: u64,
    limits: BTreeSet<NetworkLimit>,
}

impl RunRecord {
    pub fn new() -> RunRecord {
        RunRecord::default()
    }

    /// What the run has done so far.
    pub fn report(&self) -> NetworkReport {
        let t = self.lock();
        NetworkReport {
            allowed: t.allowed.values().cloned().collect(),
            denied: t.denied.values().cloned().collect(),
            unlisted_events: t.unlisted_events,
            connections: t.connections,
            bytes_sent: t.bytes_sent,
            bytes_received: t.bytes_received,
            limits_reached: t.limits.iter().copied().collect(),
        }
    }

    /// The report so far, and a fresh start with a full transfer budget:
    /// for a session, whose sandbox (and proxy) serves call after call.
    /// Traffic of connections still open is counted when they close.
    pub fn take(&self) -> NetworkReport {
        let mut t = self.lock();
        let taken = std::mem::take(&mut *t);
        self.inner.spent.store(0, Ordering::Relaxed);
        drop(t);
        NetworkReport {
            allowed: taken.allowed.into_values().collect(),
            denied: taken.denied.into_values().collect(),
            unlisted_events: taken.unlisted_events,
            connections: taken.connections,
            bytes_sent: taken.bytes_sent,
            bytes_received: taken.bytes_received,
            limits_reached: taken.limits.into_iter().collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.inner.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn denied(&self, denial: &Denial, port: u16) {
        let mut t = self.lock();
        let key = (denial.subject(), port);
        if let Some(d) = t.denied.get_mut(&key) {
            d.attempts += 1;
        } else if t.denied.len() < MAX_HOSTS {
            let (method, path) = match denial {
                Denial::Request { method, path, .. } => (Some(method.clone()), Some(path.clone())),
                _ => (None, None),
            };
            t.denied.insert(
                key,
                DeniedHost {
                    host: denial.host().to_string(),
                    port,
                    method,
                    path,
                    rule: denial.rule(),
                    reason: denial.to_string(),
                    attempts: 1,
                },
            );
        } else {
            t.unlisted_events += 1;
        }
    }

    /// Updates the entry of an allowed host (creating it while there is room).
    fn allowed(&self, host: &str, port: u16, update: impl FnOnce(&mut HostTraffic)) {
        let mut t = self.lock();
        let key = (host.to_string(), port);
        if let Some(h) = t.allowed.get_mut(&key) {
            update(h);
        } else if t.allowed.len() < MAX_HOSTS {
            let mut h = HostTraffic {
                host: key.0.clone(),
                port,
                ..Default::default()
            };
            update(&mut h);
            t.allowed.insert(key, h);
        } else {
            t.unlisted_events += 1;
        }
    }

    pub(super) fn opened(&self, host: &str, port: u16) {
        self.lock().connections += 1;
        self.allowed(host, port, |h| h.connections += 1);
    }

    pub(super) fn failed(&self, host: &str, port: u16) {
        self.allowed(host, port, |h| h.failures += 1);
    }

    /// Bytes of one connection, added when it ends.
    pub(super) fn traffic(&self, host: &str, port: u16, sent: u64, received: u64) {
        {
            let mut t = self.lock();
            t.bytes_sent += sent;
            t.bytes_received += received;
        }
        self.allowed(host, port, |h| {
            h.bytes_sent += sent;
            h.bytes_received += received;
        });
    }

    pub(super) fn reached(&self, limit: NetworkLimit) {
        self.lock().limits.insert(limit);
    }

    /// Takes `n` bytes from the transfer budget of `max` bytes; false (and
    /// the limit recorded) when the budget does not cover them.
    pub(super) fn spend(&self, n: u64, max: u64) -> bool {
        let before = self.inner.spent.fetch_add(n, Ordering::Relaxed);
        let ok = before.saturating_add(n) <= max;
        if !ok {
            self.reached(NetworkLimit::Transfer);
        }
        ok
    }

    /// True when the budget is used up.
    pub(super) fn exhausted(&self, max: u64) -> bool {
        self.inner.spent.load(Ordering::Relaxed) >= max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::policy::{Bounds, Host, Policy};

    #[test]
    fn the_record_lists_hosts_once_and_stays_bounded() {
        let r = RunRecord::new();
        let p = Policy::from_entries(&["pypi.org"], Bounds::default()).unwrap();
        for i in 0..(MAX_HOSTS + 10) {
            let d = p.admits(&Host::Name(format!("h{i}.example"))).unwrap_err();
            r.denied(&d, 443);
            r.denied(&d, 443);
        }
        r.opened("pypi.org", 443);
        r.traffic("pypi.org", 443, 10, 2000);
        let rep = r.report();
        assert_eq!(rep.denied.len(), MAX_HOSTS);
        assert_eq!(rep.unlisted_events, 20);
        assert!(rep.denied.iter().all(|d| d.attempts == 2));
        assert_eq!(rep.denied_subjects().len(), MAX_HOSTS);
        assert_eq!(rep.allowed[0].bytes_received, 2000);
        assert_eq!((rep.bytes_sent, rep.bytes_received), (10, 2000));
    }

    #[test]
    fn the_budget_is_shared_and_reset_by_take() {
        let r = RunRecord::new();
        assert!(r.spend(60, 100));
        assert!(!r.spend(60, 100));
        assert!(r.exhausted(100));
        assert_eq!(r.report().limits_reached, vec![NetworkLimit::Transfer]);
        let taken = r.take();
        assert_eq!(taken.limits_reached, vec![NetworkLimit::Transfer]);
        assert!(r.spend(60, 100));
        assert!(r.report().limits_reached.is_empty());
    }
}
