//! Host mode: presets and custom interpreters resolved to the host's own
//! programs, for machines without Nix, as the user's shell would find them:
//! the first usable one on PATH, through symlinks, version managers' shims
//! (pyenv, asdf, mise, volta: the manager is asked which program it runs)
//! and virtualenvs. The jail binds the host's system directories read-only;
//! an interpreter installed elsewhere (pyenv, nvm, /opt) gets its install
//! prefix bound read-only too, and a virtualenv its own directory, when
//! `find.rs` allows. An entry on PATH that cannot be served is
//! passed over with a warning that names it and the fix. As a source, it
//! fills in the presets no other source offered. Finding a program is in
//! `find.rs`, the start-up probe of what it offers in `probe.rs`.

mod find;
mod probe;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::source::{Context, Loaded, Offer, Role, Source};
use crate::config::{Config, EnvironmentSettings, LimitSettings};
use crate::environment::{Environment, InterpreterKind, Origin, RootFs};
use crate::limits::Limits;
use find::Host;
pub use probe::{describe_from_probe, probe_code};

/// The source: the host's interpreters for the presets the configuration
/// needs and no earlier source offered.
pub(super) struct HostPresets;

impl HostPresets {
    fn wanted(ctx: &Context) -> Vec<&'static str> {
        let needed: Vec<&'static str> = match &ctx.config.environments {
            None => PRESET_NAMES.to_vec(),
            Some(entries) => entries
                .values()
                .filter_map(|e| preset_for(e.preset.as_deref()?))
                .collect(),
        };
        let mut wanted: Vec<&'static str> = needed
            .into_iter()
            .filter(|p| !ctx.earlier.iter().any(|o| o.env.name == *p))
            .collect();
        wanted.sort();
        wanted.dedup();
        wanted
    }
}

impl Source for HostPresets {
    fn name(&self) -> &'static str {
        "host"
    }

    fn describe(&self, ctx: &Context) -> String {
        let wanted = HostPresets::wanted(ctx);
        if wanted.is_empty() {
            "no host interpreter needed".to_string()
        } else {
            format!("host interpreters for {}", wanted.join(", "))
        }
    }

    fn load(&self, ctx: &Context) -> Loaded {
        let mut loaded = Loaded::default();
        for preset in HostPresets::wanted(ctx) {
            match resolve(preset, ctx.config) {
                Ok((env, passed_over)) => {
                    loaded.warnings.extend(passed_over);
                    loaded.offers.push(Offer::new(env, Role::Preset));
                }
                Err(msg) => loaded
                    .warnings
                    .push(format!("environment {preset} unavailable: {msg}")),
            }
        }
        loaded
    }
}

pub use crate::config::PRESET_NAMES;

/// Canonical preset name for a name an operator may write.
pub fn preset_for(name: &str) -> Option<&'static str> {
    crate::config::PRESET_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map(|(_, preset)| *preset)
}

struct Preset {
    kind: InterpreterKind,
    programs: &'static [&'static str],
    file_name: &'static str,
    vars: &'static [(&'static str, &'static str)],
}

fn preset(name: &str) -> Option<Preset> {
    Some(match name {
        "bash" => Preset {
            kind: InterpreterKind::Bash,
            programs: &["bash"],
            file_name: ".main.sh",
            vars: &[],
        },
        "python" => Preset {
            kind: InterpreterKind::Python,
            programs: &["python3", "python"],
            file_name: ".main.py",
            vars: &[("PYTHONUNBUFFERED", "1"), ("PYTHONDONTWRITEBYTECODE", "1")],
        },
        "node" => Preset {
            kind: InterpreterKind::Node,
            programs: &["node", "nodejs"],
            file_name: ".main.js",
            vars: &[],
        },
        _ => return None,
    })
}

/// Resolves a preset to the host's interpreter; with it, a warning for each
/// program on PATH before it that could not be served.
pub fn resolve(name: &str, config: &Config) -> Result<(Environment, Vec<String>), String> {
    let p = preset(name).ok_or_else(|| format!("unknown preset {name:?}"))?;
    let host = Host::current();
    let mut problems = Vec::new();
    let found = p.programs.iter().find_map(|prog| match host.find(prog) {
        Ok(found) => Some(found),
        Err(e) => {
            problems.push(e);
            None
        }
    });
    let Some(found) = found else {
        return Err(problems.join("; and "));
    };
    let warnings = found.passed_over_warnings(name);
    let argv = vec![found.program.display().to_string(), "{file}".to_string()];
    let mut env = host_environment(
        name,
        found.program,
        argv,
        p.file_name,
        Some(p.kind),
        found.binds,
        config.defaults,
    );
    env.vars = p
        .vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok((env, warnings))
}

/// An environment for `interpreter = "…"` in the config.
pub fn custom(
    name: &str,
    argv: &[String],
    entry: &EnvironmentSettings,
    config: &Config,
) -> Result<Environment, String> {
    let found = Host::current().find(&argv[0])?;
    for warning in found.passed_over_warnings(name) {
        tracing::warn!("{warning}");
    }
    let (program, extra) = (found.program, found.binds);
    let mut full = argv.to_vec();
    full[0] = program.display().to_string();
    let kind = program.file_name().and_then(|n| n.to_str()).and_then(|n| {
        InterpreterKind::parse(n.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.'))
    });
    let file_name = entry
        .file_name
        .as_ref()
        .map(|f| f.0.as_str())
        .unwrap_or(".main");
    let mut env = host_environment(
        name,
        program.clone(),
        full,
        file_name,
        kind,
        extra,
        config.defaults,
    );
    env.description = format!(
        "{} (host {})",
        argv.join(" ").replace(" {file}", ""),
        program.display()
    );
    Ok(env)
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
pub fn host_environment(
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
        origin: Origin::Host { program },
        interpreter,
        file_name: file_name.to_string(),
        root: RootFs::Host { extra },
        path,
        vars: BTreeMap::new(),
        limits: Limits::resolve(settings),
        settings,
        network: Default::default(),
        seccomp_allow: Vec::new(),
        caches: Vec::new(),
        cache_bytes: crate::caches::DEFAULT_BYTES,
        tools: Vec::new(),
        kind,
    }
}
