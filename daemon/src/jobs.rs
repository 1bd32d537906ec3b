//! Background runs: a bounded table of jobs, each a run started without
//! waiting for it, with its output kept in bounded logs the agent reads from
//! offsets. Jobs are limited in number (those still running; a killed job
//! stops counting at once), in lifetime (their own time limit) and in
//! retained output; finished jobs are kept for reading within a count and a
//! time, and all die with the server (their cancellation tokens descend from
//! its shutdown token). Each job belongs to the principal that started it:
//! another sees, waits on and kills only its own, and may have its own
//! bound on running jobs; when too many finished jobs are kept, the oldest
//! of whoever keeps the most goes first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::changes::Note;
use crate::exec::capture::{Capture, Captured};
use crate::exec::{ExecError, Observer, Outcome, Stream};
use crate::limits::Limits;
use crate::sync::Recover;

/// Bounds on jobs.
#[derive(Debug, Clone, Copy)]
pub struct JobLimits {
    /// Jobs running (or queued for a run slot) at once.
    pub max_jobs: usize,
    /// Time limit of a background run (instead of the environment's).
    pub timeout: Duration,
    /// How long a finished job is kept.
    pub retention: Duration,
    /// Finished jobs kept at most (the oldest go first).
    pub retained: usize,
    /// Bytes of each stream kept (the latest).
    pub output_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Waiting for a run slot.
    Queued,
    Running,
    Finished,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Finished => "finished",
        }
    }
}

/// How a finished job ended.
#[derive(Debug, Clone)]
pub enum Ending {
    /// The run, and what it did to the project.
    Ran(Box<Outcome>, Option<Note>),
    /// The run never started (cancelled while queued, over the memory
    /// budget, a sandbox that could not start…).
    Failed(Arc<ExecError>),
}

/// One stream's retained output, addressed by absolute byte offsets.
#[derive(Debug)]
struct Log {
    kept: VecDeque<u8>,
    /// Offset of the first kept byte.
    first: u64,
    cap: usize,
    /// Where the last read without an explicit offset ended.
    cursor: u64,
}

impl Log {
    fn new(cap: usize) -> Log {
        Log {
            kept: VecDeque::new(),
            first: 0,
            cap,
            cursor: 0,
        }
    }

    fn end(&self) -> u64 {
        self.first + self.kept.len() as u64
    }

    fn push(&mut self, data: &[u8]) {
        self.kept.extend(data);
        let excess = self.kept.len().saturating_sub(self.cap);
        self.kept.drain(..excess);
        self.first += excess as u64;
    }

    /// Output from `from` (default: where the last read ended) to now, at most
    /// `max` bytes kept (head and tail), and the offset to read from next.
    fn read(&mut self, from: Option<u64>, max: usize) -> Chunk {
        let from = from.unwrap_or(self.cursor).min(self.end());
        let lost = self.first.saturating_sub(from);
        let start = from.max(self.first);
        let mut capture = Capture::new(max);
        let (a, b) = self.kept.as_slices();
        let skip = (start - self.first) as usize;
        if skip < a.len() {
            capture.push(&a[skip..]);
            capture.push(b);
        } else {
            capture.push(&b[skip - a.len()..]);
        }
        self.cursor = self.end();
        Chunk {
            output: capture.finish(),
            offset: from,
            next_offset: self.end(),
            lost_bytes: lost,
        }
    }
}

/// Output read from a job.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub output: Captured,
    /// Where this chunk starts.
    pub offset: u64,
    /// Where the next read should start.
    pub next_offset: u64,
    /// Bytes between the requested offset and the oldest kept byte, which
    /// were no longer retained.
    pub lost_bytes: u64,
}

#[derive(Debug)]
pub struct Job {
    pub id: String,
    /// The principal that started it.
    pub owner: Arc<str>,
    pub env: String,
    /// The limits the job runs with: its environment's, with the jobs' time limit.
    pub limits: Limits,
    pub created: Instant,
    /// Cancelled by `kill` (or the server's shutdown): from then on the job
    /// no longer counts against `max_jobs`.
    cancel: CancellationToken,
    state: watch::Sender<State>,
    logs: Mutex<[Log; 2]>,
    /// How it ended, and when (tokio's clock, which tests can advance).
    ending: Mutex<Option<(Ending, tokio::time::Instant)>>,
}

impl Job {
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    pub fn ending(&self) -> Option<Ending> {
        self.ending
            .lock()
            .recover()
            .as_ref()
            .map(|(e, _)| e.clone())
    }

    /// Kills the job's sandbox (or takes it out of the queue); its place
    /// among the running jobs is free at once.
    pub fn kill(&self) {
        self.cancel.cancel();
    }

    /// Whether the job takes one of the `max_jobs` places.
    fn holds_place(&self) -> bool {
        self.state() != State::Finished && !self.cancel.is_cancelled()
    }

    /// Waits until the job finishes or `limit` passes; true when finished.
    pub async fn wait(&self, limit: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|s| *s == State::Finished))
            .await
            .is_ok()
    }

    /// New output of both streams (see [`Log::read`]).
    pub fn read(
        &self,
        stdout_from: Option<u64>,
        stderr_from: Option<u64>,
        max: usize,
    ) -> (Chunk, Chunk) {
        let mut logs = self.logs.lock().recover();
        let [out, err] = &mut *logs;
        (out.read(stdout_from, max), err.read(stderr_from, max))
    }

    /// Records how the run ended (called once, by the task that ran it).
    /// `project`: its changes, already read, so the overlay's layer is let go.
    pub fn finish(&self, result: Result<Outcome, ExecError>, project: Option<Note>) {
        let ending = match result {
            Ok(mut o) => {
                o.upper = None;
                Ending::Ran(Box::new(o), project)
            }
            Err(e) => Ending::Failed(Arc::new(e)),
        };
        *self.ending.lock().recover() = Some((ending, tokio::time::Instant::now()));
        self.state.send_replace(State::Finished);
    }

    fn finished_since(&self) -> Option<tokio::time::Instant> {
        self.ending.lock().recover().as_ref().map(|(_, at)| *at)
    }
}

/// The job is an observer of its own run: output goes into its logs.
impl Observer for Job {
    fn started(&self) {
        self.state.send_replace(State::Running);
    }

    fn output(&self, stream: Stream, data: &[u8]) {
        let i = match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        };
        self.logs.lock().recover()[i].push(data);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{max} jobs are already running")]
    Full { max: usize },
    #[error("this caller already has {max} jobs running, its share of the server")]
    OwnerFull { max: usize },
}

/// The server's jobs.
#[derive(Debug)]
pub struct Jobs {
    limits: JobLimits,
    table: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: Mutex<u64>,
}

impl Jobs {
    pub fn new(limits: JobLimits) -> Jobs {
        Jobs {
            limits,
            table: Mutex::new(BTreeMap::new()),
            next: Mutex::new(1),
        }
    }

    pub fn limits(&self) -> JobLimits {
        self.limits
    }

    /// Registers a new job in environment `env`, whose limits are
    /// `env_limits` but for the jobs' own time limit; its run stops when
    /// `parent` is cancelled. `owner`: who starts it, with at most
    /// `owner_max` of its jobs running at once.
    pub fn create(
        &self,
        owner: &Arc<str>,
        owner_max: Option<usize>,
        env: &str,
        env_limits: Limits,
        parent: &CancellationToken,
    ) -> Result<(Arc<Job>, CancellationToken), JobError> {
        let mut table = self.table.lock().recover();
        self.forget_old(&mut table);
        if table.values().filter(|j| j.holds_place()).count() >= self.limits.max_jobs {
            return Err(JobError::Full {
                max: self.limits.max_jobs,
            });
        }
        if let Some(max) = owner_max
            && table
                .values()
                .filter(|j| j.holds_place() && &j.owner == owner)
                .count()
                >= max
        {
            return Err(JobError::OwnerFull { max });
        }
        let n = {
            let mut next = self.next.lock().recover();
            let n = *next;
            *next += 1;
            n
        };
        let cancel = parent.child_token();
        let job = Arc::new(Job {
            id: format!("job-{n}"),
            owner: owner.clone(),
            env: env.to_string(),
            limits: Limits {
                timeout: self.limits.timeout,
                ..env_limits
            },
            created: Instant::now(),
            cancel: cancel.clone(),
            state: watch::Sender::new(State::Queued),
            logs: Mutex::new([
                Log::new(self.limits.output_bytes),
                Log::new(self.limits.output_bytes),
            ]),
            ending: Mutex::new(None),
        });
        table.insert(n, job.clone());
        Ok((job, cancel))
    }

    /// `owner`'s job `id` (another's is not found).
    pub fn get(&self, owner: &str, id: &str) -> Option<Arc<Job>> {
        let mut table = self.table.lock().recover();
        self.forget_old(&mut table);
        let n: u64 = id.strip_prefix("job-")?.parse().ok()?;
        table.get(&n).filter(|j| &*j.owner == owner).cloned()
    }

    /// Every job of `owner`, oldest first.
    pub fn list(&self, owner: &str) -> Vec<Arc<Job>> {
        let mut table = self.table.lock().recover();
        self.forget_old(&mut table);
        table
            .values()
            .filter(|j| &*j.owner == owner)
            .cloned()
            .collect()
    }

    /// Forgets finished jobs past their retention time, then the oldest
    /// finished ones beyond the retained count.
    fn forget_old(&self, table: &mut BTreeMap<u64, Arc<Job>>) {
        let retention = self.limits.retention;
        table.retain(|_, j| j.finished_since().is_none_or(|at| at.elapsed() < retention));
        let finished = |table: &BTreeMap<u64, Arc<Job>>| {
            table
                .iter()
                .filter_map(|(n, j)| j.finished_since().map(|at| (at, *n, j.owner.clone())))
                .collect::<Vec<_>>()
        };
        let mut kept = finished(table);
        while kept.len() > self.limits.retained {
            // The oldest of the owner keeping the most.
            let mut counts: std::collections::HashMap<&Arc<str>, usize> = Default::default();
            for (_, _, owner) in &kept {
                *counts.entry(owner).or_default() += 1;
            }
            let most = counts.values().copied().max().unwrap_or(0);
            let victim = kept
                .iter()
                .filter(|(_, _, o)| counts[o] == most)
                .min_by_key(|(at, n, _)| (*at, *n))
                .map(|(_, n, _)| *n);
            match victim {
                Some(n) => table.remove(&n),
                None => break,
            };
            kept = finished(table);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Arc<str> {
        "me".into()
    }

    #[test]
    fn logs_keep_the_latest_bytes_with_absolute_offsets() {
        let mut log = Log::new(10);
        log.push(b"0123456789");
        log.push(b"abcde");
        assert_eq!((log.first, log.end()), (5, 15));
        let c = log.read(Some(0), 100);
        assert_eq!(c.lost_bytes, 5);
        assert_eq!(c.output.text, "56789abcde");
        assert_eq!(c.next_offset, 15);
        let c = log.read(None, 100);
        assert_eq!(c.output.text, "");
        log.push(b"XY");
        let c = log.read(None, 100);
        assert_eq!(
            (c.output.text.as_str(), c.offset, c.next_offset),
            ("XY", 15, 17)
        );
        let c = log.read(Some(13), 100);
        assert_eq!(c.output.text, "deXY");
    }

    #[test]
    fn large_reads_keep_head_and_tail() {
        let mut log = Log::new(1000);
        log.push(&[b'a'; 300]);
        log.push(&[b'b'; 300]);
        let c = log.read(None, 100);
        assert!(c.output.text.starts_with("aaaa") && c.output.text.ends_with("bbbb"));
        assert_eq!(c.output.dropped_bytes, 500);
        assert_eq!(c.next_offset, 600);
    }

    fn env_limits() -> Limits {
        Limits::resolve(Default::default())
    }

    fn limits() -> JobLimits {
        JobLimits {
            max_jobs: 2,
            timeout: Duration::from_secs(60),
            retention: Duration::from_secs(3600),
            retained: 2,
            output_bytes: 100,
        }
    }

    fn ids(jobs: &Jobs) -> Vec<String> {
        jobs.list("me").iter().map(|j| j.id.clone()).collect()
    }

    #[tokio::test]
    async fn running_jobs_are_bounded_and_a_kill_frees_a_place_at_once() {
        let jobs = Jobs::new(limits());
        let shutdown = CancellationToken::new();
        let (a, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        let (b, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        assert!(matches!(
            jobs.create(&me(), None, "bash", env_limits(), &shutdown),
            Err(JobError::Full { max: 2 })
        ));
        a.kill();
        let (c, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        assert_eq!(c.id, "job-3");
        // A finished job no longer runs: it is kept for reading, out of the count.
        b.finish(Err(ExecError::CancelledWhileQueued), None);
        jobs.create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        assert_eq!(ids(&jobs), ["job-1", "job-2", "job-3", "job-4"]);
    }

    #[tokio::test]
    async fn finished_jobs_are_kept_within_a_count_oldest_forgotten_first() {
        let jobs = Jobs::new(limits());
        let shutdown = CancellationToken::new();
        for _ in 0..4 {
            let (j, _) = jobs
                .create(&me(), None, "bash", env_limits(), &shutdown)
                .unwrap();
            j.finish(Err(ExecError::CancelledWhileQueued), None);
        }
        assert_eq!(ids(&jobs), ["job-3", "job-4"]);
        assert!(jobs.get("me", "job-1").is_none() && jobs.get("me", "job-4").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn finished_jobs_are_forgotten_after_their_retention_time() {
        let jobs = Jobs::new(JobLimits {
            retention: Duration::from_secs(60),
            ..limits()
        });
        let shutdown = CancellationToken::new();
        let (a, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        let (_running, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        a.finish(Err(ExecError::CancelledWhileQueued), None);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(jobs.get("me", "job-1").is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(jobs.get("me", "job-1").is_none());
        assert!(
            jobs.get("me", "job-2").is_some(),
            "a running job is never forgotten"
        );
    }

    #[tokio::test]
    async fn jobs_stop_with_the_server() {
        let jobs = Jobs::new(limits());
        let shutdown = CancellationToken::new();
        let (_j, cancel) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        shutdown.cancel();
        assert!(cancel.is_cancelled());
    }

    #[test]
    fn a_job_is_seen_waited_on_and_killed_by_its_owner_alone() {
        let jobs = Jobs::new(JobLimits {
            max_jobs: 4,
            ..limits()
        });
        let shutdown = CancellationToken::new();
        let (mine, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        let other: Arc<str> = "other".into();
        assert!(jobs.get("other", &mine.id).is_none());
        assert!(jobs.list("other").is_empty());
        assert_eq!(jobs.list("me").len(), 1);
        let (theirs, _) = jobs
            .create(&other, None, "bash", env_limits(), &shutdown)
            .unwrap();
        assert!(jobs.get("me", &theirs.id).is_none());
        assert!(jobs.get("other", &theirs.id).is_some());
    }

    #[test]
    fn an_owner_bound_leaves_places_to_the_others() {
        let jobs = Jobs::new(JobLimits {
            max_jobs: 4,
            ..limits()
        });
        let shutdown = CancellationToken::new();
        let greedy: Arc<str> = "greedy".into();
        for _ in 0..2 {
            jobs.create(&greedy, Some(2), "bash", env_limits(), &shutdown)
                .unwrap();
        }
        assert!(matches!(
            jobs.create(&greedy, Some(2), "bash", env_limits(), &shutdown),
            Err(JobError::OwnerFull { max: 2 })
        ));
        assert!(
            jobs.create(&me(), Some(2), "bash", env_limits(), &shutdown)
                .is_ok()
        );
    }

    #[test]
    fn past_the_retained_count_the_owner_keeping_most_loses_its_oldest() {
        let jobs = Jobs::new(JobLimits {
            max_jobs: 8,
            retained: 3,
            ..limits()
        });
        let shutdown = CancellationToken::new();
        let greedy: Arc<str> = "greedy".into();
        let (mine, _) = jobs
            .create(&me(), None, "bash", env_limits(), &shutdown)
            .unwrap();
        mine.finish(Err(ExecError::CancelledWhileQueued), None);
        for _ in 0..4 {
            let (j, _) = jobs
                .create(&greedy, None, "bash", env_limits(), &shutdown)
                .unwrap();
            j.finish(Err(ExecError::CancelledWhileQueued), None);
        }
        assert_eq!(jobs.list("me").len(), 1, "the one job of `me` is kept");
        assert_eq!(jobs.list("greedy").len(), 2);
    }
}
