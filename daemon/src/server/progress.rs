//! Progress of a running call: counts its output as it arrives and sends
//! `notifications/progress` at the start and about every second (elapsed
//! time against the time limit, bytes and lines per stream, the last line),
//! which also keeps clients with short request timeouts waiting. A call's
//! [`Progress`] is where it reports, when the client asked for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};

use crate::exec::{Observer, Stream};
use crate::sync::Recover;

/// How often a running call reports.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Longest last line quoted in a progress message.
const LAST_LINE_CHARS: usize = 120;

/// Live counts of a run's output.
#[derive(Debug, Default)]
pub struct Live {
    started: AtomicBool,
    stats: Mutex<Stats>,
}

#[derive(Debug, Default)]
struct Stats {
    bytes: [u64; 2],
    lines: [u64; 2],
    /// The most recent non-empty line of either stream (or the line being
    /// written, such as a progress bar without a newline).
    last_line: String,
}

impl Observer for Live {
    fn started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    fn output(&self, stream: Stream, data: &[u8]) {
        let i = match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        };
        let mut s = self.stats.lock().recover();
        s.bytes[i] += data.len() as u64;
        s.lines[i] += data.iter().filter(|b| **b == b'\n').count() as u64;
        let tail = &data[data.len().saturating_sub(4 * LAST_LINE_CHARS)..];
        if let Some(line) = String::from_utf8_lossy(tail)
            .split(['\n', '\r'])
            .map(str::trim)
            .rfind(|l| !l.is_empty())
        {
            s.last_line = line.chars().take(LAST_LINE_CHARS).collect();
        }
    }
}

impl Live {
    /// A one-line summary for the agent and the user.
    pub fn message(&self, elapsed: Duration, limit: Duration) -> String {
        if !self.started.load(Ordering::Relaxed) {
            return "waiting for a free sandbox".to_string();
        }
        let s = self.stats.lock().recover();
        let mut m = format!(
            "running {:.0} s of {:.0} s; stdout {} lines ({}), stderr {} lines ({})",
            elapsed.as_secs_f64(),
            limit.as_secs_f64(),
            s.lines[0],
            size(s.bytes[0]),
            s.lines[1],
            size(s.bytes[1])
        );
        if !s.last_line.is_empty() {
            m.push_str(&format!("; last: {}", s.last_line));
        }
        m
    }
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

/// Sends progress now and every [`INTERVAL`] until the returned task is
/// aborted: elapsed seconds out of `limit`, with `message(elapsed)`. The
/// values reported go on from `before`, the time an earlier phase of the
/// same call already reported (progress must only grow).
pub fn report(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    message: impl Fn(Duration) -> String + Send + 'static,
    limit: Duration,
    before: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut every = tokio::time::interval(INTERVAL);
        loop {
            every.tick().await;
            let elapsed = start.elapsed();
            let note =
                ProgressNotificationParam::new(token.clone(), (before + elapsed).as_secs_f64())
                    .with_total((before + limit).as_secs_f64())
                    .with_message(message(elapsed));
            if peer.notify_progress(note).await.is_err() {
                break;
            }
        }
    })
}

/// Where a call reports progress, when the client asked for it.
pub(super) struct Progress {
    pub(super) peer: Peer<RoleServer>,
    pub(super) token: ProgressToken,
    /// How long an earlier phase of the call (a question to the user) has
    /// already reported.
    pub(super) before: Duration,
}

impl Progress {
    /// Reports a run's live output until the returned task is aborted.
    pub(super) fn report(self, live: &Arc<Live>, limit: Duration) -> tokio::task::JoinHandle<()> {
        let live = live.clone();
        report(
            self.peer,
            self.token,
            move |elapsed| live.message(elapsed, limit),
            limit,
            self.before,
        )
    }

    /// Reports a wait for the user's answer about `tool` until the returned
    /// task is aborted.
    pub(super) fn waiting(&self, tool: &str, limit: Duration) -> tokio::task::JoinHandle<()> {
        let tool = tool.to_string();
        report(
            self.peer.clone(),
            self.token.clone(),
            move |elapsed| {
                format!(
                    "waiting for the user to confirm {tool}: {:.0} s of {:.0} s",
                    elapsed.as_secs_f64(),
                    limit.as_secs_f64()
                )
            },
            limit,
            self.before,
        )
    }

    /// The same, for the phase that follows one of `took`.
    pub(super) fn after(self, took: Duration) -> Progress {
        Progress {
            before: self.before + took,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_counts_lines_and_quotes_the_last_one() {
        let live = Live::default();
        assert_eq!(
            live.message(Duration::ZERO, Duration::from_secs(30)),
            "waiting for a free sandbox"
        );
        live.started();
        live.output(Stream::Stdout, b"collecting\ntest_a PASSED\n");
        live.output(Stream::Stderr, b"warning: slow\n");
        live.output(Stream::Stdout, b"[#####     ] 50%");
        let m = live.message(Duration::from_secs(3), Duration::from_secs(30));
        assert_eq!(
            m,
            "running 3 s of 30 s; stdout 2 lines (41 B), stderr 1 lines (14 B); last: [#####     ] 50%"
        );
    }
}
