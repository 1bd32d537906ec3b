//! The `job` tool and background runs: starting a job, and listing, waiting
//! for and reading jobs.

// What the server's module imports, and its items.
use super::*;
use crate::commands::{Commands, ResolvedInvocation};
use crate::exec::Argv;
use crate::jobs::Job;

impl SandboxServer {
    /// A place in the job table for a run in `env`, which comes back with
    /// the job's limits (the jobs' time limit); `busy` when every place is taken.
    fn create_job(
        &self,
        mut env: Environment,
    ) -> Result<(Arc<Job>, CancellationToken, Environment), ToolError> {
        let (job, cancel) = self
            .shared
            .jobs
            .create(
                &self.principal,
                self.quota.as_ref().map(|q| q.max_jobs),
                &env.name,
                env.limits,
                &self.shared.shutdown,
            )
            .map_err(|e| {
                ToolError::new(ErrorCode::Busy, e.to_string(), "Wait for one to finish (the job tool with `wait`), or kill one you no longer need; a killed job frees its place at once.")
            })?;
        env.limits = job.limits;
        Ok((job, cancel, env))
    }

    /// Starts `code` as a background job and returns at once.
    /// `named`: the configured project it runs in, when the call named one.
    pub(super) fn start_job(
        &self,
        env: Arc<Environment>,
        code: String,
        named: Option<NamedProject<'_>>,
    ) -> Result<Arc<Job>, ToolError> {
        let named = named.map(|(n, m)| (n.to_string(), m.clone()));
        let (job, cancel, job_env) = self.create_job((*env).clone())?;
        let server = self.clone();
        let task_job = job.clone();
        tokio::spawn(async move {
            let observer: Arc<dyn Observer> = task_job.clone();
            let state = server.shared.project_state();
            let mount = named.as_ref().map(|(_, m)| m).or(state.mount.as_ref());
            let absent = project::absent_protected(mount);
            let outcome = server
                .shared
                .executor
                .run(Request {
                    env: &job_env,
                    code: code.as_bytes(),
                    project: mount,
                    inherited: &server.shared.inherited,
                    cancel,
                    observer: Some(observer),
                    share: server.run_share(),
                })
                .await;
            let note = match &outcome {
                Ok(o) => {
                    server.audit(&job_env, &code, "job", Ok(o));
                    let mut title = format!("{} {}", job_env.name, task_job.id);
                    if let Some((name, _)) = &named {
                        title += &format!(" in project {name}");
                    }
                    server
                        .project_note(mount, o.upper.clone(), absent, title, None)
                        .await
                }
                Err(e) => {
                    server.audit(&job_env, &code, "job", Err(&exec_error(e)));
                    None
                }
            };
            task_job.finish(outcome, note);
        });
        Ok(job)
    }

    /// Starts a declared command's invocation as a background job (in
    /// `env`, the command's environment; the jobs' time limit) and returns
    /// at once.
    pub(super) fn start_command_job(
        &self,
        commands: &Commands,
        inv: &ResolvedInvocation,
        env: Environment,
    ) -> Result<Arc<Job>, ToolError> {
        let (job, cancel, job_env) = self.create_job(env)?;
        let (server, task_job, inv) = (self.clone(), job.clone(), inv.clone());
        let project = commands.project().cloned();
        tokio::spawn(async move {
            let observer: Arc<dyn Observer> = task_job.clone();
            let absent = project::absent_protected(project.as_ref());
            let outcome = server
                .shared
                .executor
                .run_argv(
                    Request {
                        env: &job_env,
                        code: b"",
                        project: project.as_ref(),
                        inherited: &server.shared.inherited,
                        cancel,
                        observer: Some(observer),
                        share: server.run_share(),
                    },
                    Argv {
                        argv: &inv.argv,
                        workdir: &inv.workdir,
                    },
                )
                .await;
            let note = match &outcome {
                Ok(o) => {
                    let error = result::run_error(o, &job_env.limits);
                    server.audit_command(
                        "run",
                        &inv,
                        None,
                        Some(o),
                        error.as_ref().map(|e| e.code.as_str()),
                    );
                    let title = format!("command {} {}", inv.command, task_job.id);
                    server
                        .project_note(project.as_ref(), o.upper.clone(), absent, title, None)
                        .await
                }
                Err(e) => {
                    server.audit_command(
                        "run",
                        &inv,
                        None,
                        None,
                        Some(exec_error(e).code.as_str()),
                    );
                    None
                }
            };
            task_job.finish(outcome, note);
        });
        Ok(job)
    }

    /// Handles a `job` call.
    pub(super) async fn job(
        &self,
        args: Option<&JsonObject>,
        progress: Option<Progress>,
    ) -> CallToolResult {
        let result = async {
            let args = Arguments::new(
                args,
                tool::JOB,
                &[
                    "id",
                    "wait_seconds",
                    "kill",
                    "stdout_offset",
                    "stderr_offset",
                ],
                JOB_SHAPE,
            )?;
            let Some(id) = args.string("id")? else {
                return Ok(job_result::job_list(
                    &self.shared.jobs.list(&self.principal),
                ));
            };
            let job = self.shared.jobs.get(&self.principal, &id).ok_or_else(|| {
                let known: Vec<String> = self
                    .shared
                    .jobs
                    .list(&self.principal)
                    .iter()
                    .map(|j| j.id.clone())
                    .collect();
                let hint = if known.is_empty() {
                    "There are no jobs; start one with run(background=true).".to_string()
                } else {
                    format!("Known jobs: {}.", known.join(", "))
                };
                ToolError::new(
                    ErrorCode::UnknownJob,
                    format!("there is no job {id:?} (finished jobs are forgotten after a while)"),
                    hint,
                )
            })?;
            let wait = args.number("wait_seconds")?.unwrap_or(0.0);
            if !(0.0..=MAX_WAIT.as_secs_f64()).contains(&wait) {
                return Err(args.invalid(&format!(
                    "`wait_seconds` must be between 0 and {}",
                    MAX_WAIT.as_secs()
                )));
            }
            if args.bool("kill")?.unwrap_or(false) {
                job.kill();
                job.wait(Duration::from_secs(5)).await;
            } else if wait > 0.0 {
                let reporter = progress.map(|p| {
                    let (waited, limit) = (job.clone(), Duration::from_secs_f64(wait));
                    progress::report(
                        p.peer,
                        p.token,
                        move |_| format!("{} {}", waited.id, waited.state().as_str()),
                        limit,
                        p.before,
                    )
                });
                job.wait(Duration::from_secs_f64(wait)).await;
                if let Some(r) = reporter {
                    r.abort();
                }
            }
            let (stdout, stderr) = job.read(
                args.offset("stdout_offset")?,
                args.offset("stderr_offset")?,
                self.output_bytes.load(Ordering::Relaxed),
            );
            Ok(job_result::job_status(&job, &stdout, &stderr))
        }
        .await;
        result.unwrap_or_else(|e| result::error_result(&e))
    }
}
