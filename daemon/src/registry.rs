//! The environments this server offers, by name, loaded once at start-up from
//! the configuration, sandbox artifacts built by Nix, and (host mode) the host's
//! own interpreters. Problems with one environment drop that environment with a
//! warning; they never stop the server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{Config, EnvironmentSettings, LimitSettings};
use crate::environment::{Environment, InterpreterKind, Limits, RootFs, Source};

pub mod artifact;
pub mod flakes;
mod host;

pub use host::{PRESET_NAMES, preset_for};

#[derive(Debug, Default)]
pub struct Registry {
    envs: BTreeMap<String, Arc<Environment>>,
    /// Other names agents may use (`shell` for `bash`).
    aliases: BTreeMap<String, String>,
    /// Environments dropped at start-up, and why.
    pub warnings: Vec<String>,
}

impl Registry {
    pub fn get(&self, name: &str) -> Option<&Arc<Environment>> {
        self.envs
            .get(name)
            .or_else(|| self.aliases.get(name).and_then(|n| self.envs.get(n)))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Environment>> {
        self.envs.values()
    }

    pub fn names(&self) -> Vec<&str> {
        self.envs.keys().map(String::as_str).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.envs.len()
    }

    pub fn aliases(&self) -> &BTreeMap<String, String> {
        &self.aliases
    }

    fn insert(&mut self, env: Environment) {
        self.envs.insert(env.name.clone(), Arc::new(env));
    }

    fn warn(&mut self, msg: String) {
        tracing::warn!("{msg}");
        self.warnings.push(msg);
    }
}

/// Something that can run a probe inside the real jail at start-up.
pub trait Prober: Sync {
    /// Runs `code` in `env` and returns its stdout, or a one-line reason.
    fn probe<'a>(
        &'a self,
        env: &'a Environment,
        code: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>>;
}

/// Where environments come from besides the config file.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    /// Artifacts baked into the server package (one directory per artifact).
    pub builtin: Vec<PathBuf>,
    /// Directories of pre-built artifacts (`NIX_SANDBOX_DIR`).
    pub artifact_dirs: Vec<PathBuf>,
    /// Environments Nix built at start-up (see [`builds_needed`]).
    pub built: Vec<flakes::Built>,
    /// Environments that could not even be planned, and why.
    pub problems: Vec<String>,
}

/// The name of the environment `[project] use_flake` creates.
pub const PROJECT_ENV: &str = "project";

/// What Nix must build before the registry can load: `NIX_SANDBOX_ENVS`
/// references, config `flake` entries no baked-in artifact provides, and the
/// project's devShell environment. `own_flake` is this package's flake
/// (`NIX_SANDBOX_FLAKE`), whose library builds the last two. Returns the
/// builds and the reasons some could not be planned.
pub fn builds_needed(
    config: &Config,
    sources: &Sources,
    env_refs: &[String],
    project: Option<&Path>,
    own_flake: Option<&Path>,
) -> (Vec<flakes::Build>, Vec<String>) {
    use flakes::{Build, Target};
    let mut builds: Vec<Build> = env_refs
        .iter()
        .map(|r| Build {
            label: r.clone(),
            name: None,
            target: Target::Reference(r.clone()),
        })
        .collect();
    let mut problems = Vec::new();
    let baked: Vec<String> = sources
        .builtin
        .iter()
        .filter_map(|d| artifact::load(d, LimitSettings::default()).ok())
        .map(|e| e.name)
        .collect();
    for (name, entry) in config.environments.iter().flatten() {
        let Some(reference) = &entry.flake else {
            continue;
        };
        if baked.contains(name) {
            continue;
        }
        let target = match own_flake {
            Some(f) => Target::Expression(flakes::flake_entry_expression(
                f,
                name,
                reference,
                entry.interpreter.as_ref().map(|i| i.0.as_slice()),
            )),
            // Without this package's flake only a ready artifact can be built.
            None => Target::Reference(reference.clone()),
        };
        builds.push(Build {
            label: format!("environments.{name} ({reference})"),
            name: Some(name.clone()),
            target,
        });
    }
    if config.project.use_flake && !baked.iter().any(|n| n == PROJECT_ENV) {
        match (own_flake, project) {
            (Some(f), Some(p)) if p.join("flake.nix").is_file() => builds.push(Build {
                label: format!("the project's devShell ({})", p.display()),
                name: Some(PROJECT_ENV.to_string()),
                target: Target::Expression(flakes::project_expression(f, p)),
            }),
            (_, Some(p)) if !p.join("flake.nix").is_file() => problems.push(format!("[project] use_flake: {} has no flake.nix", p.display())),
            (_, None) => problems.push("[project] use_flake: no project is mounted".to_string()),
            _ => problems.push("[project] use_flake needs the Nix package of nix-sandbox-mcp (nix run …#nix-sandbox-mcp), which knows how to build a devShell environment".to_string()),
        }
    }
    (builds, problems)
}

/// Loads every environment. `prober`, when given, checks host environments
/// inside the jail (dropping broken ones) and learns their versions.
pub async fn load(config: &Config, sources: &Sources, prober: Option<&dyn Prober>) -> Registry {
    let mut reg = Registry::default();
    for p in &sources.problems {
        reg.warn(p.clone());
    }
    let mut candidates: Vec<Environment> = Vec::new();

    // Artifacts: baked-in presets, then NIX_SANDBOX_DIR, then NIX_SANDBOX_ENVS;
    // a later one with the same name replaces an earlier one.
    let mut artifacts: BTreeMap<String, Environment> = BTreeMap::new();
    for dir in &sources.builtin {
        load_artifact(&mut reg, &mut artifacts, dir, config);
    }
    for dir in &sources.artifact_dirs {
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                paths.sort();
                for p in paths
                    .into_iter()
                    .filter(|p| p.join(artifact::MANIFEST).is_file())
                {
                    load_artifact(&mut reg, &mut artifacts, &p, config);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => reg.warn(format!(
                "cannot read sandbox directory {}: {e}",
                dir.display()
            )),
        }
    }
    for built in &sources.built {
        match &built.result {
            Ok(path) => match artifact::load(path, config.defaults) {
                Ok(mut env) => {
                    if let Some(name) = &built.build.name {
                        env.name = name.clone();
                    }
                    artifacts.insert(env.name.clone(), env);
                }
                Err(e) => reg.warn(format!("{} built {}, which is not a sandbox artifact ({e}); build it with lib.mkSandbox", built.build.label, path.display())),
            },
            Err(e) => reg.warn(format!("environment from {} skipped: {e}", built.build.label)),
        }
    }

    match &config.environments {
        Some(entries) => {
            for (name, entry) in entries {
                match from_entry(name, entry, config, &artifacts) {
                    Ok(Some(env)) => candidates.push(env),
                    Ok(None) => {}
                    Err(msg) => reg.warn(format!("environment {name} skipped: {msg}")),
                }
            }
            // Artifacts from NIX_SANDBOX_DIR / NIX_SANDBOX_ENVS are offered too,
            // unless the config already defines that name; and the project's
            // environment when the config asks for it.
            for (name, env) in artifacts {
                let wanted =
                    !is_builtin(&env, sources) || (name == PROJECT_ENV && config.project.use_flake);
                if !entries.contains_key(&name) && wanted {
                    candidates.push(env);
                }
            }
        }
        None => {
            // No [environments]: the bundled presets (baked-in artifacts when
            // this is the Nix build, host interpreters otherwise) plus any
            // other artifacts.
            for preset in PRESET_NAMES {
                if artifacts.contains_key(*preset) {
                    continue;
                }
                match host::resolve(preset, config) {
                    Ok(env) => candidates.push(env),
                    Err(msg) => reg.warn(format!("environment {preset} unavailable: {msg}")),
                }
            }
            candidates.extend(artifacts.into_values());
            reg.aliases.insert("shell".into(), "bash".into());
        }
    }

    // Host environments are checked inside the jail (and learn their versions);
    // all checks run in parallel.
    let checks = candidates.into_iter().map(|env| async move {
        match prober.zip(host::probe_code(&env)) {
            Some((prober, code)) => match prober.probe(&env, code).await {
                Ok(out) => Ok(host::describe_from_probe(env, &out)),
                Err(why) => Err((env.name.clone(), why)),
            },
            None => Ok(env),
        }
    });
    for r in futures::future::join_all(checks).await {
        match r {
            Ok(env) => reg.insert(env),
            Err((name, why)) => reg.warn(format!(
                "environment {name} does not work in the sandbox and was removed: {why}"
            )),
        }
    }
    if reg.get("shell").is_none() && reg.envs.contains_key("bash") {
        reg.aliases.insert("shell".into(), "bash".into());
    }
    reg.aliases
        .retain(|alias, target| !reg.envs.contains_key(alias) && reg.envs.contains_key(target));
    reg
}

fn is_builtin(env: &Environment, sources: &Sources) -> bool {
    matches!(&env.source, Source::Artifact { path } if sources.builtin.contains(path))
}

fn load_artifact(
    reg: &mut Registry,
    into: &mut BTreeMap<String, Environment>,
    dir: &Path,
    config: &Config,
) {
    match artifact::load(dir, config.defaults) {
        Ok(env) => {
            into.insert(env.name.clone(), env);
        }
        Err(e) => reg.warn(format!("sandbox artifact {} skipped: {e}", dir.display())),
    }
}

/// Builds the environment a config entry describes.
fn from_entry(
    name: &str,
    entry: &EnvironmentSettings,
    config: &Config,
    artifacts: &BTreeMap<String, Environment>,
) -> Result<Option<Environment>, String> {
    crate::seccomp::validate_allow(&entry.seccomp_allow).map_err(|e| e.to_string())?;
    let mut env = if let Some(preset) = &entry.preset {
        let canonical = preset_for(preset).ok_or_else(|| {
            format!(
                "unknown preset {preset:?} (known: {})",
                PRESET_NAMES.join(", ")
            )
        })?;
        match artifacts.get(canonical) {
            Some(a) => a.clone(),
            None => host::resolve(canonical, config)?,
        }
    } else if let Some(interp) = &entry.interpreter
        && entry.flake.is_none()
    {
        host::custom(name, &interp.0, entry, config)?
    } else if let Some(reference) = &entry.flake {
        // Built by the Nix side into an artifact named after the entry.
        match artifacts.get(name) {
            Some(a) => a.clone(),
            None => {
                return Err(format!(
                    "flake {reference} has not been built into a sandbox artifact; use the Nix package (mkServer) or list it in NIX_SANDBOX_ENVS"
                ));
            }
        }
    } else {
        return Ok(None);
    };
    env.name = name.to_string();
    apply_entry(&mut env, entry);
    Ok(Some(env))
}

/// Applies what a config entry says on top of a resolved environment.
fn apply_entry(env: &mut Environment, entry: &EnvironmentSettings) {
    if let Some(d) = &entry.description {
        env.description = d.clone();
    }
    if let Some(f) = &entry.file_name {
        env.file_name = f.0.clone();
    }
    if entry.network {
        env.network = true;
    }
    env.seccomp_allow = entry.seccomp_allow.clone();
    // Layers: built-in, `[defaults]`, artifact manifest (all in `settings`), entry.
    env.settings = env.settings.overlay(entry.limits());
    env.limits = Limits::resolve(env.settings);
}

/// `PATH` directories searched in host mode, in order.
pub const HOST_PATH: &[&str] = &[
    "/usr/local/bin",
    "/usr/bin",
    "/bin",
    "/usr/local/sbin",
    "/usr/sbin",
    "/sbin",
];

/// A plain host-mode environment skeleton.
pub(crate) fn host_environment(
    name: &str,
    program: PathBuf,
    interpreter: Vec<String>,
    file_name: &str,
    kind: Option<InterpreterKind>,
    extra: Vec<PathBuf>,
    settings: LimitSettings,
) -> Environment {
    let mut path: Vec<String> = extra
        .iter()
        .filter_map(|p| {
            program
                .parent()
                .filter(|d| d.starts_with(p))
                .map(|d| d.display().to_string())
        })
        .collect();
    path.extend(HOST_PATH.iter().map(|s| s.to_string()));
    path.dedup();
    Environment {
        name: name.to_string(),
        description: name.to_string(),
        source: Source::Host { program },
        interpreter,
        file_name: file_name.to_string(),
        root: RootFs::Host { extra },
        path,
        vars: BTreeMap::new(),
        limits: Limits::resolve(settings),
        settings,
        network: false,
        seccomp_allow: Vec::new(),
        tools: Vec::new(),
        kind,
    }
}
