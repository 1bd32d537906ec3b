//! Host mode: presets and custom interpreters resolved to the host's own
//! programs, for machines without Nix, as the user's shell would find them:
//! the first usable one on PATH, through symlinks, version managers' shims
//! (pyenv, asdf, mise, volta: the manager is asked which program it runs)
//! and virtualenvs. The jail binds the host's system directories read-only;
//! an interpreter installed elsewhere (pyenv, nvm, /opt) gets its install
//! prefix bound read-only too, and a virtualenv its own directory, when
//! [`check_bindable`] allows. An entry on PATH that cannot be served is
//! passed over with a warning that names it and the fix. As a source, it
//! fills in the presets no other source offered.

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

/// Directories that are bound whole in host mode, or whose contents are.
const BOUND_PREFIXES: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64"];

fn in_system_dirs(path: &Path) -> bool {
    BOUND_PREFIXES.iter().any(|p| path.starts_with(p))
}

/// A program found for an environment.
#[derive(Debug)]
struct Found {
    /// What the sandbox runs (the path as bound there).
    program: PathBuf,
    /// Host directories to bind read-only for it, beyond the system ones.
    binds: Vec<PathBuf>,
    /// Programs earlier on PATH that cannot be served, and why.
    passed_over: Vec<PassedOver>,
}

impl Found {
    fn passed_over_warnings(&self, env: &str) -> Vec<String> {
        self.passed_over
            .iter()
            .map(|p| {
                format!(
                    "environment {env} uses {}, not {}{} which comes first on PATH: {}; fix: {}",
                    self.program.display(),
                    p.path.display(),
                    p.via
                        .as_deref()
                        .map(|v| format!(" ({v})"))
                        .unwrap_or_default(),
                    p.problem.why,
                    p.problem.fix
                )
            })
            .collect()
    }
}

/// An entry on PATH that cannot be served.
#[derive(Debug)]
struct PassedOver {
    path: PathBuf,
    /// What it stands for, when it is a shim: `pyenv runs …`.
    via: Option<String>,
    problem: Problem,
}

/// Why a program cannot be served, and what would make it servable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Problem {
    why: String,
    fix: String,
}

impl Problem {
    fn new(why: impl Into<String>, fix: impl Into<String>) -> Problem {
        Problem {
            why: why.into(),
            fix: fix.into(),
        }
    }
}

/// What decides whether a host directory may be bound.
struct Host {
    /// Home directories on this machine (the server's and every account's).
    homes: Vec<PathBuf>,
    /// True when sandboxes run as another user than the server (the server
    /// is root, sandboxes run as [`crate::platform::UNPRIVILEGED_ID`]).
    sandbox_is_other_user: bool,
}

/// Fix for a program that cannot be bound where it is installed.
const INSTALL_ELSEWHERE: &str = "install the interpreter in a directory of its own (pyenv, nvm, asdf and mise versions, a virtualenv, /opt/NAME) or in /usr, or name another one in an environment's `interpreter`";

impl Host {
    fn current() -> Host {
        let mut homes: Vec<PathBuf> = std::env::var_os("HOME")
            .map(PathBuf::from)
            .into_iter()
            .collect();
        if let Ok(passwd) = std::fs::read_to_string("/etc/passwd") {
            homes.extend(
                passwd
                    .lines()
                    .filter_map(|l| l.split(':').nth(5))
                    .filter(|h| h.starts_with('/') && *h != "/")
                    .map(PathBuf::from),
            );
        }
        // Compare real paths: /home may be a symlink.
        let mut homes: Vec<PathBuf> = homes
            .into_iter()
            .flat_map(|h| {
                let real = std::fs::canonicalize(&h).ok();
                std::iter::once(h).chain(real)
            })
            .collect();
        homes.sort();
        homes.dedup();
        Host {
            homes,
            sandbox_is_other_user: rustix::process::geteuid().is_root(),
        }
    }

    /// The first program called `name` on PATH that can be served.
    fn find(&self, name: &str) -> Result<Found, String> {
        let candidates: Vec<PathBuf> = which::which_all(name)
            .map(|it| it.collect())
            .unwrap_or_default();
        if candidates.is_empty() {
            return Err(format!(
                "{name} not found on PATH; fix: install it, or put its directory on PATH"
            ));
        }
        let mut passed_over: Vec<PassedOver> = Vec::new();
        for candidate in candidates {
            let (real, via) = match shim_manager(&candidate) {
                Some(manager) => match ask_manager(&manager, name) {
                    Ok(path) => {
                        let via = format!("{} runs {}", manager.display_name(), path.display());
                        (path, Some(via))
                    }
                    Err(why) => {
                        passed_over.push(PassedOver {
                            path: candidate,
                            via: Some(format!("a {} shim", manager.display_name())),
                            problem: Problem::new(
                                why,
                                format!("make `{} which {name}` name an installed program, or put the program's own directory first on PATH", manager.display_name()),
                            ),
                        });
                        continue;
                    }
                },
                None => (candidate.clone(), None),
            };
            match self.examine(&real) {
                Ok((program, binds)) => {
                    // A system program reached again later on PATH needs no warning
                    // about an earlier copy of itself.
                    passed_over.dedup_by(|a, b| a.path == b.path);
                    return Ok(Found {
                        program,
                        binds,
                        passed_over,
                    });
                }
                Err(problem) => passed_over.push(PassedOver {
                    path: candidate,
                    via,
                    problem,
                }),
            }
        }
        let mut message = format!("no {name} on PATH can be served:");
        for p in &passed_over {
            message += &format!(
                " {}{}: {};",
                p.path.display(),
                p.via
                    .as_deref()
                    .map(|v| format!(" ({v})"))
                    .unwrap_or_default(),
                p.problem.why
            );
        }
        let fix = passed_over
            .first()
            .map(|p| p.problem.fix.clone())
            .unwrap_or_default();
        Err(format!(
            "{} fix: {fix}",
            message.trim_end_matches(';').to_string() + ";"
        ))
    }

    /// What running `program` in the sandbox takes: the path to run there
    /// and the directories to bind.
    fn examine(&self, program: &Path) -> Result<(PathBuf, Vec<PathBuf>), Problem> {
        if let Some(venv) = virtualenv_of(program) {
            // The venv's own `bin/python` must be what runs: Python finds the
            // venv (its pyvenv.cfg, its site-packages) next to the path it was
            // started as. Its base interpreter needs whatever it needs.
            let base = std::fs::canonicalize(program).map_err(|e| {
                Problem::new(
                    format!("its interpreter cannot be resolved: {e}"),
                    "recreate the virtualenv (`python3 -m venv --clear DIR`)",
                )
            })?;
            let (_, mut binds) = self.examine(&base)?;
            self.check_bindable(&venv)?;
            binds.insert(0, venv);
            return Ok((program.to_path_buf(), binds));
        }
        let real = std::fs::canonicalize(program).map_err(|e| {
            Problem::new(
                format!("it cannot be resolved: {e}"),
                "remove the broken link, or reinstall the program",
            )
        })?;
        if in_system_dirs(&real) {
            let run = if in_system_dirs(program) {
                program
            } else {
                &real
            };
            return Ok((run.to_path_buf(), Vec::new()));
        }
        if real.starts_with("/nix/store") {
            return Ok((real, vec![PathBuf::from("/nix/store")]));
        }
        if is_script(&real) {
            return Err(Problem::new(
                format!(
                    "{} is a script, not the interpreter itself, so what it needs cannot be known",
                    real.display()
                ),
                "put the real interpreter's directory first on PATH, or name it in an environment's `interpreter`",
            ));
        }
        let Some(prefix) = install_prefix(&real) else {
            return Err(Problem::new(
                format!(
                    "{} is not in a bin directory of an install prefix, and only whole prefixes are bound",
                    real.display()
                ),
                INSTALL_ELSEWHERE,
            ));
        };
        self.check_bindable(&prefix)?;
        Ok((real, vec![prefix]))
    }

    /// Whether `dir`, an interpreter's install prefix or a virtualenv, may be
    /// bound read-only into every sandbox. It may not be `/` or near it, a
    /// home directory or one that holds a home directory, or under a
    /// directory the sandbox has its own of (`/tmp`); and its top level
    /// may hold nothing secrets-like: no hidden entry (`.ssh`, `.git`,
    /// `.env`…) but `.gitignore` and `.lock`, and no key or credentials file.
    /// So `~/.pyenv/versions/3.11.7`, `~/.nvm/versions/node/v20.11.0` and a
    /// project's `.venv` qualify; `~`, `~/.pyenv` (it holds `.git`) and a
    /// project root with `.git` or `.env` do not. And the sandbox's user must
    /// be able to read it.
    fn check_bindable(&self, dir: &Path) -> Result<(), Problem> {
        if dir.components().count() < 3 {
            return Err(Problem::new(
                format!("{} is too close to / to be bound whole", dir.display()),
                INSTALL_ELSEWHERE,
            ));
        }
        if let Some(own) = SANDBOX_OWN_DIRS.iter().find(|d| dir.starts_with(d)) {
            return Err(Problem::new(
                format!(
                    "{} is under {own}, which the sandbox replaces with its own",
                    dir.display()
                ),
                INSTALL_ELSEWHERE,
            ));
        }
        if let Some(home) = self.homes.iter().find(|h| h.starts_with(dir)) {
            let what = if home == dir {
                "is a home directory"
            } else {
                "holds the home directory "
            };
            let home = if home == dir {
                String::new()
            } else {
                home.display().to_string()
            };
            return Err(Problem::new(
                format!(
                    "{} {what}{home}, which a sandbox must never see",
                    dir.display()
                ),
                INSTALL_ELSEWHERE,
            ));
        }
        let entries = std::fs::read_dir(dir).map_err(|e| {
            Problem::new(
                format!("{} cannot be read: {e}", dir.display()),
                "make it readable by the user the server runs as",
            )
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if secrets_like(&name) {
                return Err(Problem::new(
                    format!(
                        "{} holds {name} at its top level, which a sandbox must not see",
                        dir.display()
                    ),
                    INSTALL_ELSEWHERE,
                ));
            }
        }
        if self.sandbox_is_other_user && !crate::platform::world_readable_dir(dir) {
            return Err(Problem::new(
                format!(
                    "the server runs as root, so sandboxes run as uid {}, which cannot read {} or a directory above it",
                    crate::platform::UNPRIVILEGED_ID,
                    dir.display()
                ),
                "run the server as the user whose interpreter this is (never open a home directory to others for it), or install the interpreter where every user may read it, such as /opt or /usr/local",
            ));
        }
        Ok(())
    }
}

/// Directories each sandbox mounts fresh, hiding whatever the host has there.
const SANDBOX_OWN_DIRS: &[&str] = &["/tmp", "/dev", "/proc", "/sys", "/run", "/workspace"];

/// Top-level names an interpreter's prefix does not hold but a home
/// directory or a project does.
fn secrets_like(name: &str) -> bool {
    const HARMLESS_HIDDEN: &[&str] = &[".gitignore", ".lock"];
    let lower = name.to_ascii_lowercase();
    (name.starts_with('.') && !HARMLESS_HIDDEN.contains(&name))
        || lower.starts_with("id_")
        || lower.contains("credential")
        || lower.contains("secret")
        || [".pem", ".key", ".p12", ".pfx"]
            .iter()
            .any(|x| lower.ends_with(x))
}

/// `…/venv` for `…/venv/bin/python3` when `…/venv/pyvenv.cfg` exists.
fn virtualenv_of(program: &Path) -> Option<PathBuf> {
    let bin = program.parent()?;
    let root = bin.parent()?;
    (bin.file_name()? == "bin" && root.join("pyvenv.cfg").is_file()).then(|| root.to_path_buf())
}

/// True for a file that starts with `#!`.
fn is_script(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|_| &head == b"#!")
}

/// A version manager that a shim on PATH defers to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Manager {
    /// The manager's executable, asked `which NAME`.
    tool: PathBuf,
}

impl Manager {
    fn display_name(&self) -> String {
        match self.tool.file_name().and_then(|n| n.to_str()) {
            Some("volta-shim") => "volta".to_string(),
            Some(n) => n.to_string(),
            None => self.tool.display().to_string(),
        }
    }
}

/// The version manager behind `candidate`, when it is a shim: a script of
/// the form `exec TOOL exec PROGRAM "$@"` (pyenv, rbenv, nodenv, asdf), or a
/// link to mise's or volta's own binary.
fn shim_manager(candidate: &Path) -> Option<Manager> {
    let real = std::fs::canonicalize(candidate).ok()?;
    match real.file_name()?.to_str()? {
        "mise" | "rtx" => return Some(Manager { tool: real }),
        "volta-shim" => {
            let tool = real.with_file_name("volta");
            return tool.is_file().then_some(Manager { tool });
        }
        _ => {}
    }
    if !is_script(&real) {
        return None;
    }
    let text = std::fs::read(&real).ok()?;
    let text = String::from_utf8_lossy(&text[..text.len().min(16 * 1024)]).into_owned();
    text.lines().find_map(|line| {
        let words: Vec<&str> = line
            .split_whitespace()
            .map(|w| w.trim_matches('"').trim_matches('\''))
            .collect();
        match words.as_slice() {
            ["exec", tool, "exec", ..] => {
                let tool = if tool.starts_with('/') {
                    PathBuf::from(tool)
                } else {
                    which::which(tool).ok()?
                };
                tool.is_file().then_some(Manager { tool })
            }
            _ => None,
        }
    })
}

/// Asks a version manager which program `name` runs here (in the server's
/// directory, so a project's `.python-version` or `.tool-versions` counts).
fn ask_manager(manager: &Manager, name: &str) -> Result<PathBuf, String> {
    let asked = format!("`{} which {name}`", manager.display_name());
    let mut child = std::process::Command::new(&manager.tool)
        .args(["which", name])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{asked} cannot run: {e}"))?;
    let deadline = std::time::Instant::now() + MANAGER_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{asked} did not answer within {} s",
                    MANAGER_TIMEOUT.as_secs()
                ));
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{asked}: {e}"))?;
    let answer = String::from_utf8_lossy(&out.stdout);
    let path = answer
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(PathBuf::from);
    match path {
        Some(p) if out.status.success() && p.is_absolute() && p.is_file() => Ok(p),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let why = stderr
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("no program named");
            Err(format!("{asked} failed: {why}"))
        }
    }
}

/// How long a version manager may take to say which program it runs.
const MANAGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `…/prefix` for `…/prefix/bin/program`.
fn install_prefix(program: &Path) -> Option<PathBuf> {
    let bin = program.parent()?;
    (bin.file_name()? == "bin")
        .then(|| bin.parent().map(Path::to_path_buf))
        .flatten()
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
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn preset_aliases() {
        assert_eq!(preset_for("shell"), Some("bash"));
        assert_eq!(preset_for("python3"), Some("python"));
        assert_eq!(preset_for("ruby"), None);
    }

    /// A directory outside /tmp (the sandbox's own) that others can read.
    fn scratch() -> tempfile::TempDir {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn host(homes: &[&Path], sandbox_is_other_user: bool) -> Host {
        Host {
            homes: homes.iter().map(|h| h.to_path_buf()).collect(),
            sandbox_is_other_user,
        }
    }

    fn prefix_with(root: &Path, name: &str, entries: &[&str]) -> PathBuf {
        let prefix = root.join(name);
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        for e in entries {
            std::fs::write(prefix.join(e), "").unwrap();
        }
        prefix
    }

    #[test]
    fn homes_their_ancestors_and_what_the_sandbox_owns_are_never_bound() {
        let d = scratch();
        let home = d.path().join("home/me");
        std::fs::create_dir_all(&home).unwrap();
        let h = host(&[&home], false);
        for refused in [
            Path::new("/"),
            Path::new("/opt"),
            &home,
            &d.path().join("home"),
            d.path(),
        ] {
            assert!(h.check_bindable(refused).is_err(), "{}", refused.display());
        }
        let e = h.check_bindable(&home).unwrap_err();
        assert!(e.why.contains("is a home directory"), "{e:?}");
        let t = tempfile::tempdir().unwrap();
        let in_tmp = prefix_with(t.path(), "py", &[]);
        assert!(
            h.check_bindable(&in_tmp)
                .unwrap_err()
                .why
                .contains("which the sandbox replaces")
        );
    }

    #[test]
    fn a_prefix_inside_home_is_bound_when_it_holds_nothing_secrets_like() {
        let d = scratch();
        let home = d.path().join("home");
        let h = host(&[&home], false);
        let versions = home.join(".pyenv/versions");
        let clean = prefix_with(
            &versions,
            "3.11.7",
            &["pyvenv.cfg", ".gitignore", ".lock", "LICENSE"],
        );
        assert_eq!(h.check_bindable(&clean), Ok(()));
        for secret in [
            ".env",
            ".git",
            "id_ed25519",
            "aws-credentials",
            "server.pem",
        ] {
            let p = prefix_with(&versions, &format!("with{secret}"), &[secret]);
            let e = h.check_bindable(&p).unwrap_err();
            assert!(e.why.contains(secret), "{secret}: {e:?}");
        }
    }

    #[test]
    fn a_root_server_binds_only_what_others_may_read() {
        let d = scratch();
        let private = d.path().join("private");
        let prefix = prefix_with(&private, "node", &[]);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(host(&[], false).check_bindable(&prefix), Ok(()));
        let e = host(&[], true).check_bindable(&prefix).unwrap_err();
        assert!(
            e.why.contains("uid 65534") && e.fix.contains("/opt"),
            "{e:?}"
        );
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(host(&[], true).check_bindable(&prefix), Ok(()));
    }

    #[test]
    fn a_link_to_a_system_program_runs_the_system_program() {
        // A link outside the bound directories would not exist in the sandbox.
        let d = scratch();
        let link = d.path().join("sh");
        std::os::unix::fs::symlink("/bin/sh", &link).unwrap();
        let (program, binds) = host(&[], false).examine(&link).unwrap();
        assert!(in_system_dirs(&program), "{}", program.display());
        assert!(binds.is_empty());
    }

    #[test]
    fn scripts_that_are_not_shims_are_passed_over() {
        let d = scratch();
        let bin = d.path().join("tool/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let script = bin.join("python3");
        std::fs::write(&script, "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n").unwrap();
        assert_eq!(shim_manager(&script), None);
        let e = host(&[], false).examine(&script).unwrap_err();
        assert!(e.why.contains("is a script"), "{e:?}");
    }

    #[test]
    fn shims_name_their_version_manager() {
        let d = scratch();
        let tool = d.path().join("libexec/pyenv");
        std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        let shim = d.path().join("python3");
        std::fs::write(
            &shim,
            format!("#!/usr/bin/env bash\nset -e\nprogram=\"${{0##*/}}\"\nexec \"{}\" exec \"$program\" \"$@\"\n", tool.display()),
        )
        .unwrap();
        assert_eq!(shim_manager(&shim), Some(Manager { tool: tool.clone() }));
        assert_eq!(Manager { tool }.display_name(), "pyenv");
        // mise's shims are links to mise itself.
        let mise = d.path().join("mise");
        std::fs::copy("/bin/true", &mise).unwrap();
        let node = d.path().join("node");
        std::os::unix::fs::symlink(&mise, &node).unwrap();
        assert_eq!(
            shim_manager(&node).map(|m| m.display_name()).as_deref(),
            Some("mise")
        );
        assert_eq!(shim_manager(Path::new("/bin/sh")), None);
    }

    #[test]
    fn a_virtualenv_is_known_by_its_pyvenv_cfg() {
        let d = scratch();
        let venv = prefix_with(d.path(), "venv", &["pyvenv.cfg"]);
        assert_eq!(virtualenv_of(&venv.join("bin/python3")), Some(venv));
        assert_eq!(virtualenv_of(Path::new("/usr/bin/python3")), None);
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
