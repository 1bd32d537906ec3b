//! Finding a host program as the user's shell would: the first usable one
//! on PATH, followed through links, version managers' shims and
//! virtualenvs, and what of the host must be bound for it to run (only
//! directories that hold no home and no secrets).

use std::path::{Path, PathBuf};

/// Directories that are bound whole in host mode, or whose contents are.
pub(super) const BOUND_PREFIXES: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64"];

pub(super) fn in_system_dirs(path: &Path) -> bool {
    BOUND_PREFIXES.iter().any(|p| path.starts_with(p))
}

/// A program found for an environment.
#[derive(Debug)]
pub(super) struct Found {
    /// What the sandbox runs (the path as bound there).
    pub(super) program: PathBuf,
    /// Host directories to bind read-only for it, beyond the system ones.
    pub(super) binds: Vec<PathBuf>,
    /// Programs earlier on PATH that cannot be served, and why.
    pub(super) passed_over: Vec<PassedOver>,
}

impl Found {
    pub(super) fn passed_over_warnings(&self, env: &str) -> Vec<String> {
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
pub(super) struct PassedOver {
    pub(super) path: PathBuf,
    /// What it stands for, when it is a shim: `pyenv runs …`.
    pub(super) via: Option<String>,
    pub(super) problem: Problem,
}

/// Why a program cannot be served, and what would make it servable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    pub(super) why: String,
    pub(super) fix: String,
}

impl Problem {
    pub(super) fn new(why: impl Into<String>, fix: impl Into<String>) -> Problem {
        Problem {
            why: why.into(),
            fix: fix.into(),
        }
    }
}

/// What decides whether a host directory may be bound.
pub(super) struct Host {
    /// Home directories on this machine (the server's and every account's).
    pub(super) homes: Vec<PathBuf>,
    /// True when sandboxes run as another user than the server (the server
    /// is root, sandboxes run as [`crate::platform::UNPRIVILEGED_ID`]).
    pub(super) sandbox_is_other_user: bool,
}

/// Fix for a program that cannot be bound where it is installed.
pub(super) const INSTALL_ELSEWHERE: &str = "install the interpreter in a directory of its own (pyenv, nvm, asdf and mise versions, a virtualenv, /opt/NAME) or in /usr, or name another one in an environment's `interpreter`";

impl Host {
    pub(super) fn current() -> Host {
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
    pub(super) fn find(&self, name: &str) -> Result<Found, String> {
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
    pub(super) fn examine(&self, program: &Path) -> Result<(PathBuf, Vec<PathBuf>), Problem> {
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
        if real.starts_with(NIX_STORE) {
            // Its closure, never the whole store (which holds every user's
            // builds, and secrets some put there).
            let closure = store_closure(&real).map_err(|why| {
                Problem::new(
                    format!("{} is in the Nix store, but its closure cannot be known: {why}", real.display()),
                    "put nix-store on the server's PATH, or serve the interpreter as a Nix environment (docs/nix.md)",
                )
            })?;
            return Ok((real, closure));
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
    pub(super) fn check_bindable(&self, dir: &Path) -> Result<(), Problem> {
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
pub(super) const SANDBOX_OWN_DIRS: &[&str] =
    &["/tmp", "/dev", "/proc", "/sys", "/run", "/workspace"];

/// Top-level names an interpreter's prefix does not hold but a home
/// directory or a project does.
pub(super) fn secrets_like(name: &str) -> bool {
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
pub(super) fn virtualenv_of(program: &Path) -> Option<PathBuf> {
    let bin = program.parent()?;
    let root = bin.parent()?;
    (bin.file_name()? == "bin" && root.join("pyvenv.cfg").is_file()).then(|| root.to_path_buf())
}

/// True for a file that starts with `#!`.
pub(super) fn is_script(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|_| &head == b"#!")
}

/// A version manager that a shim on PATH defers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Manager {
    /// The manager's executable, asked `which NAME`.
    pub(super) tool: PathBuf,
}

impl Manager {
    pub(super) fn display_name(&self) -> String {
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
pub(super) fn shim_manager(candidate: &Path) -> Option<Manager> {
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
pub(super) fn ask_manager(manager: &Manager, name: &str) -> Result<PathBuf, String> {
    let asked = format!("`{} which {name}`", manager.display_name());
    let out = output_within(
        std::process::Command::new(&manager.tool).args(["which", name]),
        &asked,
    )?;
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

const NIX_STORE: &str = "/nix/store";

/// The store paths `program` (in the Nix store) needs, itself included, as
/// `nix-store --query --requisites` lists them.
pub(super) fn store_closure(program: &Path) -> Result<Vec<PathBuf>, String> {
    let top: PathBuf = program.components().take(4).collect();
    let asked = format!("`nix-store --query --requisites {}`", top.display());
    let out = output_within(
        std::process::Command::new("nix-store")
            .args(["--query", "--requisites"])
            .arg(&top),
        &asked,
    )?;
    let paths: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.starts_with(NIX_STORE) && p.components().count() == 4)
        .collect();
    if !out.status.success() || !paths.contains(&top) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{asked} failed: {}", stderr.trim()));
    }
    Ok(paths)
}

/// Runs `command` to its end within [`MANAGER_TIMEOUT`], its output read as
/// it comes (a long answer never fills the pipe); `what` names it in errors.
fn output_within(
    command: &mut std::process::Command,
    what: &str,
) -> Result<std::process::Output, String> {
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what} cannot run: {e}"))?;
    let pid = rustix::process::Pid::from_raw(child.id() as i32);
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match wait.recv_timeout(MANAGER_TIMEOUT) {
        Ok(out) => out.map_err(|e| format!("{what}: {e}")),
        Err(_) => {
            if let Some(pid) = pid {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            Err(format!(
                "{what} did not answer within {} s",
                MANAGER_TIMEOUT.as_secs()
            ))
        }
    }
}

/// How long a version manager may take to say which program it runs.
pub(super) const MANAGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `…/prefix` for `…/prefix/bin/program`.
pub(super) fn install_prefix(program: &Path) -> Option<PathBuf> {
    let bin = program.parent()?;
    (bin.file_name()? == "bin")
        .then(|| bin.parent().map(Path::to_path_buf))
        .flatten()
}
