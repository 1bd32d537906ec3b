//! Runs of an argv instead of a code file (declared commands), through the
//! real executor and bubblewrap: no shell anywhere, the working directory
//! honoured, and the same limits as any run.

mod common;

use std::time::Duration;

use common::{env, env_with, fixture};
use nix_sandbox_mcp::environment::Environment;
use nix_sandbox_mcp::exec::{Argv, ExecError, LimitKind, Outcome, Request, SetupFailure};
use tokio_util::sync::CancellationToken;

async fn run_argv(env: &Environment, argv: &[&str], workdir: &str) -> Outcome {
    try_run_argv(env, argv, workdir).await.expect("run starts")
}

async fn try_run_argv(
    env: &Environment,
    argv: &[&str],
    workdir: &str,
) -> Result<Outcome, ExecError> {
    let f = fixture();
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    f.app
        .executor
        .run_argv(
            Request {
                env,
                code: b"",
                project: f.app.project.as_ref(),
                inherited: &[],
                cancel: CancellationToken::new(),
                observer: None,
                share: None,
            },
            Argv {
                argv: &argv,
                workdir,
            },
        )
        .await
}

#[tokio::test]
async fn arguments_reach_the_program_verbatim_without_a_shell() {
    let hostile = "a b; echo pwned $(id) `id` | cat > /tmp/x && rm -rf / '\"";
    let o = run_argv(
        &env("bash"),
        &["printf", "[%s]\\n", hostile, "-rf"],
        "/workspace",
    )
    .await;
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    assert_eq!(o.stdout.text, format!("[{hostile}]\n[-rf]\n"));
}

#[tokio::test]
async fn the_command_starts_in_its_working_directory() {
    let o = run_argv(&env("bash"), &["pwd"], "/project").await;
    assert_eq!(o.stdout.text, "/project\n", "{o:?}");
    let o = run_argv(&env("bash"), &["cat", "README.md"], "/project").await;
    assert_eq!(o.stdout.text, "hello from the project\n", "{o:?}");
}

#[tokio::test]
async fn a_command_finds_an_empty_workspace_and_no_code_file() {
    let o = run_argv(&env("bash"), &["ls", "-A", "/workspace"], "/workspace").await;
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    assert_eq!(o.stdout.text, "", "{o:?}");
}

#[tokio::test]
async fn an_unknown_program_is_a_set_up_failure_naming_it() {
    match try_run_argv(&env("bash"), &["no-such-program-here"], "/workspace").await {
        Err(ExecError::Setup {
            failure: SetupFailure::CommandNotStarted,
            message,
        }) => assert!(message.contains("no-such-program-here"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn limits_apply_to_commands() {
    let e = env_with("bash", |e| e.limits.timeout = Duration::from_millis(1500));
    let o = run_argv(&e, &["sleep", "30"], "/workspace").await;
    assert_eq!(o.limit, Some(LimitKind::Timeout), "{o:?}");
    let e = env_with("bash", |e| e.limits.output_bytes = 512);
    let o = run_argv(&e, &["seq", "1", "100000"], "/workspace").await;
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    assert!(
        o.stdout.dropped_bytes > 0 && o.stdout.text.len() < 2048,
        "{}",
        o.stdout.text.len()
    );
}
