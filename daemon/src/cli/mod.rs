//! The command line: `--stdio` (the MCP server, `serve.rs`), `run`
//! (`run.rs`), `envs` (`envs.rs`), `doctor`, `client-config` and `schema`.
//! Parses arguments with clap, sets up logging on stderr, and drives the
//! other modules; holds no sandbox logic of its own.

mod ca;
mod caches;
mod envs;
mod run;
mod serve;

use std::fmt::Write as _;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{ArgAction, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::app::{self, App, StartOptions};
use crate::exec::nest::holder;
use crate::exec::{ExecError, Observer, Request, Stream};
use crate::jobs::Jobs;
use crate::registry::artifact;
use crate::server::{ProjectState, SandboxServer, Shared, http};
use crate::sessions::Sessions;

const ABOUT: &str = "Run code from AI agents in bubblewrap sandboxes built from Nix or the host";

const LONG_ABOUT: &str = "\
nix-sandbox-mcp is a Model Context Protocol (MCP) server whose tool is \
run(code, env). Each environment (bash, python, node, or one built by Nix) \
runs in a bubblewrap sandbox: new user, pid, ipc, uts, cgroup and network \
namespaces, no capabilities, a read-only root, the project at /project \
through a copy-on-write overlay (writable, but the user's files are never \
written: changes come back as a patch; or read-only, or read-write, by \
[project] mode), a fresh writable /workspace, a seccomp filter, and limits \
on time, memory, processes, CPU, file size, open files and output. \
Environments may keep cache directories between calls, per project. An \
environment with network reaches only the hosts its allowlist names, \
through the server's proxy, which can add credentials for named hosts \
that the sandbox never sees and hold each request to rules \
(docs/credentials.md).

Calls may name a session to keep interpreter state (variables, the working \
directory, /workspace) across calls, or run in the background as jobs read \
with the job tool.

It speaks MCP 2026-07-28 (stateless: server/discover, _meta on every \
request) and 2025-11-25 (and older revisions with an initialize \
handshake), whichever the client speaks; docs/protocol.md says what each \
feature is under each. --stdio serves the one client that starts it; \
`serve --http` serves a team over Streamable HTTP, callers authenticated \
by bearer tokens or OAuth and each one's work kept apart (docs/http.md).

Without a configuration file it serves the host's bash, python3 and node \
(host mode), found as the shell finds them: through pyenv, asdf, mise and \
volta shims, a virtualenv or an nvm install first on PATH, whose directory \
is then bound read-only (never a home directory itself); an entry that \
cannot be served is passed over with a warning and the fix. With Nix it \
serves sandbox artifacts built by the flake.";

const AFTER_HELP: &str = "\
CONFIGURATION
    The configuration is read from --config PATH, else from
    $XDG_CONFIG_HOME/nix-sandbox-mcp/config.toml (~/.config/... when
    XDG_CONFIG_HOME is unset) when that file exists, else built-in defaults
    apply. config.example.toml in the source documents every key.

ENVIRONMENT
    PROJECT_DIR        Host directory mounted as the project (overrides [project] path).
                       Unset: the client's first file:// root (MCP roots under
                       2025-11-25, followed as they change), else the current
                       directory; never /, a system directory, a home directory,
                       a directory holding one, or one under a home's
                       dot-directories (~/.ssh, ~/.config). [projects.NAME] adds
                       projects a call may name (docs/project.md).
    PROJECT_MOUNT      Where the project appears in the sandbox (default /project).
    NIX_SANDBOX_DIR    Directories (colon-separated) of pre-built sandbox artifacts
                       (default: ~/.config/nix-sandbox-mcp/sandboxes).
    NIX_SANDBOX_ENVS   Comma-separated flake references built into artifacts at start-up.
    NIX_SANDBOX_LIMITS auto (default: cgroup v2, else v1, else rlimits) or rlimits
                       (never use cgroups).
    NIX_SANDBOX_NEST   off: sandboxes start without the nest, the user and pid
                       namespace of the server's own where their filesystems are
                       staged (then no project overlay: an overlay project is
                       read-only; and no bound on the number of files written).
    NIX_SANDBOX_OWN_ROOT
                       off: in the nest, bubblewrap starts with all of the
                       host's mounts instead of a root holding only what the
                       sandbox needs (the sandbox sees the same; setting it
                       up costs more the more mounts the host has).
    NIX_SANDBOX_STORE_VIEW
                       off: a Nix closure is bound into each sandbox path by
                       path, not through a store view (one mount per closure,
                       made once, bound in one piece); what each sandbox sees
                       is the same.
    NIX_SANDBOX_WARM_START
                       off: a sandbox kept ready for bash, python or node does
                       not hold its interpreter already started; the call
                       starts it (what the code sees is the same).
    NIX_SANDBOX_POOL   off: no sandbox is set up ahead of a call; each call
                       sets its own up (slower; for troubleshooting).
                       These five take on (the default) or off; any other
                       value, or a malformed value of any variable here,
                       stops the server with the variable named.
    NIX_SANDBOX_BUILTIN, NIX_SANDBOX_FLAKE
                       Set by the Nix package's wrapper: the artifacts baked
                       into the package, and its flake (which builds config
                       `flake` entries and the project's devShell).
    XDG_CACHE_HOME     Where environments' caches are kept (default ~/.cache;
                       /var/cache for root): nix-sandbox-mcp/caches/.
    XDG_STATE_HOME     Where the proxy's certificate authority is kept, for
                       hosts with credentials (default ~/.local/state; /var/lib
                       for root): nix-sandbox-mcp/ca/ (see `ca --help`).
    TMPDIR             Where the server keeps its runtime directory,
                       nix-sandbox-mcp-*, removed when it exits (default /tmp);
                       one left by a killed server is removed by the next.
    RUST_LOG           Log filter, e.g. debug or nix_sandbox_mcp=trace (logs go to stderr).
                       The MCP messages themselves (arguments and confirmation
                       tokens included) are logged only when it names rmcp, as
                       in debug,rmcp=debug.
    NIX_SANDBOX_BWRAP  The bubblewrap to use (else the first with every feature
                       the jail uses of: bwrap on PATH, beside this binary, in a
                       Nix profile such as ~/.nix-profile/bin, which needs no
                       root: `nix profile install nixpkgs#bubblewrap`); doctor
                       says which it uses and why.
    NIX_SANDBOX_MCP_COMMAND
                       The command client-config tells clients to run (the Nix
                       package's wrapper sets it to itself; default: this binary).
    DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR
                       How a non-root server reaches the user's systemd to get
                       a delegated cgroup (default $XDG_RUNTIME_DIR/bus, else
                       /run/user/UID/bus); doctor names the one it tried.
    DBUS_SYSTEM_BUS_ADDRESS
                       How a root server reaches the system's systemd (default
                       /run/dbus/system_bus_socket).

PROTOCOL LIMITS (--stdio)
    One JSON-RPC message per line, at most 16 MiB (newline included); a longer
    line is answered with error -32600 and skipped, never buffered. A line
    that is not JSON (or not UTF-8) gets -32700, a message of the wrong shape
    -32600, each with the request's id when it can be read. Code must be
    text: empty code, a NUL byte or invalid UTF-8 is an invalid_input error.
    What the server reads from a sandbox is bounded ([defaults] output_bytes
    and output_limit_mb; a session's reply channel 4 KiB a line, 1 MiB a call).
    Over HTTP a request's body is bounded the same (16 MiB, [http]
    max_body_bytes), and its head, time and connections as `serve --help` says.

EXIT STATUS
    run exits with the program's own status, or one that says what else
    ended it or kept it from running (the table in `run --help`).
    doctor exits 0 when every check passed (warnings allowed), 1 otherwise.
    Every command that prints stops quietly when its output is closed.

EXAMPLES
    nix-sandbox-mcp --stdio
    nix-sandbox-mcp serve --http 127.0.0.1:8765
    nix-sandbox-mcp client-config claude-code | sh
    nix-sandbox-mcp client-config vscode > .vscode/mcp.json
    nix-sandbox-mcp run --env python 'print(6 * 7)'
    echo 'ls /project' | nix-sandbox-mcp run --env bash -
    nix-sandbox-mcp envs
    nix-sandbox-mcp caches --clear
    nix-sandbox-mcp doctor";

/// `run --help`'s table of exit statuses (set out as written, where a doc
/// comment's lines would be joined).
const RUN_EXIT_STATUS: &str = "\
EXIT STATUS
    0-122   the program's own exit status
    2       also: nothing was run (no code, empty code, a NUL byte, not UTF-8)
    123     nothing was run: the server could not start (configuration,
            platform; the message says what to fix)
    124     the run's time limit ended it
    125     another limit ended it (memory, processes, CPU, output, file size)
    126     the sandbox could not be started (the message gives the fix)
    127     nothing was run: no such environment or artifact
    128+N   the program was killed by signal N
    130     interrupted (Ctrl-C): the sandbox was killed
    141     standard output was closed (a reader such as `head` went away)

A program that itself exits with 123 to 127 or 128+N cannot be told from
these; the message on stderr (prefixed `nix-sandbox-mcp:`) can.";

#[derive(Parser, Debug)]
#[command(name = "nix-sandbox-mcp", version, about = ABOUT, long_about = LONG_ABOUT, after_long_help = AFTER_HELP)]
// A later --config replaces an earlier one: the Nix package's wrapper passes
// its own, and the user's must win.
#[command(args_override_self = true)]
struct Cli {
    /// Serve MCP over standard input and output (what MCP clients launch)
    #[arg(long)]
    stdio: bool,

    /// Read the configuration from this TOML file
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    /// Log more to stderr: -v for debug, -vv for trace (RUST_LOG overrides)
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run code once in an environment's sandbox and stream its output
    ///
    /// The code comes from the CODE argument, from a file (-f), or from
    /// standard input (CODE is `-`); code that is empty or only whitespace is
    /// refused, as it is over MCP. Output streams to the terminal as it is
    /// produced.
    ///
    #[command(after_long_help = RUN_EXIT_STATUS)]
    Run {
        /// Environment to run in (see `envs`)
        #[arg(short, long, value_name = "NAME", required_unless_present = "artifact")]
        env: Option<String>,
        /// Run in the sandbox artifact in DIR instead of a configured environment
        #[arg(long, value_name = "DIR", conflicts_with = "env")]
        artifact: Option<PathBuf>,
        /// Read the code from FILE
        #[arg(
            short = 'f',
            long = "file",
            value_name = "FILE",
            conflicts_with = "code"
        )]
        file: Option<PathBuf>,
        /// The code to run, or `-` to read it from standard input
        #[arg(value_name = "CODE", required_unless_present = "file")]
        code: Option<String>,
    },
    /// List the environments (name, description, source, interpreter,
    /// limits) and the declared commands offered as tools
    ///
    /// Also says what enforces the limits (cgroup v2, cgroup v1 or
    /// rlimits) and, when it is not cgroup v2, why not and the step that
    /// would give it on this host (`cgroup_v2_missing` in --json).
    ///
    /// Exits 1, as `--stdio` would refuse to start, when a declared command
    /// is invalid (each problem named with its file, line and fix).
    Envs {
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// List, or clear, the caches environments keep for this project
    ///
    /// Environments keep the directories their `caches` setting names
    /// between calls and sessions, one set per project, each environment's
    /// within its `cache_mb`, under $XDG_CACHE_HOME/nix-sandbox-mcp/caches
    /// (/var/cache/nix-sandbox-mcp/caches for root). The project is the one
    /// `run` would mount (PROJECT_DIR, [project] path, or this directory).
    Caches {
        /// Remove this project's caches (all environments', or ENV's only)
        #[arg(long)]
        clear: bool,
        /// Only this environment's caches
        #[arg(value_name = "ENV")]
        env: Option<String>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Check that sandboxing works here and say how to fix what does not
    ///
    /// Checks, in order: the configuration, bubblewrap, a test sandbox and
    /// what it shows of itself (namespaces, identity, seccomp state,
    /// network, a read-only root, rlimits), what this binary's probe could
    /// not do in test sandboxes (calls the seccomp filter refuses, processes
    /// past a limit of 16, memory past a limit of 48 MiB), the nest, the
    /// limit mechanism (with the step to cgroup v2 when it is a fallback),
    /// the project directory, each environment (started
    /// once in its sandbox), the declared commands, and the README's first
    /// example (`run -e python 'print(6 * 7)'`). Each problem comes with a
    /// fix. Exits 1 when a check failed.
    Doctor {
        /// Print JSON for scripts: {"version": 1, "ok": BOOL, "checks":
        /// [{"name", "status": "ok"|"warn"|"fail", "detail", "fix"}]}
        #[arg(long)]
        json: bool,
    },
    /// Print the configuration that makes an MCP client start this server
    ///
    /// For claude-code, the `claude mcp add` command to run; for the others,
    /// the JSON or TOML to merge into the client's file (where it goes is
    /// printed on standard error). The command is this binary's own path and
    /// `--stdio`, with `--config` when one is given and PROJECT_DIR with
    /// --project-dir.
    ClientConfig {
        /// The MCP client
        #[arg(value_enum, required_unless_present = "all")]
        client: Option<crate::clients::Client>,
        /// Print every client's configuration, as Markdown
        #[arg(long, conflicts_with = "client")]
        all: bool,
        /// The server's name in the client's configuration
        #[arg(long, value_name = "NAME", default_value = crate::clients::DEFAULT_NAME)]
        name: String,
        /// Mount this directory as the project (sets PROJECT_DIR) instead of
        /// the directory the client starts the server in
        #[arg(long, value_name = "DIR", conflicts_with = "url")]
        project_dir: Option<PathBuf>,
        /// Reach a server that `serve --http` serves at URL (such as
        /// https://sandbox.example.com/mcp) instead of starting one: the
        /// client presents a bearer token, taken from an environment
        /// variable or a prompt where the client can, never written into the
        /// text (Zed's excepted: it expands nothing)
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// The environment variable that holds the token (with --url)
        #[arg(long, value_name = "VAR", requires = "url", default_value = crate::clients::remote::DEFAULT_TOKEN_VAR)]
        token_var: String,
    },
    /// Serve MCP over Streamable HTTP, for a team, remote agents and CI
    ///
    /// One endpoint, /mcp, speaking MCP 2026-07-28 (stateless POSTs,
    /// subscriptions/listen streams) and 2025-11-25 (Mcp-Session-Id, SSE).
    /// Callers authenticate with a bearer token of [http] tokens_file (see
    /// `token add`) or an OAuth access token of [http.oauth]'s issuer; each
    /// principal's sessions, jobs, tasks and confirmations are its own, and
    /// each has a share of the server ([http.per_principal]). An address
    /// other than a loopback one is refused unless credentials are
    /// required. Host and Origin are checked against the loopback names and
    /// [http] allowed_hosts and allowed_origins (DNS rebinding). A call names
    /// a configured project ([projects.NAME]), never a path; the client's
    /// roots are not followed. SIGHUP reads the tokens file again; SIGINT or
    /// SIGTERM stop the server: new requests are refused, calls in flight
    /// have --grace-seconds to end, then their runs are killed.
    ///
    /// Prints `nix-sandbox-mcp: listening on URL` on standard error once it
    /// listens (with port 0, the port it was given). Also served:
    /// /healthz and /readyz (a balancer's probes, no credentials), /metrics
    /// (Prometheus' text format, with credentials where the server needs
    /// them). Behind a load balancer each replica names itself in the
    /// handles of its sessions and tasks (--replica or [http] replica);
    /// deploy/haproxy/haproxy.cfg routes by them. docs/http.md has the rest:
    /// TLS or a reverse proxy, OAuth, scopes, limits, replicas;
    /// docs/scaling.md: systemd units, shared builds, Kubernetes.
    #[command(after_long_help = SERVE_EXAMPLES)]
    Serve {
        /// Where to listen: HOST:PORT (127.0.0.1:8765, [::1]:8765,
        /// localhost:8765, 0.0.0.0:8765), unix:PATH (a socket only its
        /// owner may use), or systemd: the one socket a systemd socket unit
        /// passes (socket activation; LISTEN_FDS)
        #[arg(long, value_name = "ADDR")]
        http: http::Listen,
        /// Serve TLS with this PEM certificate chain (with --tls-key)
        #[arg(long, value_name = "PEM", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The PEM private key of --tls-cert
        #[arg(long, value_name = "PEM", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Time calls in flight have to end when the server is told to stop,
        /// before their runs are killed
        #[arg(long, value_name = "SECONDS", default_value_t = 10)]
        grace_seconds: u64,
        /// This server's name among replicas behind one load balancer (1 to
        /// 16 lower-case letters and digits), instead of [http] replica:
        /// for instances of one service that share a configuration file
        #[arg(long, value_name = "NAME", value_parser = replica_name)]
        replica: Option<String>,
    },
    /// Manage the bearer tokens of `serve --http`
    #[command(subcommand)]
    Token(TokenCommand),
    /// Show or replace the proxy's certificate authority
    ///
    /// For hosts with credentials or request rules ([environments.NAME.network]
    /// credentials and requests), the proxy ends the sandbox's TLS with
    /// certificates of an authority of its own, which may vouch only for the
    /// hosts the configuration names (a name constraint). It is kept in $XDG_STATE_HOME/nix-sandbox-mcp/ca (~/.local/state/...;
    /// /var/lib/nix-sandbox-mcp/ca for root), its key readable by the
    /// server's user alone, and made at start when missing, when the
    /// configuration names a host it does not cover, or 30 days before it
    /// expires. docs/credentials.md has the rest.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Print the JSON schema of the configuration file
    ///
    /// Editors and TOML tools can check a config.toml against it as it is
    /// written (for example taplo, with `#:schema ./config-schema.json` on
    /// the file's first line).
    Schema,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Make a token for principal NAME and append its line to the tokens file
    ///
    /// Prints the token once, on standard output; the file keeps only its
    /// SHA-256 (`NAME sha256:HEX`). The file is created with mode 0600 when
    /// missing, and must not be writable by others. A running server reads
    /// it again on SIGHUP. To revoke a token, delete its line and send
    /// SIGHUP.
    Add {
        /// The principal's name: 1 to 64 letters, digits, '.', '_', '-', '@'
        #[arg(value_name = "NAME")]
        name: String,
        /// The tokens file (default: [http] tokens_file of the configuration)
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum CaCommand {
    /// Print where the authority is, whom it may vouch for and until when
    Show,
    /// Make a new authority for the hosts the configuration names
    ///
    /// The old key is replaced at once; servers running with it keep using
    /// it until they restart, and sandboxes trust the new one from their
    /// next start.
    Rotate,
}

const SERVE_EXAMPLES: &str = "\
EXAMPLES
    nix-sandbox-mcp token add alice --file /etc/nix-sandbox-mcp/tokens
    nix-sandbox-mcp serve --http 127.0.0.1:8765
    nix-sandbox-mcp serve --http 0.0.0.0:8443 --tls-cert cert.pem --tls-key key.pem
    nix-sandbox-mcp serve --http unix:/run/nix-sandbox-mcp/mcp.sock
    nix-sandbox-mcp serve --http systemd --replica r1    # from a socket unit
    claude mcp add --transport http sandbox https://sandbox.example.com:8443/mcp \\
        --header \"Authorization: Bearer $TOKEN\"";

/// Memory freed at the top of a heap stays with the process up to 4 MiB a
/// heap, where glibc's default gives back anything past 128 KiB. The
/// proxy's buffers for a large body come and go by the hundred kilobytes;
/// given back each time, every new one faults its pages in again (a fifth
/// of the proxy's time on a 100 MiB download through an intercepted host).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets one of the allocator's parameters under the
    // allocator's own lock; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}

pub fn main() -> ExitCode {
    // The nest's holder (see exec::nest), started by the daemon from this
    // binary; not for users, so not in --help.
    let mut args = std::env::args_os().skip(1);
    match args.next().as_deref().and_then(|a| a.to_str()) {
        Some(holder::HOLDER) => {
            return holder::holder_main(args.next().as_deref().and_then(|a| a.to_str()));
        }
        // A store view's helper (see exec::nest::view).
        Some(crate::exec::nest::view::VIEWER) => {
            let arg = |a: Option<std::ffi::OsString>| a.and_then(|a| a.into_string().ok());
            let (ns, dir) = (arg(args.next()), arg(args.next()));
            return crate::exec::nest::view::viewer_main(ns.as_deref(), dir.as_deref());
        }
        // doctor's probe, run by doctor inside a test sandbox.
        Some(crate::doctor::probe::PROBE) => return crate::doctor::probe::probe_main(args),
        _ => {}
    }
    let cli = Cli::parse();
    let running = matches!(cli.command, Some(Command::Run { .. }));
    let serving = cli.stdio || matches!(cli.command, Some(Command::Serve { .. }));
    init_logging(cli.verbose, serving, running);
    // Processes a sandbox leaves behind come back to us, not to PID 1
    // (which in a container may never reap them).
    if let Err(e) = crate::exec::process::become_subreaper() {
        tracing::warn!("cannot become the reaper of orphaned sandbox processes: {e}");
    }
    keep_freed_memory();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nix-sandbox-mcp: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(dispatch(cli));
    // Runs killed at shutdown may still be settling; don't wait for blocked readers.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    // A thread the runtime does not wait for (one preparing a sandbox the
    // start-up no longer wants, say) may still be removing the groups.
    crate::limits::remove_every_group();
    result
}

/// What the log shows of rmcp unless RUST_LOG names it: it logs every
/// message with its arguments at info and below, confirmation tokens
/// included, and those are never logged unless asked for by name.
const RMCP_QUIET: &str = "rmcp=warn";

fn init_logging(verbose: u8, serving: bool, running: bool) {
    // `run` reports the registry's warnings about its own environment only
    // (see run_once).
    let default = match verbose {
        0 if serving => "info",
        0 if running => "warn,nix_sandbox_mcp::registry=error",
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let asked = std::env::var("RUST_LOG").ok();
    let directives = match asked.as_deref() {
        Some(asked) if asked.contains("rmcp") => asked.to_string(),
        Some(asked) => format!("{asked},{RMCP_QUIET}"),
        None => format!("{default},{RMCP_QUIET}"),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},{RMCP_QUIET}")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

async fn dispatch(cli: Cli) -> ExitCode {
    let opts = StartOptions {
        config: cli.config.clone(),
        load_environments: true,
        quick: false,
        prestart: false,
        in_background: false,
    };
    match cli.command {
        None if cli.stdio => {
            serve::serve_stdio(&StartOptions {
                prestart: true,
                in_background: true,
                ..opts
            })
            .await
        }
        Some(_) if cli.stdio => {
            eprintln!("nix-sandbox-mcp: --stdio serves MCP and takes no command");
            ExitCode::from(2)
        }
        None => {
            eprintln!(
                "nix-sandbox-mcp: nothing to do. Use --stdio to serve MCP, or one of the commands run, envs, caches, doctor, client-config, schema (see --help)."
            );
            ExitCode::from(2)
        }
        Some(Command::Run {
            env,
            artifact,
            file,
            code,
        }) => run::run_once(&opts, env, artifact, file, code).await,
        Some(Command::Serve {
            http,
            tls_cert,
            tls_key,
            grace_seconds,
            replica,
        }) => {
            let (address, socket) = match http {
                http::Listen::At(address) => (address, None),
                http::Listen::Systemd => match http::activation::take() {
                    Ok(inherited) => (inherited.address, Some(inherited.socket)),
                    Err(e) => {
                        eprintln!("nix-sandbox-mcp: {e}");
                        return ExitCode::from(2);
                    }
                },
            };
            let options = http::HttpOptions {
                address,
                socket,
                tls: tls_cert.zip(tls_key),
                grace: std::time::Duration::from_secs(grace_seconds),
                replica,
            };
            serve::serve_http(
                &StartOptions {
                    prestart: true,
                    in_background: true,
                    ..opts
                },
                options,
            )
            .await
        }
        Some(Command::Token(TokenCommand::Add { name, file })) => {
            token_add(cli.config.as_deref(), &name, file)
        }
        Some(Command::Ca(command)) => ca::ca(cli.config.as_deref(), command),
        Some(Command::Envs { json }) => envs::list_envs(&opts, json).await,
        Some(Command::Caches { clear, env, json }) => {
            caches::caches(cli.config.as_deref(), clear, env.as_deref(), json)
        }
        Some(Command::Doctor { json }) => doctor(&opts, json).await,
        // Without a client, clap has made sure --all was given.
        Some(Command::ClientConfig {
            client,
            name,
            url: Some(url),
            token_var,
            ..
        }) => remote_client_config(client, &name, url, token_var),
        Some(Command::ClientConfig {
            client,
            name,
            project_dir,
            ..
        }) => client_config(cli.config, client, &name, project_dir),
        Some(Command::Schema) => {
            let schema = crate::config::json_schema();
            let mut out = Out::default();
            out.print(&(serde_json::to_string_pretty(&schema).unwrap_or_default() + "\n"));
            out.finish(ExitCode::SUCCESS)
        }
    }
}

/// `token add`: a new token for `name`, printed once.
fn replica_name(name: &str) -> Result<String, String> {
    crate::server::check_replica(name).map(|()| name.to_string())
}

fn token_add(config: Option<&std::path::Path>, name: &str, file: Option<PathBuf>) -> ExitCode {
    let path = match file {
        Some(f) => f,
        None => match crate::config::load(config) {
            Ok(c) => match c.http.tokens_path() {
                Some(p) => p,
                None => {
                    return fail(
                        "no tokens file: pass --file FILE, or set [http] tokens_file in the configuration",
                    );
                }
            },
            Err(e) => return fail(e),
        },
    };
    let mut out = Out::default();
    let shown = |token: &str| {
        out.print(&format!("{token}\n"));
        !out.closed
    };
    match http::tokens::add(&path, name, shown) {
        Ok(true) => {
            eprintln!(
                "nix-sandbox-mcp: added {name} to {}; the token above is shown only now (a running server reads the file on SIGHUP)",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Ok(false) => fail("the token could not be printed, so it was not added"),
        Err(e) => fail(e),
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("nix-sandbox-mcp: {e}");
    ExitCode::from(1)
}

/// Standard output of the commands that print. A reader that goes away
/// early (`envs | head`) is not an error: printing stops quietly, as it
/// would in a Unix filter, and the command ends normally.
#[derive(Default)]
struct Out {
    closed: bool,
    failed: bool,
}

impl Out {
    fn print(&mut self, text: &str) {
        if self.closed {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout
            .write_all(text.as_bytes())
            .and_then(|_| stdout.flush())
        {
            self.closed = true;
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                self.failed = true;
                eprintln!("nix-sandbox-mcp: cannot write to standard output: {e}");
            }
        }
    }

    /// `code`, unless writing failed for a reason other than a closed pipe.
    fn finish(&self, code: ExitCode) -> ExitCode {
        if self.failed { ExitCode::from(1) } else { code }
    }
}

/// The command clients run: the Nix package's wrapper names itself in
/// NIX_SANDBOX_MCP_COMMAND (its variables and flags must not be skipped);
/// otherwise this binary.
fn own_command() -> Result<PathBuf, String> {
    let knobs = crate::config::Knobs::from_env().map_err(|e| e.to_string())?;
    match knobs.client_command {
        Some(wrapper) => Ok(wrapper),
        None => std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(|e| format!("cannot tell where this binary is: {e}")),
    }
}

/// `client-config --url`: the forms that reach a server over HTTP.
fn remote_client_config(
    client: Option<crate::clients::Client>,
    name: &str,
    url: String,
    token_var: String,
) -> ExitCode {
    use crate::clients::{self, remote};
    if !clients::is_valid_name(name) {
        eprintln!(
            "nix-sandbox-mcp: --name {name:?}: use letters, digits, '-' and '_' (at most 64)"
        );
        return ExitCode::from(2);
    }
    if let Err(e) = crate::config::http::check_url(&url) {
        eprintln!("nix-sandbox-mcp: --url: {e}");
        return ExitCode::from(2);
    }
    let var_ok = !token_var.is_empty()
        && !token_var.starts_with(|c: char| c.is_ascii_digit())
        && token_var
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !var_ok {
        eprintln!(
            "nix-sandbox-mcp: --token-var {token_var:?}: a variable's name is letters, digits and '_'"
        );
        return ExitCode::from(2);
    }
    let r = remote::Remote {
        name: name.to_string(),
        url,
        token_var,
    };
    let mut out = Out::default();
    match client {
        Some(c) => match c.render_remote(&r) {
            Some(text) => {
                out.print(&text);
                eprintln!("nix-sandbox-mcp: {}", c.remote_destination(&r));
            }
            None => return fail(c.remote_destination(&r)),
        },
        None => out.print(&remote::markdown(&r)),
    }
    out.finish(ExitCode::SUCCESS)
}

fn client_config(
    config: Option<PathBuf>,
    client: Option<crate::clients::Client>,
    name: &str,
    project_dir: Option<PathBuf>,
) -> ExitCode {
    use crate::clients::{self, Launch};
    if !clients::is_valid_name(name) {
        eprintln!(
            "nix-sandbox-mcp: --name {name:?}: use letters, digits, '-' and '_' (at most 64)"
        );
        return ExitCode::from(2);
    }
    let command = match own_command() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // The client starts elsewhere: paths become absolute, and a broken
    // configuration is reported now rather than by the client.
    let config = match config.map(|c| std::fs::canonicalize(&c).map_err(|e| (c, e))) {
        Some(Err((c, e))) => return fail(format!("--config {}: {e}", c.display())),
        Some(Ok(c)) => {
            if let Err(e) = crate::config::load(Some(&c)) {
                return fail(e);
            }
            Some(c)
        }
        None => None,
    };
    let project_dir = match project_dir.map(|d| (std::fs::canonicalize(&d), d)) {
        Some((Ok(real), _)) if real.is_dir() => Some(real),
        Some((_, d)) => {
            return fail(format!("--project-dir {}: not a directory", d.display()));
        }
        None => None,
    };
    let launch = Launch::new(name, command, config, project_dir);
    let mut out = Out::default();
    match client {
        Some(c) => {
            out.print(&c.render(&launch));
            eprintln!("nix-sandbox-mcp: {}", c.destination());
        }
        None => out.print(&clients::markdown(&launch)),
    }
    out.finish(ExitCode::SUCCESS)
}

async fn doctor(opts: &StartOptions, json: bool) -> ExitCode {
    let mut out = Out::default();
    let findings = crate::doctor::run(opts, |f| {
        if !json {
            out.print(&f.to_text());
        }
    })
    .await;
    if json {
        let v = crate::doctor::to_json(&findings);
        out.print(&(serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"));
    } else {
        out.print(&crate::doctor::summary(&findings));
    }
    let status = match crate::doctor::failures(&findings) {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    };
    out.finish(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_states_the_real_protocol_limits() {
        let max = crate::server::framing::MAX_MESSAGE_BYTES >> 20;
        assert!(AFTER_HELP.contains(&format!("at most {max} MiB")));
        let reply = crate::exec::supervise::REPLY_LINE_CAP >> 10;
        let call = crate::exec::supervise::REPLY_CALL_CAP >> 20;
        assert!(AFTER_HELP.contains(&format!("{reply} KiB a line, {call} MiB a call")));
    }
}
