//! Start-up wiring: configuration, then the platform probe, limits, the
//! executor, a sandbox self-test and the project mount, while the
//! environments' sources are gathered beside them, then the registry.
//! Every front end (MCP server, `run`, `envs`, `doctor`) starts here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::audit::AuditLog;
use crate::config::{self, Config, ProjectMode};
use crate::environment::{Environment, InterpreterKind};
use crate::exec::{Bounds, Executor, Queue, Request};
use crate::jail::{ProjectAccess, ProjectMount};
use crate::jobs::JobLimits;
use crate::limits::Enforcer;
use crate::platform::{Platform, PlatformError};
use crate::registry::{self, Builds, Gathered, Prober, Registry};
use crate::sessions::SessionLimits;

pub struct App {
    pub config: Config,
    pub audit: Option<Arc<AuditLog>>,
    pub executor: Executor,
    pub registry: Registry,
    pub project: Option<ProjectMount>,
    /// Why the project is not mounted, when it is not.
    pub project_note: Option<String>,
    /// `[projects.NAME]`, mounted as the project would be, by name.
    pub projects: BTreeMap<String, ProjectMount>,
    /// What the sources offered, for loading the registry again as builds end.
    pub gathered: Gathered,
    /// Builds still to run ([`StartOptions::in_background`]); in a
    /// mutex so that an `App` can be shared between threads.
    pub builds: std::sync::Mutex<Builds>,
    /// The registry's environments are still to be started once in the
    /// jail (with [`StartOptions::in_background`]; see [`ExecProber`]).
    pub checks_pending: bool,
}

/// Why the server cannot start, with the fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{error}\n  fix: {fix}")]
    Platform { error: PlatformError, fix: String },
    #[error("the sandbox does not work on this machine: {detail}\n  fix: {fix}")]
    Sandbox { detail: String, fix: String },
    #[error("{0}")]
    Project(String),
    #[error("cannot open the audit log {path}: {error}")]
    Audit { path: String, error: std::io::Error },
    #[error("the proxy's certificate authority: {0}")]
    Authority(#[from] crate::network::CaError),
    #[error("credentials: {0}")]
    Credentials(String),
    #[error("no environment is available:\n  {}\n  fix: install bash, python3 or node, or configure environments (see `nix-sandbox-mcp --help`)", .0.join("\n  "))]
    NoEnvironments(Vec<String>),
}

/// Options from the command line that shape start-up.
#[derive(Debug, Default, Clone)]
pub struct StartOptions {
    pub config: Option<PathBuf>,
    /// Load environments; `run --artifact` needs none.
    pub load_environments: bool,
    /// Skip the sandbox self-test and the probes of host environments (their
    /// versions). For a one-shot `run`, where a failure shows in the run itself.
    pub quick: bool,
    /// Keep sandboxes started ahead of time (for a long-running server).
    pub prestart: bool,
    /// Hand the Nix builds the sources start back in [`App::builds`], and
    /// leave the environments' start checks to the caller, instead of
    /// waiting for either (for a server, which answers its client first).
    pub in_background: bool,
}

pub async fn start(opts: &StartOptions) -> Result<App, StartError> {
    let config = config::load(opts.config.as_deref())?;
    let audit = match &config.server.audit_log {
        Some(p) => Some(Arc::new(
            AuditLog::open(
                &p.0,
                config.server.audit_log_code,
                config.server.audit_log_output,
            )
            .map_err(|error| StartError::Audit {
                path: p.0.display().to_string(),
                error,
            })?,
        )),
        None => None,
    };
    let (mut project, mut project_note) = resolve_project(&config)?;
    // The sources look for environments (on the host that may mean asking
    // a version manager, tens of milliseconds) while the sandbox is probed
    // and tested.
    let gathering = opts.load_environments.then(|| {
        let config = config.clone();
        let project_dir = project.as_ref().map(|p| p.host_path.clone());
        tokio::task::spawn_blocking(move || {
            let sources = registry::sources(&config.knobs);
            registry::gather_now(&config, project_dir.as_deref(), &sources)
        })
    });
    let executor = executor_for(&config, opts.prestart)?;
    check_credentials(&config, executor.platform())?;
    if !opts.quick {
        self_test(&executor).await?;
    }
    if let Some(p) = &mut project {
        project_note = settle_project(&executor, p);
    }
    executor.keep_caches(project.as_ref());
    if let Some(note) = &project_note {
        tracing::warn!("{note}");
    }
    let projects = named_projects(&config, &executor)?;
    let (mut gathered, mut builds) = (Gathered::default(), Builds::default());
    let registry = if let Some(gathering) = gathering {
        // A panic there is the caller's, as when it gathered itself.
        (gathered, builds) = gathering
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        if !opts.in_background {
            gathered = registry::finish(gathered, std::mem::take(&mut builds)).await;
        }
        let prober = ExecProber(executor.clone());
        let prober: Option<&dyn Prober> = if opts.quick || opts.in_background {
            None
        } else {
            Some(&prober)
        };
        let reg = registry::load(&config, gathered.clone(), prober).await;
        reg.log_new_warnings(None);
        if reg.offers_nothing() {
            return Err(StartError::NoEnvironments(reg.warnings.clone()));
        }
        reg
    } else {
        Registry::default()
    };
    Ok(App {
        config,
        audit,
        executor,
        registry,
        project,
        project_note,
        projects,
        gathered,
        builds: std::sync::Mutex::new(builds),
        checks_pending: opts.in_background && opts.load_environments && !opts.quick,
    })
}

/// Probes the platform and limits and builds the executor.
/// With `prestart`, sandboxes are kept started ahead of time, as many as
/// demand wants and may run at once (see `exec::prestart`).
pub fn executor_for(config: &Config, prestart: bool) -> Result<Executor, StartError> {
    let knobs = &config.knobs;
    let prestart = prestart && knobs.switches.pool;
    let platform =
        Platform::probe(knobs.bwrap.as_deref()).map_err(|error| StartError::Platform {
            fix: error.fix(),
            error,
        })?;
    crate::limits::raise_open_files_limit();
    let enforcer = match knobs.limits {
        config::LimitsChoice::Auto => Enforcer::detect(),
        config::LimitsChoice::Rlimits => Enforcer::rlimits_only(
            "cgroups turned off by NIX_SANDBOX_LIMITS=rlimits",
            "unset NIX_SANDBOX_LIMITS (or set it to auto)",
        ),
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let max_running = config
        .server
        .max_concurrent_runs
        .map(|p| p.0 as usize)
        .unwrap_or(cores.max(2));
    let max_queued = config
        .server
        .max_queued_runs
        .map(|q| q as usize)
        .unwrap_or(32);
    if prestart {
        enforcer.warm(max_running);
    }
    let memory_budget_mib = config
        .server
        .memory_budget_mb
        .map_or_else(crate::exec::default_budget_mib, |m| m.0);
    let resolver = resolver(config)?;
    trust_for_tests(config)?;
    let interceptor = interceptor(config, &platform)?;
    Ok(Executor::new(
        Arc::new(platform),
        enforcer,
        Bounds {
            max_running,
            max_waiting: max_queued,
            prestart: if prestart { max_running } else { 0 },
            memory_budget_mib,
        },
        crate::network::Proxy::new(resolver, interceptor),
        knobs.switches,
    ))
}

/// The policies of the operator's configuration: its environments' and
/// its commands' (the only ones that may hold credentials).
fn configured_policies(config: &Config) -> impl Iterator<Item = &crate::network::Policy> {
    let envs = config.environments.iter().flat_map(|m| m.values());
    envs.filter_map(|e| e.network.as_ref()?.policy())
        .chain(config.commands.values().filter_map(|c| c.network.policy()))
}

/// The hosts the configuration's credentials and request rules name, each once.
pub fn interception_hosts(config: &Config) -> Vec<String> {
    let mut hosts: Vec<String> = configured_policies(config)
        .flat_map(|p| p.interception.hosts())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The proxy's certificate authority, when some environment or command
/// has credentials or request rules; what sandboxes trust then goes into
/// the `/etc` they see.
fn interceptor(
    config: &Config,
    platform: &Platform,
) -> Result<Option<crate::network::Interceptor>, StartError> {
    let hosts = interception_hosts(config);
    if hosts.is_empty() {
        return Ok(None);
    }
    let authority =
        crate::network::Authority::open(&crate::network::Authority::default_dir(), &hosts)?;
    let interceptor = crate::network::Interceptor::new(authority);
    platform
        .add_etc_file(crate::network::CA_BUNDLE, &interceptor.bundle_pem())
        .map_err(|e| {
            StartError::Credentials(format!(
                "cannot write the sandboxes' certificate bundle: {e}"
            ))
        })?;
    Ok(Some(interceptor))
}

/// Reads every credential's value once, and refuses one a sandbox could
/// read: a file in a directory sandboxes see, or a variable
/// `[project.inherit_env]` passes to them.
fn check_credentials(config: &Config, platform: &Platform) -> Result<(), StartError> {
    let inherited = config.project.inherit_names();
    let layout = &platform.layout;
    let seen: Vec<&Path> = layout
        .system_dirs
        .iter()
        .chain(&layout.etc_host)
        .chain(&layout.etc_network)
        .map(PathBuf::as_path)
        .collect();
    for source in configured_policies(config).flat_map(|p| p.interception.sources()) {
        if let Some(var) = source.variable()
            && inherited.iter().any(|v| v == var)
        {
            return Err(StartError::Credentials(format!(
                "{source} is also passed to sandboxes by [project.inherit_env]; a credential must never be readable in the sandbox: remove it from inherit_env"
            )));
        }
        if let Some(real) = source.file() {
            if real.starts_with(crate::registry::artifact::store_dir()) {
                return Err(StartError::Credentials(format!(
                    "{source} is in the Nix store, which every user (and, for the paths of their closures, sandboxes) can read; point it at a secret outside the store, such as an agenix or sops-nix path under /run"
                )));
            }
            if let Some(dir) = seen.iter().find(|d| real.starts_with(d)) {
                return Err(StartError::Credentials(format!(
                    "{source} is under {}, which sandboxes see; keep credential files where no sandbox can read them (e.g. /run/secrets or ~/.config)",
                    dir.display()
                )));
            }
        }
        source.load().map_err(StartError::Credentials)?;
    }
    Ok(())
}

/// Why `dir` cannot be a project: it holds a credential file.
fn holds_credentials(config: &Config, dir: &Path) -> Option<String> {
    configured_policies(config)
        .flat_map(|p| p.interception.sources())
        .find_map(|source| {
            source.file()?.starts_with(dir).then(|| {
                format!(
                    "it holds {source}, which its sandboxes could read; keep credential files outside every project"
                )
            })
        })
}

/// Trusts a test build's extra authorities (`NIX_SANDBOX_TEST_TRUST`).
#[cfg(any(test, feature = "test-knobs"))]
fn trust_for_tests(config: &Config) -> Result<(), StartError> {
    use config::knobs::TEST_TRUST_VAR;
    let Some(path) = &config.knobs.test.trust else {
        return Ok(());
    };
    let n = crate::trust::trust_for_tests(path).map_err(|message| {
        StartError::Config(config::ConfigError::Env {
            name: TEST_TRUST_VAR,
            value: path.display().to_string(),
            message,
        })
    })?;
    tracing::warn!("{TEST_TRUST_VAR} is set: {n} more certificate authorities are trusted");
    Ok(())
}

#[cfg(not(any(test, feature = "test-knobs")))]
fn trust_for_tests(_: &Config) -> Result<(), StartError> {
    Ok(())
}

/// The proxy's resolver: the host's, except in a test build told otherwise.
#[cfg(any(test, feature = "test-knobs"))]
fn resolver(config: &Config) -> Result<crate::network::Resolver, StartError> {
    use config::knobs::TEST_RESOLVE_VAR;
    let Some(spec) = &config.knobs.test.resolve else {
        return Ok(crate::network::Resolver::system());
    };
    let fixed = crate::network::parse_fixed(spec).map_err(|message| {
        StartError::Config(config::ConfigError::Env {
            name: TEST_RESOLVE_VAR,
            value: spec.clone(),
            message,
        })
    })?;
    tracing::warn!(
        "{TEST_RESOLVE_VAR} is set: the proxy resolves {} name(s) from it, not from DNS",
        fixed.len()
    );
    Ok(crate::network::Resolver::with_fixed(fixed))
}

/// The proxy's resolver: the host's.
#[cfg(not(any(test, feature = "test-knobs")))]
fn resolver(_: &Config) -> Result<crate::network::Resolver, StartError> {
    Ok(crate::network::Resolver::system())
}

/// The declared commands: the configuration's `[commands.NAME]` and the
/// project file's, checked against the environments that loaded or are
/// being built.
pub fn declared_commands(
    config: &Config,
    registry: &Registry,
    project: Option<&ProjectMount>,
) -> Result<crate::commands::Commands, crate::commands::LoadError> {
    crate::commands::Commands::load(commands_setup(config, registry, project))
}

/// The same for a project the client chose while the server runs: a broken
/// project file is logged and its commands withheld, not fatal.
pub fn commands_for_new_project(
    config: &Config,
    registry: &Registry,
    project: Option<&ProjectMount>,
) -> Result<crate::commands::Commands, crate::commands::LoadError> {
    crate::commands::Commands::load_for_new_project(commands_setup(config, registry, project))
}

fn commands_setup<'a>(
    config: &'a Config,
    registry: &Registry,
    project: Option<&'a ProjectMount>,
) -> crate::commands::Setup<'a> {
    let envs = registry
        .names()
        .into_iter()
        .map(str::to_string)
        .chain(registry.aliases().keys().cloned())
        .chain(registry.building.iter().filter_map(|b| b.name.clone()))
        .collect();
    let ceilings = registry
        .names()
        .into_iter()
        .chain(registry.aliases().keys().map(String::as_str))
        .filter_map(|n| {
            let env = registry.get(n)?;
            Some((n.to_string(), crate::commands::trust::Ceiling::of(env)))
        })
        .collect();
    crate::commands::Setup {
        declared: &config.commands,
        config_file: config.file.as_deref(),
        envs,
        ceilings,
        grants: config.project.grants.clone(),
        project,
        #[cfg(any(test, feature = "test-knobs"))]
        confirm_ttl: config
            .knobs
            .test
            .confirm_ttl_ms
            .map(std::time::Duration::from_millis),
        #[cfg(not(any(test, feature = "test-knobs")))]
        confirm_ttl: None,
    }
}

/// Bounds on background jobs, from `[server]`.
pub fn job_limits(config: &Config) -> JobLimits {
    let s = &config.server;
    JobLimits {
        max_jobs: s.max_jobs.map_or(8, |p| p.0 as usize),
        timeout: seconds(s.job_timeout_seconds, 1800),
        retention: seconds(s.job_retention_seconds, 3600),
        retained: s.job_retention_count.map_or(32, |p| p.0 as usize),
        output_bytes: s.job_output_bytes.map_or(1 << 20, |p| p.0 as usize),
    }
}

/// Bounds on sessions, from `[server]`.
pub fn session_limits(config: &Config) -> SessionLimits {
    let s = &config.server;
    SessionLimits {
        max_sessions: s.max_sessions.map_or(4, |p| p.0 as usize),
        idle: seconds(s.session_idle_seconds, 600),
        lifetime: seconds(s.session_max_lifetime_seconds, 3600),
    }
}

fn seconds(v: Option<config::Positive>, default: u64) -> std::time::Duration {
    std::time::Duration::from_secs(v.map_or(default, |p| p.0))
}

/// The environment the self-test and `doctor` run: the host's /bin/sh.
pub fn self_test_env(config_defaults: crate::config::LimitSettings) -> Environment {
    let extra: Vec<PathBuf> = [Path::new("/nix/store")]
        .iter()
        .filter(|p| p.is_dir())
        .map(|p| p.to_path_buf())
        .collect();
    let mut env = registry::host_environment(
        "self-test",
        PathBuf::from("/bin/sh"),
        vec!["/bin/sh".into(), "{file}".into()],
        ".self-test.sh",
        Some(InterpreterKind::Bash),
        extra,
        config_defaults,
    );
    env.limits.timeout = std::time::Duration::from_secs(20);
    // Echoing needs little; a small share fits any memory budget.
    env.limits.memory_bytes = 64 << 20;
    env
}

/// Starts one trivial sandbox with the full policy; fails with a diagnosis.
pub async fn self_test(executor: &Executor) -> Result<(), StartError> {
    let env = self_test_env(Default::default());
    let outcome = executor
        .run(Request::internal(&env, b"echo ok\n"))
        .await
        .map_err(|e| StartError::Sandbox {
            fix: diagnose_sandbox_failure(&e.to_string()),
            detail: e.to_string(),
        })?;
    if outcome.succeeded() && outcome.stdout.text.trim() == "ok" {
        return Ok(());
    }
    let detail = if outcome.stderr.text.trim().is_empty() {
        format!(
            "a test sandbox ended with exit status {:?}",
            outcome.exit_code
        )
    } else {
        outcome.stderr.text.trim().to_string()
    };
    Err(StartError::Sandbox {
        fix: diagnose_sandbox_failure(&detail),
        detail,
    })
}

/// A concrete fix for a failed sandbox start, from bubblewrap's message and
/// what keeps this host from giving user namespaces (see [`crate::userns`]).
pub fn diagnose_sandbox_failure(stderr: &str) -> String {
    crate::userns::Host::default().fix_for(stderr)
}

/// Where a project path came from: its rules and how errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectOrigin {
    /// `PROJECT_DIR` or `[project] path`: every problem stops the server.
    Configured,
    /// The server's working directory, when nothing is configured.
    WorkingDirectory,
    /// The client's first root (MCP roots), when nothing is configured.
    ClientRoot,
}

impl ProjectOrigin {
    fn describe(self) -> &'static str {
        match self {
            ProjectOrigin::Configured => "set by PROJECT_DIR or [project] path",
            ProjectOrigin::WorkingDirectory => "the current directory",
            ProjectOrigin::ClientRoot => "the client's root",
        }
    }
}

/// The project mount, or why there is none: the configured path, else the
/// working directory (until the client names a root; see [`project_at`]).
pub fn resolve_project(
    config: &Config,
) -> Result<(Option<ProjectMount>, Option<String>), StartError> {
    let (path, origin) = match &config.project.path {
        Some(path) if config.project.path_is_explicit => (path.clone(), ProjectOrigin::Configured),
        Some(path) => (path.clone(), ProjectOrigin::WorkingDirectory),
        None => (
            std::env::current_dir().map_err(|e| {
                StartError::Project(format!("cannot read the current directory: {e}"))
            })?,
            ProjectOrigin::WorkingDirectory,
        ),
    };
    project_at(config, &path, origin)
}

/// The project mount for `path` under the configuration's `[project]`
/// settings, or why there is none. A configured path must be usable; any
/// other is skipped with the reason, and never one [`not_a_project`] refuses.
pub fn project_at(
    config: &Config,
    path: &Path,
    origin: ProjectOrigin,
) -> Result<(Option<ProjectMount>, Option<String>), StartError> {
    let p = &config.project;
    let explicit = origin == ProjectOrigin::Configured;
    let skipped = |why: String| Ok((None, Some(format!("no project mounted: {why}"))));
    let real = match std::fs::canonicalize(path) {
        Ok(r) if r.is_dir() => r,
        Ok(r) if explicit => {
            return Err(StartError::Project(format!(
                "project path {} is not a directory ({})",
                r.display(),
                origin.describe()
            )));
        }
        Err(e) if explicit => {
            return Err(StartError::Project(format!(
                "project path {}: {e} ({})",
                path.display(),
                origin.describe()
            )));
        }
        _ => {
            return skipped(format!(
                "{} {} is not a directory",
                origin.describe(),
                path.display()
            ));
        }
    };
    if !explicit && let Some(why) = not_a_project(&real, &homes()) {
        return skipped(format!(
            "{} {} is {why}, not a project; set PROJECT_DIR or [project] path to mount one",
            origin.describe(),
            real.display()
        ));
    }
    if let Some(why) = holds_credentials(config, &real) {
        let message = format!(
            "{} {} cannot be the project: {why}",
            origin.describe(),
            real.display()
        );
        if explicit {
            return Err(StartError::Project(message));
        }
        return skipped(message);
    }
    if rustix::process::geteuid().is_root() && !crate::platform::world_readable_dir(&real) {
        let message = format!(
            "the server runs as root, so sandboxes run as uid {}, which cannot read the project {}: make it and its parent directories world-readable (chmod o+rx), or run the server as a normal user",
            crate::platform::UNPRIVILEGED_ID,
            real.display()
        );
        if explicit {
            return Err(StartError::Project(message));
        }
        return skipped(message);
    }
    Ok((
        Some(ProjectMount {
            host_path: real,
            mount_point: p.mount_point.0.clone(),
            access: match p.mode {
                ProjectMode::Overlay => ProjectAccess::Overlay,
                ProjectMode::Readonly => ProjectAccess::ReadOnly,
                ProjectMode::Readwrite => ProjectAccess::ReadWrite,
            },
            overlay: false,
            downgraded: false,
            protected: project_protected(&p.protected),
        }),
        None,
    ))
}

/// Top-level directories of the system: never a project themselves.
const SYSTEM_DIRS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/nix", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
    "/var",
];
/// System directories no part of which is a project.
const SYSTEM_TREES: &[&str] = &[
    "/boot",
    "/dev",
    "/etc",
    "/proc",
    "/run",
    "/sys",
    "/nix/store",
];

/// The home directories of this machine's users (resolved): the server's
/// user's first, then those /etc/passwd names.
fn homes() -> Vec<PathBuf> {
    let mine = std::env::var_os("HOME").map(PathBuf::from);
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let listed = passwd
        .lines()
        .filter_map(|l| l.split(':').nth(5))
        .filter(|h| h.len() > 1)
        .map(PathBuf::from);
    let mut homes: Vec<PathBuf> = mine
        .into_iter()
        .chain(listed)
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .filter(|h| h != Path::new("/"))
        .collect();
    homes.dedup();
    homes
}

/// Why the directory `real` (resolved) is not a project a client's root
/// or the working directory may name: `/`, a system directory or one
/// inside /etc, /proc and the like, a home directory, a directory holding
/// one, or one under a home's dot-directories (`~/.ssh`, `~/.config`).
pub fn not_a_project(real: &Path, homes: &[PathBuf]) -> Option<String> {
    if real == Path::new("/") {
        return Some("the root directory".to_string());
    }
    if SYSTEM_DIRS.iter().any(|d| real == Path::new(d)) {
        return Some("a system directory".to_string());
    }
    if let Some(tree) = SYSTEM_TREES.iter().find(|t| real.starts_with(t)) {
        return Some(format!("inside the system directory {tree}"));
    }
    for home in homes {
        if real == home {
            return Some("a home directory".to_string());
        }
        if home.starts_with(real) {
            return Some(format!(
                "a directory holding the home directory {}",
                home.display()
            ));
        }
        if let Ok(rest) = real.strip_prefix(home)
            && rest
                .iter()
                .next()
                .is_some_and(|c| c.to_string_lossy().starts_with('.'))
        {
            return Some(format!(
                "in the home directory's {} (configuration and credentials)",
                home.join(rest.iter().next().unwrap_or_default()).display()
            ));
        }
    }
    None
}

/// The built-in protected paths and the configuration's.
fn project_protected(extra: &[config::ProjectPath]) -> Vec<String> {
    crate::changes::PROTECTED
        .iter()
        .map(|p| p.to_string())
        .chain(extra.iter().map(|p| p.0.clone()))
        .collect()
}

/// Finds out whether the nest can show `project` through an overlay; an
/// overlay project becomes read-only when it cannot, with the reason.
/// The projects of `[projects.NAME]`, each checked and mounted as a
/// configured project is: one that cannot be stops the server, saying which.
pub fn named_projects(
    config: &Config,
    executor: &Executor,
) -> Result<BTreeMap<String, ProjectMount>, StartError> {
    let mut out = BTreeMap::new();
    for (name, path) in &config.projects {
        let named = |e: StartError| StartError::Project(format!("[projects.{name}]: {e}"));
        let (mount, _) = project_at(config, path, ProjectOrigin::Configured).map_err(named)?;
        let Some(mut mount) = mount else {
            return Err(StartError::Project(format!(
                "[projects.{name}]: {} cannot be mounted",
                path.display()
            )));
        };
        if let Some(note) = settle_project(executor, &mut mount) {
            tracing::warn!("project {name}: {note}");
        }
        out.insert(name.clone(), mount);
    }
    Ok(out)
}

pub fn settle_project(executor: &Executor, project: &mut ProjectMount) -> Option<String> {
    if project.access == ProjectAccess::ReadWrite {
        return None;
    }
    match executor.probe_overlay(&project.host_path) {
        Ok(()) => {
            project.overlay = true;
            None
        }
        Err(why) if project.access == ProjectAccess::Overlay => {
            project.access = ProjectAccess::ReadOnly;
            project.downgraded = true;
            Some(format!(
                "the project is read-only: this host cannot give it a copy-on-write overlay ({why}); run `nix-sandbox-mcp doctor` for the fix"
            ))
        }
        Err(why) => {
            tracing::debug!("the read-only project is bound from the host: {why}");
            None
        }
    }
}

/// Runs start-up probes through the real executor.
pub struct ExecProber(pub Executor);

impl Prober for ExecProber {
    fn probe<'a>(
        &'a self,
        env: &'a Environment,
        code: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>>
    {
        Box::pin(async move {
            let o = self
                .0
                .run_queued(Request::internal(env, code.as_bytes()), Queue::Internal)
                .await
                .map_err(|e| e.to_string())?;
            if o.succeeded() {
                Ok(o.stdout.text)
            } else {
                let line = o
                    .stderr
                    .text
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                Err(if line.is_empty() {
                    format!("exit status {:?}", o.exit_code)
                } else {
                    line
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_that_are_not_a_project_are_told_apart() {
        let homes = [PathBuf::from("/home/u"), PathBuf::from("/root")];
        let why = |p: &str| not_a_project(Path::new(p), &homes);
        for refused in [
            "/",
            "/home",
            "/home/u",
            "/root",
            "/etc",
            "/etc/nginx",
            "/usr",
            "/var",
            "/proc/1",
            "/sys",
            "/dev",
            "/boot",
            "/run",
            "/run/user/1000",
            "/home/u/.ssh",
            "/home/u/.config/app",
            "/root/.cache",
            "/nix/store/abc-x",
            "/tmp",
        ] {
            assert!(why(refused).is_some(), "{refused} was taken for a project");
        }
        for project in [
            "/home/u/src/app",
            "/root/app",
            "/usr/src/app",
            "/var/www/site",
            "/srv/repo",
            "/workspace",
            "/tmp/nsm-test-1/project",
            "/opt/app",
            "/home/u/src/.hidden-ok",
        ] {
            assert_eq!(why(project), None, "{project} was refused");
        }
        assert!(why("/home/u/.ssh").unwrap().contains(".ssh"));
    }
}
