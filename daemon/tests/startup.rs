//! Start-up as a user meets it: configuration errors and where they are,
//! `doctor`, and --stdio failing fast (with the fix) when the sandbox cannot
//! work, or leaving cleanly when the client does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;

use common::cli::{cli, config, out, text};
use common::skip::skip;

#[test]
fn config_errors_name_file_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "[defaults]\ntimeout_ms = 1000\n\n[project]\nmode = \"sometimes\"\n",
    );
    let o = out(&mut cli(&["--config", cfg.to_str().unwrap(), "envs"]));
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(e.contains(&format!("{}:5", cfg.display())), "{e}");
    assert!(e.contains("project.mode"), "{e}");
    // Two mistakes: the first in the file is named, with a suggestion.
    let cfg = config(dir.path(), "servr = 1\nbogus = 2\n");
    let o = out(&mut cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "run",
        "-e",
        "bash",
        "true",
    ]));
    // `run` says the server could not start with its own status.
    assert_eq!(o.status.code(), Some(123));
    let e = text(&o.stderr);
    assert!(
        e.contains(&format!("{}:1:1: key `servr`", cfg.display()))
            && e.ends_with("did you mean `server`?\n"),
        "{e}"
    );
    let o = out(&mut cli(&["--config", "/nonexistent/config.toml", "envs"]));
    assert!(text(&o.stderr).contains("cannot read config file /nonexistent/config.toml"));
}

#[test]
fn a_later_config_option_replaces_an_earlier_one() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.toml");
    std::fs::write(&first, "[environments.first]\npreset = \"bash\"\n").unwrap();
    let second = config(dir.path(), "[environments.second]\npreset = \"bash\"\n");
    let o = out(&mut cli(&[
        "--config",
        first.to_str().unwrap(),
        "--config",
        second.to_str().unwrap(),
        "envs",
        "--json",
    ]));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o.stderr)));
    assert_eq!(v["environments"][0]["name"], "second");
}

#[test]
fn xdg_config_is_used_when_present() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("nix-sandbox-mcp")).unwrap();
    std::fs::write(
        dir.path().join("nix-sandbox-mcp/config.toml"),
        "[environments.only]\npreset = \"bash\"\n",
    )
    .unwrap();
    let o = out(cli(&["envs", "--json"]).env("XDG_CONFIG_HOME", dir.path()));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["environments"].as_array().unwrap().len(), 1);
    assert_eq!(v["environments"][0]["name"], "only");
}

#[test]
fn doctor_passes_here_and_names_the_limit_mechanism() {
    let o = out(&mut cli(&["doctor"]));
    let t = text(&o.stdout);
    assert!(o.status.success(), "{t}\n{}", text(&o.stderr));
    for s in [
        "ok    bubblewrap",
        "ok    sandbox",
        // Each protection as the test sandbox showed it.
        "ok    namespaces: checked in a test sandbox",
        "ok    identity: checked in a test sandbox",
        "ok    seccomp: checked in a test sandbox: filter mode",
        "ok    network: checked in a test sandbox",
        "ok    root: checked in a test sandbox",
        "ok    rlimits: checked in a test sandbox",
        "limits:",
        "ok    environment python: Python 3.",
        "ok    example run: `print(6 * 7)` in python printed 42",
        "all checks passed",
    ] {
        assert!(t.contains(s), "doctor lacks {s}:\n{t}");
    }
}

#[test]
fn doctor_json_has_one_stable_shape() {
    let o = out(&mut cli(&["doctor", "--json"]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["ok"], true);
    let checks = v["checks"].as_array().unwrap();
    for c in checks {
        let keys: Vec<&String> = c.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["detail", "fix", "name", "status"], "{c}");
        assert!(["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap()));
        assert_eq!(c["fix"].is_null(), c["status"] == "ok", "{c}");
    }
    let status = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["status"].as_str().unwrap().to_string())
    };
    for name in [
        "config",
        "bubblewrap",
        "sandbox",
        "namespaces",
        "seccomp",
        "network",
        "root",
        "rlimits",
        "project",
        "example run",
    ] {
        assert_eq!(status(name).as_deref(), Some("ok"), "{name}: {v}");
    }
}

/// A `bwrap` that answers --version and --help but cannot create namespaces,
/// as on Ubuntu with AppArmor's user-namespace restriction.
fn broken_bwrap(dir: &Path) -> String {
    let real = which("bwrap");
    let script = dir.join("bwrap");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$1\" in --version|--help) exec {} \"$1\";; esac\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap())
}

fn which(name: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .expect("on PATH")
}

#[test]
fn stdio_with_a_broken_sandbox_fails_fast_with_the_doctor_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = broken_bwrap(dir.path());
    let t = Instant::now();
    let o = out(cli(&["--stdio"]).env("PATH", &path).stdin(Stdio::null()));
    assert_eq!(o.status.code(), Some(1));
    assert!(t.elapsed() < Duration::from_secs(5));
    let e = text(&o.stderr);
    assert!(
        e.contains("the sandbox does not work on this machine")
            && e.contains("setting up uid map")
            && e.contains("fix:"),
        "{e}"
    );
    let o = out(cli(&["doctor"]).env("PATH", &path));
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("FAIL  sandbox"));
    let o = out(cli(&["doctor", "--json"]).env("PATH", &path));
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let failed: Vec<&serde_json::Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .collect();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["name"], "sandbox");
    assert!(failed[0]["fix"].as_str().is_some_and(|f| !f.is_empty()));
    let o = out(cli(&["run", "-e", "bash", "echo never"]).env("PATH", &path));
    assert_eq!(o.status.code(), Some(126));
    let e = text(&o.stderr);
    assert!(
        e.contains("could not be set up") && e.contains("fix:") && !e.contains("never"),
        "{e}"
    );
}

#[test]
fn stdio_without_bubblewrap_fails_fast_with_install_advice() {
    let dir = tempfile::tempdir().unwrap();
    let o = out(cli(&["--stdio"])
        .env("PATH", dir.path())
        .stdin(Stdio::null()));
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(
        e.contains("bubblewrap (bwrap) is not installed") && e.contains("apt install bubblewrap"),
        "{e}"
    );
}

#[test]
fn as_root_a_project_the_sandbox_cannot_read_is_refused_at_start() {
    if !rustix::process::geteuid().is_root() {
        // Only a root server runs sandboxes under another uid than its own.
        skip(
            "as_root_a_project_the_sandbox_cannot_read_is_refused_at_start",
            "needs root",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let o = out(cli(&["envs"]).env("PROJECT_DIR", dir.path()));
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(
        e.contains("cannot read the project") && e.contains("chmod o+rx"),
        "{e}"
    );
    // Refused after its limits were set up, the server leaves no cgroup.
    let child = cli(&["--stdio"])
        .env("PROJECT_DIR", dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(cgroups_of(pid), Vec::<PathBuf>::new());
}

/// Where in the server's start-up a signal comes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Moment {
    /// While it starts: its handlers are set, and it waits for `bwrap
    /// --version` (a `bwrap` first on PATH that holds until told to go on).
    Starting,
    /// Started, waiting for the handshake: it has logged that it serves.
    Waiting,
}

/// A `bwrap` that, asked for its version, says so (a file `reached` in
/// `dir`) and waits until a file `go` is there, for ten seconds at most;
/// then runs the real one.
fn gated_bwrap(dir: &Path) -> PathBuf {
    let real = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join("bwrap"))
        .find(|p| p.is_file())
        .expect("bwrap on PATH");
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let script = bin.join("bwrap");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  : > '{d}/reached'\n  i=0\n  while [ ! -e '{d}/go' ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done\nfi\nexec '{real}' \"$@\"\n",
            d = dir.display(),
            real = real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    bin
}

/// Whether `pid` has a handler for signal `number` (`SigCgt` in its status).
fn catches(pid: u32, number: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (number - 1)) != 0)
}

/// SIGTERM or SIGINT while the server starts or waits for the client's
/// handshake ends it cleanly: exit 0, no cgroup and no runtime directory
/// left (the signal's default action would kill it outright). Each moment
/// is waited for, never guessed: the gated `bwrap` says the server is in
/// its start, the log line that it serves says it waits for the client.
#[test]
fn a_signal_before_the_handshake_ends_the_server_cleanly() {
    use rustix::process::Signal;
    for (signal, number, moment) in [
        (Signal::TERM, libc::SIGTERM, Moment::Starting),
        (Signal::INT, libc::SIGINT, Moment::Starting),
        (Signal::TERM, libc::SIGTERM, Moment::Waiting),
        (Signal::INT, libc::SIGINT, Moment::Waiting),
    ] {
        // Its own TMPDIR, to see the runtime directory go.
        let tmp = server_tmpdir();
        let gate = tempfile::tempdir().unwrap();
        let mut command = cli(&["--stdio"]);
        command.env("TMPDIR", tmp.path());
        if moment == Moment::Starting {
            let path = format!(
                "{}:{}",
                gated_bwrap(gate.path()).display(),
                std::env::var("PATH").unwrap_or_default()
            );
            command.env("PATH", path);
        }
        let mut child = stdio_server(&mut command);
        let pid = child.id();
        // The log, line by line, as the server writes it.
        let (lines, log) = std::sync::mpsc::channel::<String>();
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let reader = std::thread::spawn(move || {
            for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        match moment {
            Moment::Starting => {
                while !gate.path().join("reached").exists() {
                    assert!(
                        Instant::now() < deadline,
                        "bwrap was never asked its version"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Moment::Waiting => {
                while !seen.iter().any(|l: &String| l.contains(" INFO serving ")) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match log.recv_timeout(left) {
                        Ok(line) => seen.push(line),
                        Err(e) => panic!("the server never said it serves ({e}): {seen:?}"),
                    }
                }
            }
        }
        assert!(
            catches(pid, number),
            "{signal:?} {moment:?}: no handler set yet"
        );
        rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal).unwrap();
        std::fs::write(gate.path().join("go"), "").unwrap();
        let stdin = child.stdin.take();
        let status = child.wait().unwrap();
        drop(stdin);
        reader.join().unwrap();
        seen.extend(log.try_iter());
        let said = seen.join("\n");
        assert_eq!(status.code(), Some(0), "{signal:?} {moment:?}: {said}");
        let quit = if signal == Signal::TERM {
            "terminated"
        } else {
            "interrupted"
        };
        let expected = match moment {
            Moment::Starting => format!("{quit} while starting; nothing to shut down"),
            Moment::Waiting => format!("shutting down ({quit} before the client's handshake)"),
        };
        assert!(said.contains(&expected), "{signal:?} {moment:?}: {said}");
        assert_eq!(
            cgroups_of(pid),
            Vec::<PathBuf>::new(),
            "{signal:?} {moment:?}: {said}"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{signal:?} {moment:?}: {left:?}");
    }
}

/// The cgroups named for daemon `pid` (its containers, where it had
/// cgroups), anywhere in the cgroup mounts.
fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(path);
            } else if depth > 0 {
                walk(&path, prefix, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    let prefix = format!("nix-sandbox-mcp-{pid}-");
    walk(Path::new("/sys/fs/cgroup"), &prefix, 6, &mut found);
    found
}

/// A client's handshake, then `tools/list` (id 2).
const HELLO: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    "\n"
);

/// Starts the server with its standard streams piped.
fn stdio_server(command: &mut std::process::Command) -> std::process::Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A directory for a server's TMPDIR, which a root server's sandboxes
/// (another uid) can pass through.
fn server_tmpdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    tmp
}

#[test]
fn a_client_that_leaves_at_once_gets_a_clean_shutdown() {
    // Sandboxes are still being prepared when the connection closes, and
    // their groups on the way back to the pool: none may stay behind.
    for _ in 0..5 {
        let mut child = stdio_server(&mut cli(&["--stdio"]));
        let pid = child.id();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(HELLO.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert_eq!(cgroups_of(pid), Vec::<PathBuf>::new());
        assert!(text(&o.stdout).contains(r#""id":2"#), "{}", text(&o.stdout));
        assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    }
}

/// A server that has answered the handshake and `tools/list` (so it has
/// its runtime directory, cgroups and pool), with `TMPDIR` set to `tmp`.
fn started_server(tmp: &Path) -> (std::process::Child, impl std::io::BufRead) {
    let mut child = cli(&["--stdio"])
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(HELLO.as_bytes()).unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains(r#""id":2"#) {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0);
    }
    (child, out)
}

/// The servers' runtime directories in `tmp`.
fn runtime_dirs(tmp: &Path) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("nix-sandbox-mcp-"))
        .collect();
    names.sort();
    names
}

/// A server killed outright (SIGKILL) cannot clean up after itself; the
/// next server of the same user removes the runtime directory and cgroups
/// it left, and never those of a server that is alive.
#[test]
fn the_next_server_removes_what_a_killed_one_left() {
    let tmp = server_tmpdir();
    let (mut killed, _) = started_server(tmp.path());
    let left = runtime_dirs(tmp.path());
    assert_eq!(left.len(), 1, "{left:?}");
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert_eq!(runtime_dirs(tmp.path()), left);

    let (mut alive, mut replies) = started_server(tmp.path());
    let now = runtime_dirs(tmp.path());
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, left);
    assert_eq!(cgroups_of(killed.id()), Vec::<PathBuf>::new());

    // Another server's start leaves the live one's directory alone, and
    // the live one still runs code.
    let o = out(cli(&["envs"]).env("TMPDIR", tmp.path()));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(runtime_dirs(tmp.path()), now);
    let run = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run","arguments":{"env":"bash","code":"echo still-here"}}}"#;
    let mut stdin = alive.stdin.take().unwrap();
    writeln!(stdin, "{run}").unwrap();
    let mut line = String::new();
    while !line.contains(r#""id":3"#) {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut replies, &mut line).unwrap() > 0);
    }
    assert!(line.contains("still-here"), "{line}");
    drop(stdin);
    assert!(alive.wait().unwrap().success());
    assert_eq!(runtime_dirs(tmp.path()), Vec::<std::ffi::OsString>::new());
}
