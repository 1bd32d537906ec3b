//! The command line as a user meets it: run, envs, doctor, configuration
//! errors, and --stdio failing fast when the sandbox cannot work.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::cli::{BIN, cli, config, out, text};

#[test]
fn help_documents_commands_configuration_and_environment() {
    let o = out(&mut cli(&["--help"]));
    assert!(o.status.success());
    let h = text(&o.stdout);
    for s in [
        "--stdio",
        "run",
        "envs",
        "doctor",
        "client-config",
        "--config",
        "PROJECT_DIR",
        "PROJECT_MOUNT",
        "NIX_SANDBOX_DIR",
        "NIX_SANDBOX_ENVS",
        "EXIT STATUS",
        "EXAMPLES",
    ] {
        assert!(h.contains(s), "--help lacks {s}");
    }
    let o = out(&mut cli(&["run", "--help"]));
    assert!(text(&o.stdout).contains("standard input"));
}

#[test]
fn without_arguments_it_says_what_to_do() {
    let o = out(&mut cli(&[]));
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--stdio"));
}

#[test]
fn run_streams_output_and_passes_the_exit_code_through() {
    let o = out(&mut cli(&[
        "run",
        "--env",
        "bash",
        "echo hi; echo err >&2; exit 7",
    ]));
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(text(&o.stdout), "hi\n");
    assert_eq!(text(&o.stderr), "err\n");
    let o = out(&mut cli(&["run", "-e", "shell", "ls /project/Cargo.toml"]));
    assert_eq!(
        text(&o.stdout),
        "/project/Cargo.toml\n",
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn run_reads_code_from_a_file_or_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.py");
    std::fs::write(&f, "print('from file')").unwrap();
    let o = out(&mut cli(&[
        "run",
        "--env",
        "python",
        "-f",
        f.to_str().unwrap(),
    ]));
    assert_eq!(text(&o.stdout), "from file\n");

    let mut child = cli(&["run", "--env", "node", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"console.log('from stdin')")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(text(&o.stdout), "from stdin\n");
}

#[test]
fn run_tells_its_own_failures_from_the_programs_by_exit_status() {
    // The program's own statuses pass through, 1 included.
    let o = out(&mut cli(&["run", "--env", "bash", "exit 1"]));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        !text(&o.stderr).contains("nix-sandbox-mcp:"),
        "{}",
        text(&o.stderr)
    );
    // Killed by a signal: 128 + N, as a shell reports it.
    let o = out(&mut cli(&["run", "--env", "bash", "kill -9 $$"]));
    assert_eq!(o.status.code(), Some(137), "{}", text(&o.stderr));
    // The server could not start: 123, never the program's 1.
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "[defaults]\ntimeot_ms = 5\n");
    let o =
        out(cli(&["--config", "config.toml", "run", "--env", "bash", ":"]).current_dir(dir.path()));
    assert_eq!(o.status.code(), Some(123), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).starts_with("nix-sandbox-mcp: "),
        "{}",
        text(&o.stderr)
    );
    // The table is in --help, a row a line.
    let o = out(&mut cli(&["run", "--help"]));
    let help = text(&o.stdout);
    for status in ["123", "124", "125", "126", "127", "128+N", "130", "141"] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{status} "))),
            "run --help lacks a row for exit status {status}:\n{help}"
        );
    }
}

#[test]
fn run_timeout_exits_124_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "[defaults]\ntimeout_ms = 500\n");
    let t = Instant::now();
    let o = out(&mut cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "run",
        "--env",
        "bash",
        "sleep 30",
    ]));
    assert_eq!(o.status.code(), Some(124));
    assert!(
        text(&o.stderr).contains("the run exceeded its 500 ms time limit"),
        "{}",
        text(&o.stderr)
    );
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn unknown_environment_lists_the_available_ones() {
    let o = out(&mut cli(&["run", "--env", "cobol", "x"]));
    assert_eq!(o.status.code(), Some(127));
    let e = text(&o.stderr);
    assert!(
        e.contains("\"cobol\"") && e.contains("bash") && e.contains("python") && e.contains("node"),
        "{e}"
    );
}

#[test]
fn inherit_env_values_are_read_at_run_time_and_nothing_else_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "[project.inherit_env]\nvars = [\"DATABASE_URL\"]\n",
    );
    let o = out(cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "run",
        "--env",
        "bash",
        "echo \"db=$DATABASE_URL aws=${AWS_SECRET_ACCESS_KEY:-unset}\"",
    ])
    .env("DATABASE_URL", "postgres://x")
    .env("AWS_SECRET_ACCESS_KEY", "hunter2"));
    assert_eq!(
        text(&o.stdout),
        "db=postgres://x aws=unset\n",
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn envs_lists_name_description_source_interpreter_and_limits() {
    let o = out(&mut cli(&["envs"]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let t = text(&o.stdout);
    for s in [
        "bash",
        "python",
        "node",
        "source:",
        "interpreter:",
        "limits:",
        "timeout 30000 ms",
        "limits enforced with:",
        "shell is another name for bash",
    ] {
        assert!(t.contains(s), "envs lacks {s}:\n{t}");
    }
    let o = out(&mut cli(&["envs", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bash", "node", "python"]);
    assert!(
        v["environments"][2]["description"]
            .as_str()
            .unwrap()
            .starts_with("Python 3.")
    );
    assert!(v["limits_mechanism"].is_string());
}

#[test]
fn envs_and_doctor_list_the_declared_commands_and_refuse_broken_ones() {
    let dir = tempfile::tempdir().unwrap();
    let declared = "[commands.log]\ndescription = \"Recent commits\"\nenv = \"bash\"\nargv = [\"git\", \"log\", \"--max-count={{n}}\"]\ndanger = \"safe\"\nconfirm = true\nseparator = true\n[commands.log.params.n]\ntype = \"integer\"\nrequired = true\n";
    let cfg = config(dir.path(), declared);
    let with = |args: &[&str]| {
        out(&mut cli(
            &[&["--config", cfg.to_str().unwrap()], args].concat()
        ))
    };

    let o = with(&["envs"]);
    let t = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    for s in [
        "command log (tool log)",
        "runs:        git log -- --max-count={{n}} (in bash, danger safe, asks the user first)",
        "parameter:   n (integer, required)",
    ] {
        assert!(t.contains(s), "envs lacks {s}:\n{t}");
    }
    let v: serde_json::Value = serde_json::from_slice(&with(&["envs", "--json"]).stdout).unwrap();
    let log = &v["commands"][0];
    assert_eq!(log["tool"], "log");
    assert_eq!(
        log["argv"],
        serde_json::json!(["git", "log", "--", "--max-count={{n}}"])
    );
    assert_eq!(log["params"][0]["schema"]["type"], "integer");

    let o = with(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let check = doctor_check(&v, "commands");
    assert_eq!(check["status"], "ok", "{v}");
    assert!(check["detail"].as_str().unwrap().contains("log (in bash)"));

    // An environment that does not exist: envs fails as --stdio would, and
    // doctor names the key and the environments there are.
    config(
        dir.path(),
        &declared.replace("env = \"bash\"", "env = \"rubyy\""),
    );
    let o = with(&["envs"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("commands.log.env"),
        "{}",
        text(&o.stderr)
    );
    let o = with(&["doctor", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let check = doctor_check(&v, "commands");
    assert_eq!(check["status"], "fail", "{v}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("there is no environment \"rubyy\"")
    );
}

#[test]
fn doctor_warns_when_the_memory_budget_holds_fewer_sandboxes_than_may_run() {
    // A warning, not a failure: the server works, one call at a time
    // (json_with requires exit status 0).
    let v = json_with(
        "[server]\nmemory_budget_mb = 1536\nmax_concurrent_runs = 3\n",
        "doctor",
    );
    let budget = doctor_check(&v, "memory budget");
    assert_eq!(budget["status"], "warn", "{budget}");
    let detail = budget["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("1536 MiB ([server] memory_budget_mb) holds 1 sandbox at")
            && detail.contains("3 calls may run at once"),
        "{detail}"
    );
}

#[test]
fn a_fallback_mechanism_comes_with_the_step_to_cgroup_v2() {
    // Forced here, so that every host shows a fallback; on a host whose own
    // fallback is v1 or rlimits, `detect` names the kernel's or the
    // delegation's step instead (unit tests in limits/).
    let forced = |args: &[&str]| out(cli(args).env("NIX_SANDBOX_LIMITS", "rlimits"));
    let o = forced(&["envs"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let t = text(&o.stdout);
    assert!(
        t.contains("cgroup v2 is not used: cgroups turned off by NIX_SANDBOX_LIMITS=rlimits; to use it: unset NIX_SANDBOX_LIMITS"),
        "{t}"
    );
    let o = forced(&["envs", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["limits_mechanism"], "rlimits");
    assert!(
        v["cgroup_v2_missing"]["step"]
            .as_str()
            .is_some_and(|s| s.starts_with("unset NIX_SANDBOX_LIMITS")),
        "{v}"
    );
    let o = forced(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let limits = doctor_check(&v, "limits");
    assert_eq!(limits["status"], "warn", "{limits}");
    assert!(
        limits["fix"]
            .as_str()
            .is_some_and(|f| f.contains("for cgroup v2: unset NIX_SANDBOX_LIMITS")),
        "{limits}"
    );
    // Unforced, the step is there exactly when the mechanism is a fallback.
    let v = json_with("", "envs");
    assert_eq!(
        v["cgroup_v2_missing"].is_null(),
        v["limits_mechanism"] == "cgroup v2",
        "{v}"
    );
}

/// The check named `name` in a `doctor --json` report.
fn doctor_check(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no check {name} in {report}"))
}

/// `COMMAND --json` (`envs`, `doctor`) with `toml` as the configuration
/// file; it must succeed.
fn json_with(toml: &str, command: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), toml);
    let o = out(&mut cli(&[
        "--config",
        cfg.to_str().unwrap(),
        command,
        "--json",
    ]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_readmes_configuration_example_is_valid_and_means_what_it_says() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let section = readme.split("## Configure it").nth(1).unwrap();
    let example = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README's configuration example");
    let v = json_with(example, "envs");
    let pip = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "pip")
        .unwrap_or_else(|| panic!("{v}"));
    let network = pip["network"].as_str().unwrap();
    assert!(
        network.contains("pypi.org") && network.contains("*.pythonhosted.org"),
        "{network}"
    );
    assert_eq!(pip["limits"]["timeout_ms"], 60000);
}

#[test]
fn configured_environments_replace_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "[environments.py]\npreset = \"python\"\ndescription = \"Project Python\"\ntimeout_ms = 1234\n\n[environments.sh]\ninterpreter = \"bash {file}\"\n",
    );
    let o = out(&mut cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "envs",
        "--json",
    ]));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o.stderr)));
    let envs = v["environments"].as_array().unwrap();
    assert_eq!(envs.len(), 2);
    assert_eq!(envs[0]["name"], "py");
    assert_eq!(envs[0]["description"], "Project Python");
    assert_eq!(envs[0]["limits"]["timeout_ms"], 1234);
    assert_eq!(envs[1]["name"], "sh");
    let o = out(&mut cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "run",
        "-e",
        "sh",
        "echo custom",
    ]));
    assert_eq!(text(&o.stdout), "custom\n");
}

#[test]
fn a_missing_interpreter_drops_its_environment_with_a_warning() {
    let v = json_with(
        "[environments.ruby]\ninterpreter = \"no-such-interpreter-nsm {file}\"\n\n[environments.sh]\npreset = \"bash\"\n",
        "envs",
    );
    let names: Vec<&str> = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sh"]);
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("ruby") && warnings.contains("no-such-interpreter-nsm"),
        "{warnings}"
    );
}

#[test]
fn a_small_run_queue_does_not_drop_environments_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "[server]\nmax_concurrent_runs = 1\nmax_queued_runs = 0\n",
    );
    let o = out(&mut cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "envs",
        "--json",
    ]));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o.stderr)));
    let names: Vec<&str> = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bash", "node", "python"], "{}", v["warnings"]);
}

/// Runs the binary with its standard output already closed, as when piped
/// into `head` that has exited.
fn with_closed_stdout(c: &mut Command) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_standard_output_ends_every_command_quietly() {
    for args in [
        &["schema"][..],
        &["envs"],
        &["envs", "--json"],
        &["doctor"],
        &["doctor", "--json"],
        &["client-config", "vscode"],
        &["client-config", "--all"],
        &["--help"],
    ] {
        let o = with_closed_stdout(&mut cli(args));
        let e = text(&o.stderr);
        assert!(
            !e.contains("panicked") && !e.contains("Broken pipe"),
            "{args:?}: {e}"
        );
        assert!(
            o.status.code().is_some(),
            "{args:?} was killed: {:?}",
            o.status
        );
    }
    // A run whose output nobody reads any more is ended, as SIGPIPE would.
    let t = Instant::now();
    let o = with_closed_stdout(&mut cli(&["run", "-e", "bash", "yes"]));
    assert_eq!(o.status.code(), Some(141), "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("panicked"));
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
fn empty_or_binary_code_is_refused_with_how_to_pass_code() {
    let dir = tempfile::tempdir().unwrap();
    let blank = dir.path().join("blank.sh");
    std::fs::write(&blank, " \n\t\n").unwrap();
    let nul = dir.path().join("nul.py");
    std::fs::write(&nul, b"print(1)\0\n").unwrap();
    let latin1 = dir.path().join("latin1.sh");
    std::fs::write(&latin1, b"echo caf\xe9\n").unwrap();
    let mut from_stdin = cli(&["run", "-e", "bash", "-"]);
    from_stdin.stdin(Stdio::null());
    for (mut c, source) in [
        (
            cli(&["run", "-e", "bash", ""]),
            "the CODE argument is empty",
        ),
        (
            cli(&["run", "-e", "python", "  \n "]),
            "the CODE argument holds only whitespace",
        ),
        (
            cli(&["run", "-e", "bash", "-f", blank.to_str().unwrap()]),
            "holds only whitespace",
        ),
        (from_stdin, "standard input is empty"),
        (
            cli(&["run", "-e", "python", "-f", nul.to_str().unwrap()]),
            "holds a NUL byte (at byte 8); code must be text",
        ),
        (
            cli(&["run", "-e", "bash", "-f", latin1.to_str().unwrap()]),
            "is not valid UTF-8 (at byte 8)",
        ),
    ] {
        let o = out(&mut c);
        assert_eq!(o.status.code(), Some(2), "{source}");
        let e = text(&o.stderr);
        assert!(e.contains("nothing was run") && e.contains(source), "{e}");
        assert!(e.contains("-f FILE") && e.contains("`-`"), "{e}");
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn client_config_names_this_binary_and_what_was_asked_for() {
    let real = std::fs::canonicalize(BIN).unwrap();
    let o = out(&mut cli(&["client-config", "vscode"]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let server = &v["servers"]["sandbox"];
    assert_eq!(server["command"], real.to_str().unwrap());
    assert_eq!(server["args"], serde_json::json!(["--stdio"]));
    assert!(text(&o.stderr).contains(".vscode/mcp.json"));

    // --config (relative here) and --project-dir become absolute paths.
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "[defaults]\ntimeout_ms = 5000\n");
    let o = out(cli(&[
        "--config",
        "config.toml",
        "client-config",
        "codex",
        "--name",
        "nsm",
        "--project-dir",
        ".",
    ])
    .current_dir(dir.path()));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: toml::Table = toml::from_str(&text(&o.stdout)).unwrap();
    let server = &v["mcp_servers"]["nsm"];
    let here = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        server["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect::<Vec<_>>(),
        [
            "--config",
            here.join("config.toml").to_str().unwrap(),
            "--stdio"
        ]
    );
    assert_eq!(server["env"]["PROJECT_DIR"].as_str(), here.to_str());

    // The configuration clients will start with is checked now.
    config(dir.path(), "[defaults]\ntimeot_ms = 5\n");
    let o = out(cli(&["--config", "config.toml", "client-config", "zed"]).current_dir(dir.path()));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("did you mean `timeout_ms`?"),
        "{}",
        text(&o.stderr)
    );
    let o = out(&mut cli(&[
        "client-config",
        "cursor",
        "--project-dir",
        "/nonexistent",
    ]));
    assert_eq!(o.status.code(), Some(1));
    let o = out(&mut cli(&[
        "client-config",
        "cursor",
        "--name",
        "my server",
    ]));
    assert_eq!(o.status.code(), Some(2));

    // The Nix package's wrapper names itself.
    let o = out(cli(&["client-config", "claude-code"]).env(
        "NIX_SANDBOX_MCP_COMMAND",
        "/nix/store/x/bin/nix-sandbox-mcp",
    ));
    assert_eq!(
        text(&o.stdout),
        "claude mcp add sandbox -- /nix/store/x/bin/nix-sandbox-mcp --stdio\n"
    );

    let o = out(&mut cli(&["client-config", "--all"]));
    let t = text(&o.stdout);
    for title in [
        "Claude Code",
        "Claude Desktop",
        "Cursor",
        "VS Code",
        "Codex CLI",
        "Zed",
    ] {
        assert!(t.contains(&format!("**{title}**")), "{title}");
    }
}

/// The daemon raises its own soft open-files limit (it holds descriptors
/// for every sandbox alive) up to its hard limit; a sandbox still gets the
/// configured limit (1024 by default), not the daemon's.
#[test]
fn the_daemon_raises_its_own_open_files_limit_not_the_sandboxes() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let hard = getrlimit(Resource::Nofile).maximum;
    let mut c = cli(&["run", "--env", "bash", "ulimit -Sn; sleep 2"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing is allocated.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(256),
                    maximum: hard,
                },
            )?;
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    // The daemon's limits once the sandbox runs (its output streams).
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(line, "1024\n");
    let soft: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or_else(|| panic!("{limits}"));
    let wanted = hard.map_or(65_536, |h| h.min(65_536));
    assert_eq!(soft, wanted.max(256), "{limits}");
}

#[test]
fn a_bubblewrap_beside_the_binary_serves_when_the_one_on_path_is_too_old() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // An old bubblewrap first on PATH: it runs, but lacks --disable-userns.
    let old_dir = dir.path().join("old");
    std::fs::create_dir(&old_dir).unwrap();
    let old = old_dir.join("bwrap");
    std::fs::write(
        &old,
        "#!/bin/sh\ncase \"$1\" in --version) echo 'bubblewrap 0.4.0';; *) echo '--unshare-all';; esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    // This binary with a working bubblewrap beside it.
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let bin = bin_dir.join("nix-sandbox-mcp");
    std::fs::copy(BIN, &bin).unwrap();
    std::os::unix::fs::symlink(which::which("bwrap").unwrap(), bin_dir.join("bwrap")).unwrap();
    let path = format!("{}:/usr/bin:/bin", old_dir.display());
    let o = Command::new(&bin)
        .args(["doctor", "--json"])
        .env("PATH", &path)
        .env_remove("NIX_SANDBOX_BWRAP")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let check = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "bubblewrap")
        .unwrap()
        .clone();
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!("{}/bwrap", bin_dir.display())),
        "{detail}"
    );
    assert!(detail.contains("beside this binary"), "{detail}");
    assert!(detail.contains("0.4.0 lacks --disable-userns"), "{detail}");
    // Named, it is used or refused, nothing else tried.
    let o = Command::new(&bin)
        .args(["doctor"])
        .env("PATH", &path)
        .env("NIX_SANDBOX_BWRAP", dir.path().join("nowhere"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let out = text(&o.stdout);
    assert!(
        out.contains("nowhere") && out.contains("NIX_SANDBOX_BWRAP"),
        "{out}"
    );
}
