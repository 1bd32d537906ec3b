//! Building environments with Nix when the server starts, for the sources
//! that need it (`NIX_SANDBOX_ENVS` references, config `flake` entries no
//! package baked in, the project's devShell): the expressions, running
//! `nix build` with a time limit, and reading the artifact it made. Every
//! build runs in parallel; a failure becomes a warning about that
//! environment only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::artifact;
use super::source::{Building, Offer, Pending, Role};
use crate::config::Config;

/// One thing to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// How the build is named in messages: the reference, or `environments.X`.
    pub label: String,
    /// The environment name the result is served under; `None` keeps the
    /// artifact's own name.
    pub name: Option<String>,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A flake output reference, built as is (`nix build REF`).
    Reference(String),
    /// A Nix expression (`nix build --impure --expr E`).
    Expression(String),
}

/// A string as a Nix string literal.
pub fn nix_string(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace("${", "\\${");
    format!("\"{escaped}\"")
}

/// What bin/run of an artifact built at start-up calls: the running daemon
/// and the bubblewrap it uses, each when it lives in the Nix store (a store
/// path can be a dependency of the artifact). The build then needs neither
/// this flake's daemon nor its nixpkgs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runtime {
    /// The store path whose `bin/nix-sandbox-mcp` is running; `None` makes
    /// bin/run call the `nix-sandbox-mcp` on `PATH`.
    pub daemon: Option<PathBuf>,
    /// The store path whose `bin/bwrap` the daemon uses; `None` leaves
    /// bin/run's `PATH` alone.
    pub bubblewrap: Option<PathBuf>,
}

impl Runtime {
    /// This process and the `bwrap` on its `PATH`.
    pub fn current() -> Self {
        let store = super::artifact::store_dir();
        Runtime {
            daemon: std::env::current_exe()
                .ok()
                .and_then(|exe| package_of(&exe, &store, "bin/nix-sandbox-mcp")),
            bubblewrap: which::which("bwrap")
                .ok()
                .and_then(|bwrap| package_of(&bwrap, &store, "bin/bwrap")),
        }
    }

    /// The `daemon` and `bubblewrap` arguments of the library's functions.
    fn arguments(&self) -> String {
        let argument = |p: &Option<PathBuf>| match p {
            Some(p) => format!("builtins.storePath {}", nix_string(&p.to_string_lossy())),
            None => "null".to_string(),
        };
        format!(
            "daemon = {}; bubblewrap = {};",
            argument(&self.daemon),
            argument(&self.bubblewrap)
        )
    }
}

/// The store path that holds `program` (links followed) at `relative`, e.g.
/// `/nix/store/…-bubblewrap-0.11.0` for `bin/bwrap`.
fn package_of(program: &Path, store: &Path, relative: &str) -> Option<PathBuf> {
    let real = std::fs::canonicalize(program).ok()?;
    let mut parts = real.strip_prefix(store).ok()?.components();
    let top = parts.next()?;
    (parts.as_path() == Path::new(relative)).then(|| store.join(top))
}

/// How a start-up build refers to the flake in a local directory. One in the
/// Nix store is taken as it is (`path:`, nothing is copied). Any other must
/// be in a git repository and is taken as `git+file:`, as `nix develop` does:
/// only the files git tracks reach the store, uncommitted changes to them
/// included. `path:` would copy the whole directory, untracked and
/// git-ignored files such as `.env` included, into the world-readable store.
pub fn flake_reference(dir: &Path, store: &Path) -> Result<String, String> {
    if dir.starts_with(store) {
        return Ok(format!("path:{}", dir.display()));
    }
    let top = dir
        .ancestors()
        .find(|d| d.join(".git").exists())
        .ok_or_else(|| {
            format!(
                "{} is not in a git repository, and Nix would copy all of it, untracked and git-ignored files such as .env included, into the world-readable Nix store; make it one (git init, then git add flake.nix, flake.lock and the files the flake uses)",
                dir.display()
            )
        })?;
    let mut reference = format!("git+file://{}", url_encoded(top));
    let sub = dir.strip_prefix(top).unwrap_or(Path::new(""));
    if !sub.as_os_str().is_empty() {
        reference.push_str("?dir=");
        reference.push_str(&url_encoded(sub));
    }
    Ok(reference)
}

/// A path as URL text: bytes other than letters, digits, `/`, `-`, `.`, `_`
/// and `~` percent-encoded.
fn url_encoded(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether git tracks `flake.nix` in `dir` (`None`: git cannot tell). Nix
/// reads a repository's tracked files only, so to it an untracked flake.nix
/// does not exist.
fn flake_nix_tracked(dir: &Path) -> Option<bool> {
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["ls-files", "--error-unmatch", "--", "flake.nix"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    match status.code() {
        Some(0) => Some(true),
        Some(1) => Some(false),
        _ => None,
    }
}

/// Why Nix will not find the flake in `dir`, when the reason is that git
/// does not track its flake.nix (Nix's own message names a store path the
/// user has never seen).
fn untracked_flake(dir: &Path, store: &Path) -> Option<String> {
    (!dir.starts_with(store) && flake_nix_tracked(dir) == Some(false)).then(|| {
        format!(
            "git does not track flake.nix in {}, and Nix sees only the files git tracks; git add flake.nix flake.lock",
            dir.display()
        )
    })
}

/// An expression that fails with `message`, which `nix build` reports.
fn failing(message: &str) -> String {
    format!(
        "throw {}",
        nix_string(&format!("nix-sandbox-mcp: {message}"))
    )
}

/// `flake_reference` for this package's own flake (`NIX_SANDBOX_FLAKE`,
/// normally its source in the store).
fn own_flake_reference(own_flake: &Path, store: &Path) -> Result<String, String> {
    flake_reference(own_flake, store).map_err(|e| format!("NIX_SANDBOX_FLAKE: {e}"))
}

/// A `flake` entry's reference with a local path (`/dir#attr`) taken as
/// [`flake_reference`] takes it. Nix's `builtins.getFlake` would copy such a
/// directory whole, `.git` included; other references are kept as written.
fn local_flake_output(output: &str, store: &Path) -> Result<String, String> {
    let (reference, fragment) = match output.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (output, None),
    };
    if !reference.starts_with('/') {
        return Ok(output.to_string());
    }
    let reference = flake_reference(Path::new(reference), store)?;
    Ok(match fragment {
        Some(f) => format!("{reference}#{f}"),
        None => reference,
    })
}

/// The expression that builds the artifact for a config `flake` entry with
/// this flake's `lib.flakeSandbox` (which also wraps plain packages), with
/// the nixpkgs of the flake the entry names and the running daemon.
pub fn flake_entry_expression(
    own_flake: &Path,
    name: &str,
    flake: &str,
    interpreter: Option<&[String]>,
) -> String {
    let store = super::artifact::store_dir();
    let local = flake.split('#').next().filter(|r| r.starts_with('/'));
    if let Some(problem) = local.and_then(|dir| untracked_flake(Path::new(dir), &store)) {
        return failing(&format!("environments.{name}.flake: {problem}"));
    }
    flake_entry_expression_with(
        own_flake,
        name,
        flake,
        interpreter,
        &Runtime::current(),
        &store,
    )
}

fn flake_entry_expression_with(
    own_flake: &Path,
    name: &str,
    flake: &str,
    interpreter: Option<&[String]>,
    runtime: &Runtime,
    store: &Path,
) -> String {
    let own = match own_flake_reference(own_flake, store) {
        Ok(r) => r,
        Err(e) => return failing(&e),
    };
    let flake = match local_flake_output(flake, store) {
        Ok(f) => f,
        Err(e) => return failing(&format!("environments.{name}.flake: {e}")),
    };
    let interpreter = match interpreter {
        Some(argv) => format!(
            "[ {} ]",
            argv.iter()
                .map(|a| nix_string(a))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        None => "null".to_string(),
    };
    format!(
        "let nsm = builtins.getFlake {}; in nsm.lib.flakeSandbox {{ system = builtins.currentSystem; name = {}; flake = {}; interpreter = {interpreter}; {} }}",
        nix_string(&own),
        nix_string(name),
        nix_string(&flake),
        runtime.arguments(),
    )
}

/// The expression that builds the `project` environment from the project
/// flake's devShell with this flake's `lib.projectSandbox`, with the
/// project's own nixpkgs and the running daemon. A project that is not in a
/// git repository, or whose flake.nix git does not track, gets an expression
/// that fails saying so.
pub fn project_expression(own_flake: &Path, project: &Path) -> String {
    let project = std::fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let store = super::artifact::store_dir();
    if let Some(problem) = untracked_flake(&project, &store) {
        return failing(&format!("[project] use_flake: {problem}"));
    }
    project_expression_with(own_flake, &project, &Runtime::current(), &store)
}

fn project_expression_with(
    own_flake: &Path,
    project: &Path,
    runtime: &Runtime,
    store: &Path,
) -> String {
    let own = match own_flake_reference(own_flake, store) {
        Ok(r) => r,
        Err(e) => return failing(&e),
    };
    let project = match flake_reference(project, store) {
        Ok(r) => r,
        Err(e) => return failing(&format!("[project] use_flake: {e}")),
    };
    format!(
        "let nsm = builtins.getFlake {}; in nsm.lib.projectSandbox {{ system = builtins.currentSystem; project = builtins.getFlake {}; {} }}",
        nix_string(&own),
        nix_string(&project),
        runtime.arguments(),
    )
}

/// How every start-up build runs Nix, before its target; docs/nix.md quotes
/// the command (nix/tests/eval.nix holds it to this). `--json` rather than
/// `--print-out-paths`, which Nix before 2.6 lacks.
const NIX_BUILD: &[&str] = &[
    "--extra-experimental-features",
    "nix-command flakes",
    "build",
    "--no-link",
    "--json",
];
/// What comes before an expression target.
const NIX_BUILD_EXPRESSION: &[&str] = &["--impure", "--expr"];

/// Starts `build` (lazily: it runs when the registry awaits it); its result
/// is offered with `role`, the config's `[defaults]` applied. What an
/// earlier start built for the same fingerprint is offered without a build.
pub fn pending(build: Build, role: Role, config: &Config) -> Pending {
    let limit = Duration::from_secs(config.server.nix_build_timeout_seconds.map_or(300, |s| s.0));
    let defaults = config.defaults;
    let about = Building {
        label: build.label.clone(),
        name: build.name.clone(),
    };
    let key = super::build_cache::fingerprint(&build.target);
    let offer = move |path: &Path, name: Option<String>| -> Result<Offer, String> {
        let mut env = artifact::load(path, defaults).map_err(|e| {
            format!(
                "it built {}, which is not a sandbox artifact ({e}); build it with lib.mkSandbox",
                path.display()
            )
        })?;
        if let Some(name) = name {
            env.name = name;
        }
        Ok(Offer::new(env, role))
    };
    let recorded = key.as_deref().and_then(super::build_cache::lookup);
    tracing::debug!(
        "{}: fingerprint {key:?}, built before: {recorded:?}",
        build.label
    );
    let cached = recorded.and_then(|path| {
        offer(&path, build.name.clone())
            .inspect_err(|e| tracing::debug!("{}: not offered as built before: {e}", build.label))
            .ok()
    });
    Pending {
        about,
        cached,
        build: Box::pin(async move {
            let nix = which::which("nix")
                .map_err(|_| "nix is not installed or not on PATH".to_string())?;
            let path = build_one(&nix, &build.target, limit)
                .await
                .inspect_err(|e| {
                    tracing::warn!("building {} failed: {e}", build.label);
                })?;
            let built = offer(&path, build.name)?;
            if let Some(key) = &key {
                super::build_cache::record(key, &path);
            }
            Ok(built)
        }),
    }
}

async fn build_one(nix: &Path, target: &Target, limit: Duration) -> Result<PathBuf, String> {
    if let Target::Reference(r) = target {
        local_flake_output(r, &super::artifact::store_dir())?;
    }
    let mut cmd = tokio::process::Command::new(nix);
    cmd.args(NIX_BUILD);
    match target {
        Target::Reference(r) => cmd.arg(r),
        Target::Expression(e) => cmd.args(NIX_BUILD_EXPRESSION).arg(e),
    };
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = match tokio::time::timeout(limit, cmd.output()).await {
        Err(_) => {
            return Err(format!(
                "timed out after {} s (build it once with `nix build` first, or raise [server] nix_build_timeout_seconds)",
                limit.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("cannot run nix: {e}")),
        Ok(Ok(o)) => o,
    };
    if !out.status.success() {
        return Err(nix_error(&String::from_utf8_lossy(&out.stderr)));
    }
    out_path(&String::from_utf8_lossy(&out.stdout))
}

/// The `out` path from `nix build --json`.
fn out_path(json: &str) -> Result<PathBuf, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("unexpected output from nix build: {e}"))?;
    v.get(0)
        .and_then(|b| b.get("outputs"))
        .and_then(|o| o.get("out"))
        .and_then(|p| p.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| "nix build reported no output path".to_string())
}

/// The useful part of Nix's error output: its `error:` line and what follows,
/// without the trace.
fn nix_error(stderr: &str) -> String {
    let start = stderr.find("error:").unwrap_or(0);
    let text: Vec<&str> = stderr[start..]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(6)
        .collect();
    if text.is_empty() {
        "nix build failed".to_string()
    } else {
        text.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_for_nix() {
        assert_eq!(nix_string(r#"a"b\c${d}"#), r#""a\"b\\c\${d}""#);
    }

    /// A directory standing for a git repository (only `.git` matters).
    fn repository() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        std::fs::create_dir_all(dir.path().join("sub dir")).unwrap();
        dir
    }

    #[test]
    fn a_repository_is_taken_as_git_and_a_store_path_as_it_is() {
        let store = Path::new("/nix/store");
        let repo = repository();
        let top = repo.path();
        assert_eq!(
            flake_reference(top, store).unwrap(),
            format!("git+file://{}", top.display())
        );
        assert_eq!(
            flake_reference(&top.join("sub dir"), store).unwrap(),
            format!("git+file://{}?dir=sub%20dir", top.display())
        );
        assert_eq!(
            flake_reference(Path::new("/nix/store/x-source"), store).unwrap(),
            "path:/nix/store/x-source"
        );
    }

    #[test]
    fn a_directory_outside_git_is_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let e = flake_reference(dir.path(), Path::new("/nix/store")).unwrap_err();
        assert!(
            e.contains("not in a git repository") && e.contains(".env") && e.contains("git init"),
            "{e}"
        );
        let expression = project_expression_with(
            Path::new("/nix/store/x-source"),
            dir.path(),
            &Runtime::default(),
            Path::new("/nix/store"),
        );
        assert!(
            expression.starts_with(r#"throw "nix-sandbox-mcp: [project] use_flake: "#),
            "{expression}"
        );
        let expression = flake_entry_expression_with(
            Path::new("/nix/store/x-source"),
            "tools",
            &format!("{}#tools", dir.path().display()),
            None,
            &Runtime::default(),
            Path::new("/nix/store"),
        );
        assert!(
            expression.starts_with(r#"throw "nix-sandbox-mcp: environments.tools.flake: "#),
            "{expression}"
        );
    }

    #[test]
    fn expressions_use_the_running_daemon_and_name_the_entry() {
        let store = Path::new("/nix/store");
        let runtime = Runtime {
            daemon: Some(PathBuf::from("/nix/store/d-nix-sandbox-mcp-0.1.0")),
            bubblewrap: None,
        };
        let repo = repository();
        let e = flake_entry_expression_with(
            Path::new("/nix/store/x-source"),
            "rb",
            "github:o/r#ruby",
            Some(&["ruby".to_string(), "{file}".to_string()]),
            &runtime,
            store,
        );
        assert!(
            e.contains(r#"builtins.getFlake "path:/nix/store/x-source""#),
            "{e}"
        );
        assert!(
            e.contains(
                r#"name = "rb"; flake = "github:o/r#ruby"; interpreter = [ "ruby" "{file}" ]; daemon = builtins.storePath "/nix/store/d-nix-sandbox-mcp-0.1.0"; bubblewrap = null;"#
            ),
            "{e}"
        );
        let e = flake_entry_expression_with(
            Path::new("/nix/store/x-source"),
            "tools",
            &format!("{}#tools", repo.path().display()),
            None,
            &runtime,
            store,
        );
        assert!(
            e.contains(&format!(
                r#"flake = "git+file://{}#tools""#,
                repo.path().display()
            )),
            "{e}"
        );
        let e = project_expression_with(
            Path::new("/nix/store/x-source"),
            &repo.path().join("sub dir"),
            &runtime,
            store,
        );
        assert!(
            e.contains(&format!(
                r#"project = builtins.getFlake "git+file://{}?dir=sub%20dir";"#,
                repo.path().display()
            )),
            "{e}"
        );
    }

    #[test]
    fn a_program_in_the_store_names_its_package() {
        let store = tempfile::tempdir().unwrap();
        let bin = store.path().join("h-bubblewrap-0.11.0/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("bwrap"), "").unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(bin.join("bwrap"), elsewhere.path().join("bwrap")).unwrap();
        let store_path = Some(store.path().join("h-bubblewrap-0.11.0"));
        assert_eq!(
            package_of(&bin.join("bwrap"), store.path(), "bin/bwrap"),
            store_path
        );
        assert_eq!(
            package_of(&elsewhere.path().join("bwrap"), store.path(), "bin/bwrap"),
            store_path,
            "a link into the store is followed"
        );
        assert_eq!(
            package_of(&bin.join("bwrap"), store.path(), "bin/nix-sandbox-mcp"),
            None
        );
        std::fs::write(elsewhere.path().join("nix-sandbox-mcp"), "").unwrap();
        assert_eq!(
            package_of(
                &elsewhere.path().join("nix-sandbox-mcp"),
                store.path(),
                "bin/nix-sandbox-mcp"
            ),
            None
        );
    }

    #[test]
    fn reads_the_out_path_and_the_error() {
        assert_eq!(
            out_path(
                r#"[{"drvPath":"/nix/store/a.drv","outputs":{"out":"/nix/store/b-sandbox"}}]"#
            )
            .unwrap(),
            PathBuf::from("/nix/store/b-sandbox")
        );
        assert!(out_path("[]").is_err());
        let e = nix_error(
            "warning: dirty\nerror: flake 'github:o/r' does not provide attribute 'x'\n\n       Did you mean y?\n",
        );
        assert!(
            e.starts_with("error: flake") && e.contains("Did you mean y?"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_failed_build_is_an_error_of_that_build_only() {
        let build = |r: &str| Build {
            label: r.into(),
            name: None,
            target: Target::Reference(r.into()),
        };
        let config = Config::default();
        let builds = ["path:/nonexistent/a", "path:/nonexistent/b"]
            .map(|r| pending(build(r), Role::Extra, &config).build);
        for result in futures::future::join_all(builds).await {
            match result {
                Ok(_) => panic!("a build of a missing flake succeeded"),
                Err(e) => assert!(!e.is_empty()),
            }
        }
    }
}
