//! The principals the server knows: for each, its own rmcp service (so
//! one principal's `Mcp-Session-Id` is unknown to every other), the
//! server as it reaches it (its sessions, jobs, tasks and confirmations),
//! and counts of its open connections and streams. Bounded: past the most
//! principals, those with nothing open are let go (what they started lives
//! on in the server's tables, under their name).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::tower::StreamableHttpService;

use super::refusal::Refusal;
use crate::server::SandboxServer;
use crate::server::caller::Quota;
use crate::sync::Recover;

/// Each principal's bounds, resolved.
#[derive(Debug, Clone, Copy)]
pub struct Shares {
    pub connections: usize,
    pub streams: usize,
    pub runs: usize,
    pub waiting: usize,
    pub sessions: usize,
    pub jobs: usize,
    pub mcp_sessions: usize,
}

pub struct Principal {
    pub name: Arc<str>,
    pub service: StreamableHttpService<SandboxServer, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    pub connections: Counter,
    pub streams: Counter,
}

impl Principal {
    /// Its open MCP sessions (2025-11-25).
    pub async fn mcp_sessions(&self) -> usize {
        self.sessions.sessions.read().await.len()
    }

    /// Whether nothing of it is open: no connection, stream or MCP session.
    fn idle(&self) -> bool {
        self.connections.get() == 0
            && self.streams.get() == 0
            && self
                .sessions
                .sessions
                .try_read()
                .is_ok_and(|s| s.is_empty())
    }
}

pub struct Principals {
    base: SandboxServer,
    config: StreamableHttpServerConfig,
    pub shares: Shares,
    max: usize,
    table: std::sync::Mutex<HashMap<Arc<str>, Arc<Principal>>>,
}

impl Principals {
    pub fn new(
        base: SandboxServer,
        config: StreamableHttpServerConfig,
        shares: Shares,
        max: usize,
    ) -> Principals {
        Principals {
            base,
            config,
            shares,
            max,
            table: Default::default(),
        }
    }

    /// The server as every principal reaches it, before its own name and share.
    pub fn base(&self) -> &SandboxServer {
        &self.base
    }

    /// `name`'s entry, made on its first request.
    pub fn get(&self, name: &str) -> Result<Arc<Principal>, Refusal> {
        let mut table = self.table.lock().recover();
        if let Some(p) = table.get(name) {
            return Ok(p.clone());
        }
        if table.len() >= self.max {
            table.retain(|_, p| Arc::strong_count(p) > 1 || !p.idle());
        }
        if table.len() >= self.max {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("this server already serves {} principals at once", self.max),
            )
            .retry_after(10));
        }
        let name: Arc<str> = name.into();
        let s = self.shares;
        let server = self
            .base
            .for_principal(&name, Quota::new(s.runs, s.waiting, s.sessions, s.jobs));
        let sessions = Arc::new(LocalSessionManager::default());
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            sessions.clone(),
            self.config.clone(),
        );
        let p = Arc::new(Principal {
            name: name.clone(),
            service,
            sessions,
            connections: Counter::default(),
            streams: Counter::default(),
        });
        table.insert(name, p.clone());
        Ok(p)
    }
}

/// A count of things open, taken up to a bound.
#[derive(Debug, Default, Clone)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// One more, unless `max` are open; released when the guard drops.
    pub fn take(&self, max: usize) -> Option<Taken> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Taken(self.0.clone()))
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One place of a [`Counter`], given back on drop.
#[derive(Debug)]
pub struct Taken(Arc<AtomicUsize>);

impl Drop for Taken {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_gives_places_up_to_its_bound_and_takes_them_back() {
        let c = Counter::default();
        let a = c.take(2).unwrap();
        let _b = c.take(2).unwrap();
        assert!(c.take(2).is_none());
        drop(a);
        assert_eq!(c.get(), 1);
        assert!(c.take(2).is_some());
    }
}
