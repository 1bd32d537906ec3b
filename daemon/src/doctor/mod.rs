//! `doctor`: checks, one by one, what the sandbox and the README's first
//! commands need on this machine, each finding with a concrete fix. A check
//! is one function returning its findings; [`run`] calls them in order, and
//! later checks build on what earlier ones set up. The same checks gate
//! `--stdio`.

use serde::Serialize;

use crate::app::{self, StartError, StartOptions};
use crate::config::{self, Config};
use crate::exec::{Executor, Request};
use crate::jail::ProjectMount;
use crate::limits::Mechanism;
use crate::platform::Platform;
use crate::registry::{self, Registry};

pub mod probe;
mod protections;

/// The shape of `doctor --json`; raised when a field changes meaning or goes.
pub const JSON_VERSION: u32 = 1;

/// One thing a check found.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// What was checked, e.g. `bubblewrap` or `environment python`.
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about a warning or failure.
    pub fix: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Finding {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding {
            name: name.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Finding::ok(name, detail)
        }
    }

    fn fail(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            status: Status::Fail,
            ..Finding::warn(name, detail, fix)
        }
    }

    /// The finding as `doctor` prints it.
    pub fn to_text(&self) -> String {
        let tag = match self.status {
            Status::Ok => "ok   ",
            Status::Warn => "warn ",
            Status::Fail => "FAIL ",
        };
        let mut text = format!("{tag} {}: {}\n", self.name, self.detail);
        if let Some(fix) = &self.fix {
            text += &format!("      fix: {fix}\n");
        }
        text
    }
}

/// The last line of `doctor`'s text output.
pub fn summary(findings: &[Finding]) -> String {
    match failures(findings) {
        0 => "\nall checks passed\n".to_string(),
        n => format!("\n{n} check(s) failed\n"),
    }
}

pub fn failures(findings: &[Finding]) -> usize {
    findings.iter().filter(|f| f.status == Status::Fail).count()
}

/// `doctor --json`: `{"version", "ok", "checks": [{name, status, detail, fix}]}`.
pub fn to_json(findings: &[Finding]) -> serde_json::Value {
    serde_json::json!({
        "version": JSON_VERSION,
        "ok": failures(findings) == 0,
        "checks": findings,
    })
}

/// What the checks have set up so far.
#[derive(Default)]
struct State {
    config: Option<Config>,
    executor: Option<Executor>,
    project: Option<ProjectMount>,
    registry: Option<Registry>,
}

/// Runs every check in order, handing each finding to `report` as soon as
/// it is known; returns them all.
pub async fn run(opts: &StartOptions, mut report: impl FnMut(&Finding)) -> Vec<Finding> {
    let mut s = State::default();
    let mut all = Vec::new();
    let mut record = |findings: Vec<Finding>| {
        findings.iter().for_each(&mut report);
        all.extend(findings);
    };
    record(check_config(&mut s, opts));
    record(check_bubblewrap(&mut s));
    record(check_sandbox(&mut s).await);
    if let Some(executor) = &s.executor {
        record(protections::check(executor).await);
    }
    record(check_nest(&s));
    record(check_store_view(&s));
    record(check_limits(&s));
    record(check_project(&mut s));
    record(check_environments(&mut s).await);
    record(check_memory_budget(&s));
    record(check_commands(&s));
    record(check_example_run(&s).await);
    if let Some(executor) = s.executor {
        executor.shutdown().await;
    }
    all
}

fn check_config(s: &mut State, opts: &StartOptions) -> Vec<Finding> {
    match config::load(opts.config.as_deref()) {
        Ok(c) => {
            let detail = match &c.file {
                Some(f) => format!("loaded {}", f.display()),
                None => "no config file; built-in defaults (host mode)".to_string(),
            };
            s.config = Some(c);
            vec![Finding::ok("config", detail)]
        }
        Err(e) => vec![Finding::fail(
            "config",
            e.to_string(),
            "correct the file, or start without --config to use the defaults",
        )],
    }
}

fn check_bubblewrap(s: &mut State) -> Vec<Finding> {
    let Some(config) = &s.config else {
        return Vec::new();
    };
    let p = match Platform::probe(config.knobs.bwrap.as_deref()) {
        Ok(p) => p,
        Err(e) => return vec![Finding::fail("bubblewrap", e.to_string(), e.fix())],
    };
    let chosen = &p.bwrap_chosen;
    let passed: Vec<String> = chosen
        .passed_over
        .iter()
        .map(|(path, why)| format!("{} ({why})", path.display()))
        .collect();
    let mut found = vec![Finding::ok(
        "bubblewrap",
        format!(
            "{} {} ({}){}",
            p.bwrap.display(),
            p.bwrap_version,
            chosen.why,
            if passed.is_empty() {
                String::new()
            } else {
                format!("; passed over: {}", passed.join(", "))
            }
        ),
    )];
    if !p.layout.features.disable_userns {
        found.push(Finding::warn(
            "bubblewrap",
            "this version cannot forbid nested user namespaces (--disable-userns needs 0.8)",
            "upgrade bubblewrap to 0.8 or later",
        ));
    }
    if !p.layout.features.add_seccomp_fd {
        found.push(Finding::warn(
            "bubblewrap",
            "this version loads one seccomp program; clone3 is not filtered",
            "upgrade bubblewrap to 0.5 or later",
        ));
    }
    if p.run_as.is_some() {
        found.push(Finding::ok(
            "identity",
            format!(
                "running as root: sandboxes start as host uid {} (nobody), never as root",
                crate::platform::UNPRIVILEGED_ID
            ),
        ));
    }
    match app::executor_for(config, false) {
        Ok(x) => s.executor = Some(x),
        Err(e) => found.push(Finding::fail(
            "sandbox",
            e.to_string(),
            "see the message above",
        )),
    }
    found
}

async fn check_sandbox(s: &mut State) -> Vec<Finding> {
    let Some(executor) = &s.executor else {
        return Vec::new();
    };
    let finding = match app::self_test(executor).await {
        Ok(()) => Finding::ok("sandbox", "a test sandbox started and ran `echo ok`"),
        Err(StartError::Sandbox { detail, fix }) => Finding::fail("sandbox", detail, fix),
        Err(e) => Finding::fail("sandbox", e.to_string(), "see the message above"),
    };
    if finding.status == Status::Fail {
        // Nothing else can be tried in a sandbox that does not start.
        if let Some(x) = s.executor.take() {
            x.shutdown().await;
        }
    }
    vec![finding]
}

fn check_nest(s: &State) -> Vec<Finding> {
    let Some(executor) = &s.executor else {
        return Vec::new();
    };
    vec![match executor.nest() {
        Ok(()) => Finding::ok(
            "nest",
            "sandboxes start in the server's own user and pid namespaces: their writable filesystems are bounded in size and files, the project can be a copy-on-write overlay, and nothing outlives the server",
        ),
        Err(why) => Finding::warn(
            "nest",
            format!(
                "sandboxes start without the nest ({why}): no copy-on-write project (it is read-only instead), /workspace, /tmp and /dev/shm are bounded in size each but not in files; a server killed outright still takes its sandboxes with it (bubblewrap's parent-death signal)"
            ),
            nest_fix(why),
        ),
    }]
}

fn check_store_view(s: &State) -> Vec<Finding> {
    let Some(executor) = &s.executor else {
        return Vec::new();
    };
    vec![match executor.probe_store_view() {
        Ok(()) => Finding::ok(
            "store views",
            "a Nix closure is bound into each sandbox in one piece, from a view made once per closure (checked: a view was made)",
        ),
        Err(why) => Finding::warn(
            "store views",
            format!(
                "a Nix closure is bound into each sandbox path by path ({why}): the same files, but setting up a sandbox of a large closure costs more (about 100 ms for 200 paths)"
            ),
            "nothing to change for correctness; for speed with large closures, let the nest start (see the nest finding) and leave NIX_SANDBOX_STORE_VIEW unset",
        ),
    }]
}

/// What would let the daemon create the nest, from why it could not.
fn nest_fix(why: &str) -> String {
    if why == crate::config::Switches::off(crate::config::knobs::NEST_VAR) {
        return format!("unset {}", crate::config::knobs::NEST_VAR);
    }
    match crate::userns::Host::default().obstacles_after_failure().first() {
        Some(o) => format!("{}: {}", o.why(), o.fix()),
        None => "the kernel refused an unprivileged user namespace or a mount in it (Linux 5.11 or later is needed for overlayfs there); run the server outside any container that restricts them".to_string(),
    }
}

fn check_limits(s: &State) -> Vec<Finding> {
    let Some(executor) = &s.executor else {
        return Vec::new();
    };
    let enforcer = executor.enforcer();
    let without_v2 = enforcer.without_cgroup_v2();
    vec![match (enforcer.mechanism(), without_v2) {
        (Mechanism::Rlimits, _) => Finding::warn(
            "limits",
            enforcer.describe(),
            format!(
                "without a cgroup, {}{}",
                crate::limits::RLIMITS_MEMORY,
                without_v2
                    .map(|w| format!("; for cgroup v2: {}", w.step))
                    .unwrap_or_default()
            ),
        ),
        // cgroup v1 holds the limits; v2 is the better mechanism (one
        // hierarchy, frozen sessions, cheaper sandboxes under load).
        (Mechanism::CgroupV1, Some(w)) => {
            Finding::ok("limits", format!("{}. {w}", enforcer.describe()))
        }
        _ => Finding::ok("limits", enforcer.describe()),
    }]
}

fn check_project(s: &mut State) -> Vec<Finding> {
    let (Some(config), Some(_)) = (&s.config, &s.executor) else {
        return Vec::new();
    };
    vec![match app::resolve_project(config) {
        Ok((Some(mut p), _)) => {
            let note = s
                .executor
                .as_ref()
                .and_then(|x| app::settle_project(x, &mut p));
            let detail = format!(
                "{} mounted at {} ({})",
                p.host_path.display(),
                p.mount_point,
                p.access.name()
            );
            s.project = Some(p);
            match note {
                None => Finding::ok("project", detail),
                Some(note) => Finding::warn(
                    "project",
                    format!("{detail}: {note}"),
                    "see the nest check above",
                ),
            }
        }
        Ok((None, note)) => Finding::warn(
            "project",
            note.unwrap_or_default(),
            "start the server in the project's directory, or set PROJECT_DIR or [project] path",
        ),
        Err(e) => Finding::fail(
            "project",
            e.to_string(),
            "set PROJECT_DIR or [project] path to an existing directory",
        ),
    }]
}

/// The generic fix for an environment that was dropped, when its warning
/// does not name one (host interpreters say `…; fix: …`).
const ENVIRONMENT_FIX: &str = "install the interpreter, or fix the environment's definition";

async fn check_environments(s: &mut State) -> Vec<Finding> {
    let (Some(config), Some(executor)) = (&s.config, &s.executor) else {
        return Vec::new();
    };
    let project_dir = s.project.as_ref().map(|p| p.host_path.as_path());
    let gathered = registry::gather(config, project_dir, &registry::sources(&config.knobs)).await;
    let reg = registry::load(config, gathered, Some(&app::ExecProber(executor.clone()))).await;
    let mut found = Vec::new();
    for (name, about) in &reg.sources {
        found.push(Finding::ok(format!("source {name}"), about.clone()));
    }
    for e in reg.iter() {
        found.push(Finding::ok(
            format!("environment {}", e.name),
            format!("{} [{}]", e.description, e.origin),
        ));
    }
    for w in &reg.warnings {
        let (detail, fix) = match w.rsplit_once("; fix: ") {
            Some((detail, fix)) => (detail, fix),
            None => (w.as_str(), ENVIRONMENT_FIX),
        };
        found.push(Finding::warn("environments", detail, fix));
    }
    if reg.is_empty() {
        found.push(Finding::fail(
            "environments",
            "none is available",
            "install bash, python3 or node, or configure environments",
        ));
    }
    s.registry = Some(reg);
    found
}

/// How many sandboxes the memory budget holds at once, against the calls
/// allowed to run at once: with fewer, calls wait for memory before a run
/// slot, and with one, they run one at a time, which looks like a slow
/// server (a warning).
fn check_memory_budget(s: &State) -> Vec<Finding> {
    let (Some(config), Some(executor), Some(reg)) = (&s.config, &s.executor, &s.registry) else {
        return Vec::new();
    };
    let largest = reg
        .iter()
        .map(|e| (e.limits.memory_bytes, e.name.as_str()))
        .max();
    let Some((largest_bytes, env)) = largest else {
        return Vec::new();
    };
    vec![budget_finding(
        executor.memory_budget_mib(),
        config.server.memory_budget_mb.is_some(),
        executor.max_concurrent_runs(),
        executor.budget_holds(largest_bytes),
        (largest_bytes >> 20, env),
    )]
}

/// The finding for a budget of `budget_mib` (set in the configuration, or
/// the default) that holds `fit` sandboxes of the largest memory limit of
/// an environment (in MiB, and its name), with `max_running` calls at once.
fn budget_finding(
    budget_mib: u64,
    configured: bool,
    max_running: usize,
    fit: u64,
    (largest_mib, env): (u64, &str),
) -> Finding {
    let origin = if configured {
        "[server] memory_budget_mb"
    } else {
        "the default, half of the memory the server may use"
    };
    let sandboxes = if fit == 1 { "sandbox" } else { "sandboxes" };
    let mut detail = format!(
        "{budget_mib} MiB ({origin}) holds {fit} {sandboxes} at the largest memory limit ({largest_mib} MiB, environment {env}) at once, prepared ones included; {max_running} calls may run at once (max_concurrent_runs)"
    );
    if fit >= max_running as u64 {
        return Finding::ok("memory budget", detail);
    }
    detail += &format!(", so calls beyond {fit} wait for memory");
    if fit > 1 {
        return Finding::ok("memory budget", detail);
    }
    Finding::warn(
        "memory budget",
        detail,
        "give environments whose code needs less a lower memory_mb, or raise [server] memory_budget_mb (sandboxes rarely use all of their limit; the budget keeps their limits together within what the host can give)",
    )
}

/// The declared commands, checked as `--stdio` checks them before serving.
fn check_commands(s: &State) -> Vec<Finding> {
    let (Some(config), Some(reg)) = (&s.config, &s.registry) else {
        return Vec::new();
    };
    match app::declared_commands(config, reg, s.project.as_ref()) {
        Ok(commands) => {
            let catalog = commands.catalog();
            if catalog.is_empty() {
                return Vec::new();
            }
            let listed: Vec<String> = catalog
                .offered
                .iter()
                .map(|o| format!("{} (in {})", o.tool, o.command.env))
                .collect();
            vec![Finding::ok(
                "commands",
                format!("offered as tools: {}", listed.join(", ")),
            )]
        }
        Err(e) => vec![Finding::fail(
            "commands",
            e.to_string(),
            "correct each declaration as its problem says (docs/commands.md); the server does not start until they are valid",
        )],
    }
}

/// The environment and code of the README's first `run` command.
pub const EXAMPLE_ENV: &str = "python";
pub const EXAMPLE_CODE: &str = "print(6 * 7)";

/// Runs the README's example, as a user's first command would.
async fn check_example_run(s: &State) -> Vec<Finding> {
    let (Some(reg), Some(executor)) = (&s.registry, &s.executor) else {
        return Vec::new();
    };
    let name = "example run";
    let Some(env) = reg.get(EXAMPLE_ENV) else {
        return vec![Finding::warn(
            name,
            format!(
                "there is no {EXAMPLE_ENV} environment, so `nix-sandbox-mcp run -e {EXAMPLE_ENV} '{EXAMPLE_CODE}'` cannot work"
            ),
            "install python3 (`apt install python3`), or try the example with another environment (`nix-sandbox-mcp envs`)",
        )];
    };
    let outcome = executor
        .run(Request {
            project: s.project.as_ref(),
            ..Request::internal(env, EXAMPLE_CODE.as_bytes())
        })
        .await;
    vec![match outcome {
        Ok(o) if o.succeeded() && o.stdout.text.trim() == "42" => Finding::ok(
            name,
            format!("`{EXAMPLE_CODE}` in {EXAMPLE_ENV} printed 42 in the sandbox"),
        ),
        Ok(o) => Finding::fail(
            name,
            format!(
                "`{EXAMPLE_CODE}` in {EXAMPLE_ENV} ended with exit status {:?}: {}",
                o.exit_code,
                o.stderr.text.trim()
            ),
            "run `nix-sandbox-mcp run -e python 'print(6 * 7)'` to see the whole output",
        ),
        Err(e) => Finding::fail(
            name,
            e.to_string(),
            app::diagnose_sandbox_failure(&e.to_string()),
        ),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_budget_warns_when_it_holds_fewer_sandboxes_than_may_run() {
        let roomy = budget_finding(12_000, false, 2, 11, (1024, "python"));
        assert_eq!(roomy.status, Status::Ok);
        assert!(
            roomy.detail.starts_with(
                "12000 MiB (the default, half of the memory the server may use) holds 11 sandboxes at the largest memory limit (1024 MiB, environment python) at once"
            ),
            "{}",
            roomy.detail
        );

        // A 4 GiB machine with the defaults: one sandbox at a time.
        let small = budget_finding(1953, false, 2, 1, (1024, "bash"));
        assert_eq!(small.status, Status::Warn);
        assert!(
            small.detail.contains("holds 1 sandbox at")
                && small.detail.ends_with("so calls beyond 1 wait for memory"),
            "{}",
            small.detail
        );
        assert!(small.fix.unwrap().contains("memory_budget_mb"));

        // Fewer than may run, but more than one: said, not warned about.
        let set = budget_finding(4096, true, 8, 4, (1024, "bash"));
        assert_eq!(set.status, Status::Ok);
        assert!(set.detail.contains("([server] memory_budget_mb)"));
        assert!(set.detail.ends_with("so calls beyond 4 wait for memory"));
    }

    #[test]
    fn findings_print_as_before_and_serialise_to_the_documented_shape() {
        let findings = vec![
            Finding::ok("config", "no config file"),
            Finding::warn("limits", "rlimits only", "use a cgroup"),
            Finding::fail("project", "missing", "set PROJECT_DIR"),
        ];
        assert_eq!(findings[0].to_text(), "ok    config: no config file\n");
        assert_eq!(
            findings[2].to_text(),
            "FAIL  project: missing\n      fix: set PROJECT_DIR\n"
        );
        assert_eq!(summary(&findings), "\n1 check(s) failed\n");
        let v = to_json(&findings);
        assert_eq!(v["version"], JSON_VERSION);
        assert_eq!(v["ok"], false);
        assert_eq!(v["checks"][0]["fix"], serde_json::Value::Null);
        assert_eq!(v["checks"][1]["status"], "warn");
        let keys: Vec<&String> = v["checks"][2].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["detail", "fix", "name", "status"]);
    }
}
