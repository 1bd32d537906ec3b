//! Host mode: presets and custom interpreters resolved to the host's own
//! programs with `which`, for machines without Nix. The jail binds the host's
//! system directories read-only; an interpreter installed elsewhere (nvm,
//! /opt) gets its own install prefix bound too. As a source, it fills in the
//! presets no other source offered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::source::{Context, Loaded, Offer, Role, Source};
use crate::config::{Config, EnvironmentSettings, LimitSettings};
use crate::environment::{Environment, InterpreterKind, Limits, Origin, RootFs};

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
                Ok(env) => loaded.offers.push(Offer::new(env, Role::Preset)),
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

/// Resolves a preset to the host's interpreter.
pub fn resolve(name: &str, config: &Config) -> Result<Environment, String> {
    let p = preset(name).ok_or_else(|| format!("unknown preset {name:?}"))?;
    let (program, extra) = p
        .programs
        .iter()
        .find_map(|prog| find_program(prog).ok())
        .ok_or_else(|| {
            format!(
                "{} not found on this host (looked for {} on PATH)",
                name,
                p.programs.join(", ")
            )
        })?;
    let argv = vec![program.display().to_string(), "{file}".to_string()];
    let mut env = host_environment(
        name,
        program,
        argv,
        p.file_name,
        Some(p.kind),
        extra,
        config.defaults,
    );
    env.vars = p
        .vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(env)
}

/// An environment for `interpreter = "…"` in the config.
pub fn custom(
    name: &str,
    argv: &[String],
    entry: &EnvironmentSettings,
    config: &Config,
) -> Result<Environment, String> {
    let (program, extra) = find_program(&argv[0])?;
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

/// Directories that are bound whole in host mode, or whose contents are.
const BOUND_PREFIXES: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64"];

/// Finds `name` on PATH, preferring copies inside the bound system
/// directories. Returns the program and any extra directory to bind.
fn find_program(name: &str) -> Result<(PathBuf, Vec<PathBuf>), String> {
    let candidates: Vec<PathBuf> = match which::which_all(name) {
        Ok(it) => it.collect(),
        Err(_) => Vec::new(),
    };
    if candidates.is_empty() {
        return Err(format!("{name} not found on PATH"));
    }
    let mut rejected = Vec::new();
    // First pass: programs that live in the system directories.
    for c in &candidates {
        let real = std::fs::canonicalize(c).unwrap_or_else(|_| c.clone());
        if BOUND_PREFIXES.iter().any(|p| real.starts_with(p)) {
            return Ok((c.clone(), Vec::new()));
        }
        if real.starts_with("/nix/store") {
            return Ok((c.clone(), vec![PathBuf::from("/nix/store")]));
        }
    }
    // Second pass: a self-contained install (…/prefix/bin/prog).
    for c in &candidates {
        let real = std::fs::canonicalize(c).unwrap_or_else(|_| c.clone());
        match install_prefix(&real) {
            Some(prefix) if is_safe_prefix(&prefix) => return Ok((real, vec![prefix])),
            _ => rejected.push(real.display().to_string()),
        }
    }
    Err(format!(
        "{name} found only outside the system directories ({}), in a place that cannot be mounted without exposing a home directory",
        rejected.join(", ")
    ))
}

/// `…/prefix` for `…/prefix/bin/program`.
fn install_prefix(program: &Path) -> Option<PathBuf> {
    let bin = program.parent()?;
    (bin.file_name()? == "bin")
        .then(|| bin.parent().map(Path::to_path_buf))
        .flatten()
}

/// A prefix is safe to bind when it is not a home directory or an ancestor of one.
fn is_safe_prefix(prefix: &Path) -> bool {
    let depth = prefix.components().count();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let is_home_or_above = home.as_ref().is_some_and(|h| h.starts_with(prefix));
    let shims =
        prefix.ends_with(".pyenv") || prefix.ends_with(".rbenv") || prefix.ends_with(".asdf");
    depth >= 3 && !is_home_or_above && !shims
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
        network: false,
        seccomp_allow: Vec::new(),
        tools: Vec::new(),
        kind,
    }
}

/// Start-up probe for host presets: prints the version (first line) and the
/// notable tools or packages present (second line).
pub fn probe_code(env: &Environment) -> Option<&'static str> {
    if !matches!(env.origin, crate::environment::Origin::Host { .. }) {
        return None;
    }
    match (env.kind, env.file_name.as_str()) {
        (Some(InterpreterKind::Bash), ".main.sh") => Some(
            "echo \"${BASH_VERSION%%(*}\"\nfor t in git make gcc cc jq rg curl sqlite3 python3 node perl awk sed grep find tar; do command -v \"$t\" >/dev/null 2>&1 && printf '%s ' \"$t\"; done; echo\n",
        ),
        (Some(InterpreterKind::Python), ".main.py") => Some(
            "import sys, importlib.util as u\nprint(sys.version.split()[0])\nprint(' '.join(m for m in ['numpy', 'pandas', 'scipy', 'requests', 'yaml', 'pytest', 'matplotlib'] if u.find_spec(m)))\n",
        ),
        (Some(InterpreterKind::Node), ".main.js") => {
            Some("console.log(process.version.replace(/^v/, ''));\nconsole.log('');\n")
        }
        _ => None,
    }
}

/// Fills in the description and tools from the probe's output.
pub fn describe_from_probe(mut env: Environment, out: &str) -> Environment {
    let mut lines = out.lines();
    let version = lines.next().unwrap_or("").trim().to_string();
    let extras: Vec<String> = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let default_description = env.description == env.name;
    match env.kind {
        Some(InterpreterKind::Bash) => {
            env.tools = std::iter::once("bash".to_string())
                .chain(extras.iter().cloned())
                .collect();
            if default_description {
                // The description stays short: the base tools, then at most six more.
                let shown: Vec<&str> = extras
                    .iter()
                    .map(String::as_str)
                    .filter(|t| {
                        !matches!(
                            *t,
                            "awk"
                                | "sed"
                                | "grep"
                                | "find"
                                | "tar"
                                | "cc"
                                | "python3"
                                | "node"
                                | "perl"
                        )
                    })
                    .take(6)
                    .collect();
                env.description = format!(
                    "Bash {version}, coreutils{}",
                    if shown.is_empty() {
                        String::new()
                    } else {
                        format!(", {}", shown.join(", "))
                    }
                );
            }
        }
        Some(InterpreterKind::Python) => {
            env.tools = vec!["python3".to_string()];
            if default_description {
                env.description = if extras.is_empty() {
                    format!("Python {version} (standard library)")
                } else {
                    format!("Python {version} with {}", extras.join(", "))
                };
            }
        }
        Some(InterpreterKind::Node) => {
            env.tools = vec!["node".to_string()];
            if default_description {
                env.description = format!("Node.js {version}");
            }
        }
        None => {}
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_aliases() {
        assert_eq!(preset_for("shell"), Some("bash"));
        assert_eq!(preset_for("python3"), Some("python"));
        assert_eq!(preset_for("ruby"), None);
    }

    #[test]
    fn prefixes_that_expose_home_are_refused() {
        assert!(!is_safe_prefix(Path::new("/home")));
        assert!(!is_safe_prefix(Path::new("/")));
        assert!(is_safe_prefix(Path::new("/opt/node/v20")));
        if let Some(home) = std::env::var_os("HOME") {
            assert!(!is_safe_prefix(Path::new(&home)));
        }
    }

    #[test]
    fn install_prefix_of_bin_program() {
        assert_eq!(
            install_prefix(Path::new("/opt/node/v20/bin/node")),
            Some(PathBuf::from("/opt/node/v20"))
        );
        assert_eq!(install_prefix(Path::new("/opt/node/node")), None);
    }

    #[test]
    fn host_programs_are_found_at_absolute_paths() {
        // Every machine this runs on has a `sh` on PATH: a system one, or a
        // Nix store one (in a Nix build), which brings the store as a bind.
        let (p, extra) = find_program("sh").unwrap();
        assert!(p.is_absolute() && p.is_file(), "{}", p.display());
        let real = std::fs::canonicalize(&p).unwrap();
        if real.starts_with("/nix/store") {
            assert_eq!(extra, [Path::new("/nix/store")]);
        } else {
            assert!(
                BOUND_PREFIXES.iter().any(|b| real.starts_with(b)),
                "{}",
                real.display()
            );
            assert!(extra.is_empty(), "{extra:?}");
        }
        let missing = find_program("no-such-program-nsm").unwrap_err();
        assert!(missing.contains("not found on PATH"), "{missing}");
    }

    #[test]
    fn description_from_probe() {
        let env = host_environment(
            "python",
            "/usr/bin/python3".into(),
            vec![],
            ".main.py",
            Some(InterpreterKind::Python),
            vec![],
            Default::default(),
        );
        let env = describe_from_probe(env, "3.11.2\nrequests pytest\n");
        assert_eq!(env.description, "Python 3.11.2 with requests, pytest");
    }
}
