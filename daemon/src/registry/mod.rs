//! The environments this server offers, by name, loaded at start-up from its
//! sources (see `source.rs` and [`sources`]) and the configuration, and
//! loaded again as each Nix build a source started ends (see [`Builds`]).
//! A problem with one environment drops that environment with a warning; it
//! never stops the server.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, EnvironmentSettings};
use crate::environment::Environment;
use crate::limits::Limits;

pub mod artifact;
mod artifact_dirs;
mod build_cache;
mod builtin;
mod config_flakes;
mod devshell;
mod flake_refs;
pub mod flakes;
mod host;
mod source;

pub use host::{PRESET_NAMES, host_environment, preset_for};
pub use source::{Building, Context, Loaded, Offer, Pending, Role, Source};

/// The name of the environment `[project] use_flake` creates.
pub const PROJECT_ENV: &str = "project";

/// Every source of environments, in order of precedence: a later offer of a
/// name replaces an earlier one.
pub fn sources(knobs: &crate::config::Knobs) -> Vec<Box<dyn Source>> {
    vec![
        Box::new(builtin::Builtin::new(knobs)),
        Box::new(artifact_dirs::ArtifactDirs::new(knobs)),
        Box::new(flake_refs::FlakeRefs::new(knobs)),
        Box::new(config_flakes::ConfigFlakes::new(knobs)),
        Box::new(devshell::DevShell::new(knobs)),
        Box::new(host::HostPresets),
    ]
}

#[derive(Debug, Default)]
pub struct Registry {
    envs: BTreeMap<String, Arc<Environment>>,
    /// Other names agents may use (`shell` for `bash`).
    aliases: BTreeMap<String, String>,
    /// Environments dropped at start-up, and why.
    pub warnings: Vec<String>,
    /// Each source's name and what it said about itself (for `doctor`, `envs`).
    pub sources: Vec<(&'static str, String)>,
    /// Builds still running: their environments come later.
    pub building: Vec<Building>,
    /// Builds that failed, and why.
    pub failed: Vec<(Building, String)>,
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

    /// No environment now, and none being built.
    pub fn offers_nothing(&self) -> bool {
        self.envs.is_empty() && self.building.is_empty()
    }

    /// Why the build that was to give `name` failed, if one did.
    pub fn build_failure(&self, name: &str) -> Option<&str> {
        self.failed
            .iter()
            .find(|(b, _)| b.name.as_deref() == Some(name))
            .map(|(_, why)| why.as_str())
    }

    /// Whether `name` is an environment a build still running will give.
    pub fn is_building(&self, name: &str) -> bool {
        self.building
            .iter()
            .any(|b| b.name.as_deref() == Some(name))
    }

    /// Logs the warnings that `earlier` (the registry this one replaces, if
    /// any) did not have.
    pub fn log_new_warnings(&self, earlier: Option<&Registry>) {
        for w in &self.warnings {
            if !earlier.is_some_and(|e| e.warnings.contains(w)) {
                tracing::warn!("{w}");
            }
        }
    }

    fn warn(&mut self, msg: String) {
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

/// Everything the sources offered: the environments ready, and the builds
/// still running (`building`), whose results join `offers` or `failed` as
/// they end (see [`Gathered::finished`]).
#[derive(Debug, Default, Clone)]
pub struct Gathered {
    pub offers: Vec<Offer>,
    pub warnings: Vec<String>,
    /// Each source's name and what it said about itself, in order.
    pub sources: Vec<(&'static str, String)>,
    pub building: Vec<Building>,
    /// Builds that failed, and why.
    pub failed: Vec<(Building, String)>,
}

impl Gathered {
    /// Records the end of the build `about`.
    pub fn finished(&mut self, about: &Building, result: Result<Offer, String>) {
        self.building.retain(|b| b != about);
        match result {
            Ok(offer) => self.offers.push(offer),
            Err(e) => self.failed.push((about.clone(), e)),
        }
    }
}

/// The builds the sources started, not yet awaited.
#[derive(Default)]
pub struct Builds(Vec<(&'static str, Pending)>);

impl Builds {
    /// Runs them all at once (each within its own time limit), yielding each
    /// one's end as it comes.
    pub fn run(self) -> impl futures::Stream<Item = (Building, Result<Offer, String>)> {
        if !self.0.is_empty() {
            tracing::info!("building {} environment(s) with Nix", self.0.len());
        }
        self.0
            .into_iter()
            .map(|(from, p)| async move {
                let result = p.build.await.map(|offer| Offer { from, ..offer });
                (p.about, result)
            })
            .collect::<futures::stream::FuturesUnordered<_>>()
    }
}

/// Asks every source in turn; the builds they start are handed back, not
/// awaited.
pub fn gather_now(
    config: &Config,
    project: Option<&Path>,
    sources: &[Box<dyn Source>],
) -> (Gathered, Builds) {
    let mut gathered = Gathered::default();
    let mut builds = Builds::default();
    for source in sources {
        let ctx = Context {
            config,
            project,
            earlier: &gathered.offers,
        };
        let about = source.describe(&ctx);
        let loaded = source.load(&ctx);
        let from = source.name();
        gathered.sources.push((from, about));
        gathered
            .offers
            .extend(loaded.offers.into_iter().map(|o| Offer { from, ..o }));
        gathered.warnings.extend(loaded.warnings);
        for mut p in loaded.pending {
            match p.cached.take() {
                Some(offer) => gathered.offers.push(Offer { from, ..offer }),
                None => {
                    gathered.building.push(p.about.clone());
                    builds.0.push((from, p));
                }
            }
        }
    }
    (gathered, builds)
}

/// Asks every source in turn, then waits for every build they started.
pub async fn gather(
    config: &Config,
    project: Option<&Path>,
    sources: &[Box<dyn Source>],
) -> Gathered {
    let (gathered, builds) = gather_now(config, project, sources);
    finish(gathered, builds).await
}

/// What [`gather_now`] gathered, once `builds` have all ended.
pub async fn finish(mut gathered: Gathered, builds: Builds) -> Gathered {
    use futures::StreamExt;
    let mut ended = std::pin::pin!(builds.run());
    while let Some((about, result)) = ended.next().await {
        gathered.finished(&about, result);
    }
    gathered
}

/// Builds the registry: the configured environments (or, without an
/// `[environments]` table, every preset and extra offer), each checked in
/// the jail by `prober` when given.
pub async fn load(config: &Config, gathered: Gathered, prober: Option<&dyn Prober>) -> Registry {
    let failures = gathered
        .failed
        .iter()
        .map(|(about, why)| format!("environment from {} skipped: {why}", about.label));
    let warnings = gathered.warnings.into_iter().chain(failures).collect();
    let mut reg = Registry {
        sources: gathered.sources,
        building: gathered.building,
        warnings,
        failed: gathered.failed,
        ..Registry::default()
    };
    // The latest offer of each name.
    let mut latest: BTreeMap<&str, &Offer> = BTreeMap::new();
    for o in &gathered.offers {
        latest.insert(o.env.name.as_str(), o);
    }
    let mut candidates: Vec<Environment> = Vec::new();
    match &config.environments {
        Some(entries) => {
            let offered = |n: &str| latest.get(n).map(|o| &o.env);
            for (name, entry) in entries {
                if entry.flake.is_some() && reg.is_building(name) {
                    continue;
                }
                match from_entry(name, entry, config, offered) {
                    Ok(env) => candidates.push(env),
                    Err(msg) => reg.warn(format!("environment {name} skipped: {msg}")),
                }
            }
            candidates.extend(
                latest
                    .iter()
                    .filter(|(name, o)| o.role == Role::Extra && !entries.contains_key(**name))
                    .map(|(_, o)| o.env.clone()),
            );
        }
        None => candidates.extend(
            latest
                .values()
                .filter(|o| o.role != Role::Entry)
                .map(|o| o.env.clone()),
        ),
    }

    // Every environment of a known language is started once in the jail
    // (host ones also learn their versions); all checks run in parallel.
    let checks = candidates.into_iter().map(|env| async move {
        let Some(prober) = prober else {
            return Ok(env);
        };
        let refused = |why: String| (format!("{} ({})", env.name, env.origin), why);
        if let Some(code) = host::probe_code(&env) {
            return match prober.probe(&env, code).await {
                Ok(out) => Ok(host::describe_from_probe(env, &out)),
                Err(why) => Err(refused(why)),
            };
        }
        match start_check(&env) {
            Some(code) => match prober.probe(&env, code).await {
                Ok(_) => Ok(env),
                Err(why) => Err(refused(why)),
            },
            None => Ok(env),
        }
    });
    for r in futures::future::join_all(checks).await {
        match r {
            Ok(env) => {
                reg.envs.insert(env.name.clone(), Arc::new(env));
            }
            Err((named, why)) => reg.warn(format!(
                "environment {named} does not work in the sandbox and was removed: {why}"
            )),
        }
    }
    if reg.envs.contains_key("bash") {
        reg.aliases.insert("shell".into(), "bash".into());
    }
    reg.aliases
        .retain(|alias, target| !reg.envs.contains_key(alias) && reg.envs.contains_key(target));
    reg
}

/// The smallest program of an environment's language, run once at start-up
/// so that an environment whose interpreter cannot start in the jail is not
/// offered; none for an interpreter of unknown language (what an empty
/// program does there is its own affair).
fn start_check(env: &Environment) -> Option<&'static str> {
    use crate::environment::InterpreterKind;
    Some(match env.kind? {
        InterpreterKind::Bash => ":\n",
        InterpreterKind::Python => "pass\n",
        InterpreterKind::Node => ";\n",
    })
}

/// The environment a config entry describes. `offered` finds a preset or
/// entry offer by name.
fn from_entry<'a>(
    name: &str,
    entry: &EnvironmentSettings,
    config: &Config,
    offered: impl Fn(&str) -> Option<&'a Environment>,
) -> Result<Environment, String> {
    crate::seccomp::validate_allow(&entry.seccomp_allow).map_err(|e| e.to_string())?;
    let mut env = if let Some(preset) = &entry.preset {
        let canonical = preset_for(preset).ok_or_else(|| {
            format!(
                "unknown preset {preset:?} (known: {})",
                PRESET_NAMES.join(", ")
            )
        })?;
        offered(canonical).cloned().ok_or_else(|| {
            format!("the {canonical} preset is not available (see the warning about it)")
        })?
    } else if let Some(reference) = &entry.flake {
        // Built by the Nix side into an artifact named after the entry.
        offered(name).cloned().ok_or_else(|| {
            format!(
                "flake {reference} has not been built into a sandbox artifact; use the Nix package (mkServer) or list it in NIX_SANDBOX_ENVS"
            )
        })?
    } else if let Some(interp) = &entry.interpreter {
        host::custom(name, &interp.0, entry, config)?
    } else {
        unreachable!("the config requires one of preset, flake and interpreter")
    };
    env.name = name.to_string();
    apply_entry(&mut env, entry);
    Ok(env)
}

/// Applies what a config entry says on top of a resolved environment.
fn apply_entry(env: &mut Environment, entry: &EnvironmentSettings) {
    if let Some(d) = &entry.description {
        env.description = d.clone();
    }
    if let Some(f) = &entry.file_name {
        env.file_name = f.0.clone();
    }
    if let Some(network) = &entry.network {
        env.network = network.clone();
    }
    env.seccomp_allow = entry.seccomp_allow.clone();
    env.caches = entry.caches.clone();
    if let Some(mb) = entry.cache_mb {
        env.cache_bytes = mb.0 << 20;
    }
    // Layers: built-in, `[defaults]`, artifact manifest (all in `settings`), entry.
    env.settings = env.settings.overlay(entry.limits());
    env.limits = Limits::resolve(env.settings);
}
