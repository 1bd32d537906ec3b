//! Jobs as tasks (the `io.modelcontextprotocol/tasks` extension, under
//! 2026-07-28): when a call declares the extension, `run` with `background`
//! answers with a task handle; `tasks/get` gives the job's status, its new
//! output (the `job` tool's result, in `_meta`) and, once it has finished,
//! its result; `tasks/cancel` kills it. One job table, two faces: clients
//! without the extension use the `job` tool.
//!
//! rmcp's `TaskManager` is not used: its tasks are futures that end in one
//! result (no output while they run), its ids are not bound to a caller,
//! and its cancellation sets a flag, where a job's kill takes down the
//! sandbox's whole process tree and frees its place at once. Task ids here
//! are 128 random bits, bound to the caller that started the job; another
//! caller's id, or one never issued, is an unknown task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, JsonObject, MetaObject, Task,
    TaskPayload, TaskStatus,
};

use crate::exec::ExecError;
use crate::jobs::{Ending, Job, Jobs};
use crate::sync::Recover;

/// How often a client is asked to poll.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The `_meta` key of a running task's new output (the `job` tool's result).
pub const OUTPUT_META: &str = "nix-sandbox-mcp/job";

/// Why a task id reaches no job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unknown {
    /// Never issued to this caller (forged, another caller's, or from
    /// before a restart).
    NotIssued,
    /// Its job was forgotten (finished jobs are kept for a while).
    Forgotten,
    /// Another replica's, which holds it.
    OtherReplica(String),
}

struct Entry {
    principal: Arc<str>,
    job: String,
    created: SystemTime,
}

#[derive(Default)]
pub struct Tasks {
    ids: Mutex<HashMap<String, Entry>>,
    /// This server's name among replicas, put in the ids it mints.
    replica: Option<String>,
}

/// What task ids start with.
const PREFIX: &str = "t_";

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks").finish_non_exhaustive()
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

impl Tasks {
    /// Tasks whose ids name `replica` (none: a server that is no replica).
    pub fn new(replica: Option<String>) -> Tasks {
        Tasks {
            ids: Mutex::default(),
            replica,
        }
    }

    /// A task for `job`, started by `principal`: its handle.
    pub fn issue(&self, principal: &Arc<str>, job: &Job, jobs: &Jobs) -> Option<CreateTaskResult> {
        let id = super::ids::mint(PREFIX, self.replica.as_deref())?;
        let created = SystemTime::now();
        let mut ids = self.ids.lock().recover();
        // Tasks of forgotten jobs go with them.
        ids.retain(|_, e| jobs.get(&e.principal, &e.job).is_some());
        ids.insert(
            id.clone(),
            Entry {
                principal: principal.clone(),
                job: job.id.clone(),
                created,
            },
        );
        let task = Task::new(id, TaskStatus::Working, rfc3339(created), rfc3339(created))
            .with_status_message(format!("{} {}", job.id, job.state().as_str()))
            .with_ttl_ms(
                jobs.limits().retention.as_millis() as u64 + job.limits.timeout.as_millis() as u64,
            )
            .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64);
        Some(CreateTaskResult::new(task))
    }

    /// The job behind `task_id` for `principal`.
    pub fn job(
        &self,
        principal: &Arc<str>,
        task_id: &str,
        jobs: &Jobs,
    ) -> Result<(Arc<Job>, SystemTime), Unknown> {
        if let Some(Some(other)) = super::ids::replica_of(PREFIX, task_id)
            && Some(other) != self.replica.as_deref()
        {
            return Err(Unknown::OtherReplica(other.to_string()));
        }
        let ids = self.ids.lock().recover();
        let entry = ids
            .get(task_id)
            .filter(|e| &e.principal == principal)
            .ok_or(Unknown::NotIssued)?;
        let job = jobs.get(principal, &entry.job).ok_or(Unknown::Forgotten)?;
        Ok((job, entry.created))
    }
}

/// The task's state: working with its new output, or ended with the job's
/// result (cancelled when it was killed).
/// `status`: the `job` tool's result for it now (its new output).
pub fn detailed(
    task_id: &str,
    job: &Job,
    created: SystemTime,
    status: CallToolResult,
    ttl: Duration,
) -> GetTaskResult {
    let ending = job.ending();
    let cancelled = match &ending {
        Some(Ending::Ran(o, _)) => o.cancelled,
        Some(Ending::Failed(e)) => matches!(**e, ExecError::CancelledWhileQueued),
        None => false,
    };
    let payload = match (ending.is_some(), cancelled) {
        (false, _) => TaskPayload::Working,
        (true, true) => TaskPayload::Cancelled,
        (true, false) => match serde_json::to_value(&status) {
            Ok(serde_json::Value::Object(result)) => TaskPayload::Completed { result },
            _ => TaskPayload::Completed {
                result: JsonObject::new(),
            },
        },
    };
    let message = format!(
        "{} {}, {} s",
        job.id,
        job.state().as_str(),
        job.created.elapsed().as_secs()
    );
    let task = Task::new(
        task_id,
        TaskStatus::Working,
        rfc3339(created),
        rfc3339(SystemTime::now()),
    )
    .with_status_message(message)
    .with_ttl_ms(ttl.as_millis() as u64)
    .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64);
    let mut result = GetTaskResult::new(DetailedTask::new(task, payload));
    if let Some(content) = status.structured_content {
        let mut meta = MetaObject::new();
        meta.0.insert(OUTPUT_META.into(), content);
        result.meta = Some(meta);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobLimits;

    fn jobs() -> Jobs {
        Jobs::new(JobLimits {
            max_jobs: 4,
            timeout: Duration::from_secs(60),
            retention: Duration::from_secs(60),
            retained: 4,
            output_bytes: 1024,
        })
    }

    #[tokio::test]
    async fn a_task_reaches_its_job_for_its_caller_alone() {
        let jobs = jobs();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let (job, _cancel) = jobs
            .create(
                &"me".into(),
                None,
                "bash",
                crate::limits::Limits::resolve(Default::default()),
                &shutdown,
            )
            .unwrap();
        let tasks = Tasks::new(None);
        let (me, them): (Arc<str>, Arc<str>) = ("me".into(), "them".into());
        let handle = tasks.issue(&me, &job, &jobs).unwrap();
        let id = &handle.task.task_id;
        assert!(id.starts_with("t_") && id.len() == 34, "{id}");
        assert_eq!(tasks.job(&me, id, &jobs).unwrap().0.id, job.id);
        assert_eq!(tasks.job(&them, id, &jobs).err(), Some(Unknown::NotIssued));
        assert_eq!(
            tasks.job(&me, "t_0000", &jobs).err(),
            Some(Unknown::NotIssued)
        );
    }

    #[test]
    fn another_replicas_task_is_said_to_be_held_by_it() {
        let jobs = jobs();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let me: Arc<str> = "me".into();
        let (job, _cancel) = jobs
            .create(
                &me,
                None,
                "bash",
                crate::limits::Limits::resolve(Default::default()),
                &shutdown,
            )
            .unwrap();
        let (a, b) = (Tasks::new(Some("a".into())), Tasks::new(Some("b".into())));
        let id = a.issue(&me, &job, &jobs).unwrap().task.task_id;
        assert!(id.starts_with("t_a_"), "{id}");
        assert!(a.job(&me, &id, &jobs).is_ok());
        assert_eq!(
            b.job(&me, &id, &jobs).err(),
            Some(Unknown::OtherReplica("a".into()))
        );
    }
}
