//! The sandbox as a user sees it, with real bubblewrap and the host's
//! interpreters: results, isolation claims tried by breaking them, timeouts
//! that leave nothing behind, bounded output.

mod common;

use nix_sandbox_mcp::network::{NetworkSetting, Policy};

use std::io::Read;
use std::net::{IpAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use common::{env, env_with, fixture, left_after, marker, note, processes_with, run};
use nix_sandbox_mcp::exec::LimitKind;

#[tokio::test]
async fn python_bash_and_node_run() {
    let o = run(
        &env("python"),
        "import sys\nprint('py', sys.version_info[0])",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.stdout.text, "py 3\n");
    let o = run(&env("bash"), "echo sh $((6 * 7))").await;
    assert_eq!(o.stdout.text, "sh 42\n");
    let o = run(&env("node"), "console.log('js', [1,2,3].length)").await;
    assert_eq!(o.stdout.text, "js 3\n", "{o:?}");
}

#[tokio::test]
async fn exit_codes_and_stderr_are_reported() {
    let o = run(&env("bash"), "echo out; echo err >&2; exit 3").await;
    assert_eq!(o.exit_code, Some(3));
    assert_eq!(o.stdout.text, "out\n");
    assert_eq!(o.stderr.text, "err\n");
    assert!(!o.succeeded());
    let o = run(&env("python"), "raise SystemExit('boom')").await;
    assert_eq!(o.exit_code, Some(1));
    assert!(o.stderr.text.contains("boom"));
    let o = run(&env("bash"), "kill -SEGV $$").await;
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{o:?}");
}

#[tokio::test]
async fn the_program_starts_with_no_signal_blocked_or_ignored() {
    // The daemon ignores SIGPIPE and blocks signals while it starts a
    // sandbox; the program starts as a fresh process would.
    let o = run(&env("bash"), "grep -E '^Sig(Blk|Ign)' /proc/self/status").await;
    let masks: Vec<&str> = o.stdout.text.lines().collect();
    assert_eq!(masks.len(), 2, "{o:?}");
    for line in masks {
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
}

#[tokio::test]
async fn dev_holds_the_usual_nodes_a_new_pty_and_a_writable_shm_and_nothing_else_writable() {
    let code = "import os, pty\n\
        print(sorted(os.listdir('/dev')))\n\
        m, s = pty.openpty()\n\
        print(os.ttyname(s), sorted(os.listdir('/dev/pts')))\n\
        open('/dev/shm/x', 'w').write('y')\n\
        print(open('/dev/null').read() == '', len(open('/dev/urandom', 'rb').read(4)))\n\
        print(os.readlink('/dev/fd'), os.readlink('/dev/ptmx'), os.readlink('/dev/stdin'))\n\
        try:\n    open('/dev/x', 'w')\nexcept OSError as e:\n    print(e.errno)\n";
    let o = run(&env("python"), code).await;
    let lines: Vec<&str> = o.stdout.text.lines().collect();
    assert_eq!(
        lines,
        [
            "['core', 'fd', 'full', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'tty', 'urandom', 'zero']",
            "/dev/pts/0 ['0', 'ptmx']",
            "True 4",
            "/proc/self/fd pts/ptmx /proc/self/fd/0",
            "30",
        ],
        "{o:?}"
    );
}

#[tokio::test]
async fn identity_is_unprivileged_with_no_capabilities() {
    let o = run(
        &env("bash"),
        "id -u; id -un; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; hostname",
    )
    .await;
    let lines: Vec<&str> = o.stdout.text.lines().collect();
    assert_eq!(lines[0], "1000");
    assert_eq!(lines[1], "sandbox");
    for l in &lines[2..5] {
        assert!(l.ends_with("0000000000000000"), "capabilities left: {l}");
    }
    assert_eq!(lines[5], "sandbox");
}

#[tokio::test]
async fn environment_is_minimal_and_secrets_are_absent() {
    let code = "env | sort; echo ---; ls /root /home 2>&1; cat /etc/shadow 2>&1; ls ~/.ssh 2>&1; cat /proc/1/environ | tr '\\0' '\\n' | grep -c . ";
    let o = run(&env("bash"), code).await;
    let (vars, rest) = o.stdout.text.split_once("---\n").unwrap();
    let names: Vec<&str> = vars.lines().map(|l| l.split('=').next().unwrap()).collect();
    for expected in ["HOME", "LANG", "PATH", "TERM", "TMPDIR"] {
        assert!(names.contains(&expected), "{expected} missing: {vars}");
    }
    for l in vars.lines() {
        assert!(
            !l.contains("CARGO") && !l.contains("RUST") && !l.starts_with("USER="),
            "leaked: {l}"
        );
    }
    assert!(vars.contains("HOME=/workspace\n") && vars.contains("TERM=dumb\n"));
    assert!(
        rest.contains("'/root': No such file") && rest.contains("'/home': No such file"),
        "{rest}"
    );
    assert!(rest.contains("/etc/shadow: No such file"), "{rest}");
    // the sandbox's pid 1 carries no environment either
    assert!(rest.trim_end().ends_with("\n0"), "{rest}");
}

#[tokio::test]
async fn project_is_readable_but_not_writable_even_through_symlinks() {
    let code = r#"
cat /project/README.md
touch /project/new 2>&1 || echo "write refused"
echo x >> /project/README.md 2>&1 || echo "append refused"
rm /project/README.md 2>&1 || echo "delete refused"
echo x > /project/outside-link 2>&1 || echo "symlink write refused"
cat /project/outside-link 2>&1 || echo "outside not visible"
ls /project/etc-link/ | head -3
"#;
    let o = run(&env("bash"), code).await;
    let out = &o.stdout.text;
    assert!(out.starts_with("hello from the project\n"), "{out}");
    for s in [
        "write refused",
        "append refused",
        "delete refused",
        "symlink write refused",
        "outside not visible",
    ] {
        assert!(out.contains(s), "{s}: {out}\n{}", o.stderr.text);
    }
    let f = fixture();
    assert_eq!(
        std::fs::read_to_string(f.project.join("README.md")).unwrap(),
        "hello from the project\n"
    );
    assert!(!f.project.join("new").exists());
    assert_eq!(
        std::fs::read_to_string(f.project.join("outside-link")).unwrap(),
        "outside\n"
    );
}

/// A TCP listener and a UDP socket on each of this machine's own addresses
/// (loopback and every interface): what a sandbox with a network would reach.
/// Tests aim at nothing else.
struct HostListeners {
    token: String,
    targets: Vec<(IpAddr, TcpListener, UdpSocket)>,
}

impl HostListeners {
    fn new() -> HostListeners {
        let targets = local_addresses()
            .into_iter()
            .map(|ip| {
                let tcp = TcpListener::bind((ip, 0)).unwrap();
                let udp = UdpSocket::bind((ip, 0)).unwrap();
                tcp.set_nonblocking(true).unwrap();
                udp.set_nonblocking(true).unwrap();
                (ip, tcp, udp)
            })
            .collect();
        HostListeners {
            token: format!("nsm-probe-{}", marker()),
            targets,
        }
    }

    /// Python that connects to every listener and sends the token over TCP
    /// and UDP, printing `tcp <address> connected` or `tcp <address> failed <errno>`.
    fn probe(&self) -> String {
        let targets: Vec<String> = self
            .targets
            .iter()
            .map(|(ip, tcp, udp)| {
                let family = if ip.is_ipv4() { "AF_INET" } else { "AF_INET6" };
                format!(
                    "(socket.{family}, {:?}, {}, {})",
                    ip.to_string(),
                    tcp.local_addr().unwrap().port(),
                    udp.local_addr().unwrap().port()
                )
            })
            .collect();
        format!(
            r#"
import socket
token = b"{token}"
for family, host, tcp, udp in [{targets}]:
    c = socket.socket(family, socket.SOCK_STREAM)
    c.settimeout(3)
    try:
        c.connect((host, tcp)); c.sendall(token); print("tcp", host, "connected")
    except OSError as e:
        print("tcp", host, "failed", e.errno)
    c.close()
    u = socket.socket(family, socket.SOCK_DGRAM)
    try:
        u.sendto(token, (host, udp)); print("udp", host, "sent")
    except OSError as e:
        print("udp", host, "failed", e.errno)
"#,
            token = self.token,
            targets = targets.join(", ")
        )
    }

    /// Every connection and datagram the listeners got, as `tcp <address>
    /// <what was sent>` and `udp <address> <what was sent>`, sorted.
    fn reached(&self) -> Vec<String> {
        let mut seen = Vec::new();
        for (ip, tcp, udp) in &self.targets {
            while let Ok((mut conn, _)) = tcp.accept() {
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut data = Vec::new();
                let _ = conn.read_to_end(&mut data);
                seen.push(format!("tcp {ip} {}", String::from_utf8_lossy(&data)));
            }
            let mut buf = [0u8; 512];
            while let Ok((n, _)) = udp.recv_from(&mut buf) {
                seen.push(format!("udp {ip} {}", String::from_utf8_lossy(&buf[..n])));
            }
        }
        seen.sort();
        seen
    }
}

/// This machine's own addresses, from the kernel's tables: IPv4 from
/// /proc/net/fib_trie (`/32 host LOCAL` entries), IPv6 from /proc/net/if_inet6
/// (global and host scope, usable ones only; a link-local address needs an
/// interface to aim at).
fn local_addresses() -> Vec<IpAddr> {
    let mut found: Vec<IpAddr> = Vec::new();
    let trie = std::fs::read_to_string("/proc/net/fib_trie").unwrap();
    let mut last: Option<IpAddr> = None;
    for line in trie.lines().map(str::trim) {
        if let Some(a) = line.strip_prefix("|-- ") {
            last = a.parse().ok();
        } else if line == "/32 host LOCAL"
            && let Some(ip) = last
            && !found.contains(&ip)
        {
            found.push(ip);
        }
    }
    for line in std::fs::read_to_string("/proc/net/if_inet6")
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(hex), Some(scope), Some(flags)) = (f.first(), f.get(3), f.get(4)) else {
            continue;
        };
        let scope = u8::from_str_radix(scope, 16).unwrap_or(0xff);
        let flags = u8::from_str_radix(flags, 16).unwrap_or(0xff);
        // 0x00 global, 0x10 host; flags 0x40 tentative, 0x08 failed duplicate detection.
        if (scope == 0x00 || scope == 0x10)
            && flags & 0x48 == 0
            && let Ok(bits) = u128::from_str_radix(hex, 16)
        {
            found.push(IpAddr::V6(bits.into()));
        }
    }
    assert!(
        found.contains(&IpAddr::from([127, 0, 0, 1])),
        "no loopback in {found:?}"
    );
    if found.iter().all(|ip| ip.is_loopback()) {
        note("this machine has no address besides loopback; only loopback is probed");
    }
    found
}

#[tokio::test]
async fn network_is_unreachable_including_host_loopback() {
    let closed = HostListeners::new();
    let o = run(&env("python"), &closed.probe()).await;
    assert!(o.succeeded(), "{o:?}");
    let tcp: Vec<&str> = o
        .stdout
        .text
        .lines()
        .filter(|l| l.starts_with("tcp "))
        .collect();
    assert_eq!(tcp.len(), closed.targets.len(), "{o:?}");
    for line in tcp {
        assert!(line.contains(" failed "), "{line}\n{}", o.stdout.text);
    }
    assert_eq!(
        closed.reached(),
        Vec::<String>::new(),
        "the host saw traffic"
    );

    // An environment with network has no route out either: only the
    // daemon's proxy, which it reaches on its own loopback.
    let proxied = HostListeners::new();
    let o = run(
        &env_with("python", |e| {
            e.network = NetworkSetting::Proxied(Policy::any_public());
        }),
        &proxied.probe(),
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert!(
        o.stdout
            .text
            .lines()
            .filter(|l| l.starts_with("tcp "))
            .all(|l| l.contains(" failed ")),
        "{o:?}"
    );
    assert_eq!(proxied.reached(), Vec::<String>::new());

    // The control: the same probe run on the host itself reaches every
    // listener, so the probe can tell an open network from a closed one.
    let open = HostListeners::new();
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(open.probe())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !text.contains("failed"), "{text}");
    let mut expected: Vec<String> = open
        .targets
        .iter()
        .flat_map(|(ip, _, _)| ["tcp", "udp"].map(|p| format!("{p} {ip} {}", open.token)))
        .collect();
    expected.sort();
    assert_eq!(open.reached(), expected);
}

#[tokio::test]
async fn timeout_kills_daemons_and_sigterm_ignorers_leaving_nothing() {
    let m = marker();
    let e = env_with("bash", |e| e.limits.timeout = Duration::from_millis(1500));
    let code = format!(
        "trap '' TERM\nsetsid sleep {m}.1 &\n( ( sleep {m}.2 & ) & )\nnohup sleep {m}.3 >/dev/null 2>&1 &\necho started\nwhile :; do :; done\n"
    );
    let t = Instant::now();
    let o = run(&e, &code).await;
    assert!(o.timed_out && o.limit == Some(LimitKind::Timeout), "{o:?}");
    assert_eq!(o.stdout.text, "started\n");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        processes_with(&m).is_empty(),
        "left behind: {:?}",
        processes_with(&m)
    );
}

#[tokio::test]
async fn background_processes_die_when_the_program_exits() {
    let m = marker();
    let o = run(
        &env("bash"),
        &format!("setsid sleep {m}.5 & disown; echo done"),
    )
    .await;
    assert!(o.succeeded());
    let left = left_after(&m, 5).await;
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn no_process_of_a_run_is_left_once_its_result_is_in() {
    let m = marker();
    // Detached from the run's output too, so that nothing else waits for it.
    let o = run(
        &env("bash"),
        &format!("setsid sleep {m}.5 </dev/null >/dev/null 2>&1 & disown; echo done"),
    )
    .await;
    assert!(o.succeeded());
    assert_eq!(processes_with(&m), Vec::<String>::new());
}

#[tokio::test]
async fn output_flood_keeps_head_and_tail_with_bounded_memory() {
    fn rss_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    }
    let before = rss_kib();
    let code = "import sys\nsys.stdout.write('FIRST\\n')\nchunk = 'x' * 65535 + '\\n'\nfor _ in range(3000): sys.stdout.write(chunk)\nsys.stdout.write('LAST\\n')\n";
    let o = run(&env("python"), code).await;
    assert!(o.succeeded(), "{:?}", o.stderr);
    let kept = env("python").limits.output_bytes as u64;
    assert!(o.stdout.text.starts_with("FIRST\n"));
    assert!(o.stdout.text.ends_with("LAST\n"));
    assert!(o.stdout.total_bytes > 196_000_000);
    assert_eq!(o.stdout.dropped_bytes, o.stdout.total_bytes - kept);
    assert!(o.stdout.text.contains(&format!(
        "[... {} bytes omitted ...]",
        o.stdout.dropped_bytes
    )));
    let grown = rss_kib().saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "daemon memory grew by {grown} KiB while reading 196 MB"
    );
}

#[tokio::test]
async fn ten_megabytes_of_code_run() {
    let mut code = String::from("x = 0\n");
    while code.len() < 10 * 1024 * 1024 {
        code.push_str(
            "x += 1  # padding padding padding padding padding padding padding padding\n",
        );
    }
    code.push_str("print(x)\n");
    let o = run(&env("python"), &code).await;
    assert!(o.succeeded(), "{:?}", o.stderr);
    assert!(o.stdout.text.trim().parse::<u64>().unwrap() > 100_000);
}

#[tokio::test]
async fn non_utf8_output_is_lossy_not_an_error() {
    let o = run(&env("bash"), "printf 'ok \\xff\\xfe end\\n'").await;
    assert!(o.succeeded());
    assert_eq!(o.stdout.text, "ok \u{fffd}\u{fffd} end\n");
}

#[tokio::test]
async fn stdin_is_empty_and_workspace_is_fresh_each_run() {
    let o = run(
        &env("bash"),
        "read line; echo \"read=$?\"; pwd; touch /workspace/mark; ls -A /workspace",
    )
    .await;
    assert_eq!(o.stdout.text, "read=1\n/workspace\n.main.sh\nmark\n");
    let o = run(
        &env("bash"),
        "ls -A /workspace; test -e /workspace/mark && echo SURVIVED || true",
    )
    .await;
    assert_eq!(o.stdout.text, ".main.sh\n");
}

#[tokio::test]
async fn code_is_never_on_the_command_line() {
    let o = run(&env("bash"), "# secret-marker-in-code\ncat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'secret-mar[k]er-in-code' || true").await;
    assert_eq!(o.stdout.text.trim(), "0", "{o:?}");
}

#[tokio::test]
async fn concurrent_runs_are_independent() {
    let runs = (0..6).map(|i| async move {
        let o = run(
            &env("bash"),
            &format!("echo {i} > /workspace/f; sleep 0.2; cat /workspace/f"),
        )
        .await;
        (i, o)
    });
    for (i, o) in futures::future::join_all(runs).await {
        assert_eq!(o.stdout.text, format!("{i}\n"));
    }
}

#[tokio::test]
async fn a_sandbox_that_cannot_be_set_up_is_not_blamed_on_the_program() {
    use nix_sandbox_mcp::exec::{ExecError, Request};
    use nix_sandbox_mcp::jail::ProjectMount;
    let gone = ProjectMount {
        host_path: "/nonexistent/project".into(),
        mount_point: "/project".into(),
        access: nix_sandbox_mcp::jail::ProjectAccess::ReadOnly,
        overlay: false,
        downgraded: false,
        protected: Vec::new(),
    };
    let r = fixture()
        .app
        .executor
        .run(Request {
            env: &env("bash"),
            code: b"echo never",
            project: Some(&gone),
            inherited: &[],
            cancel: tokio_util::sync::CancellationToken::new(),
            observer: None,
            share: None,
        })
        .await;
    match r {
        Err(ExecError::Setup { message: msg, .. }) => {
            assert!(msg.contains("/nonexistent/project"), "{msg}")
        }
        other => panic!("expected a setup error, got {other:?}"),
    }
}

#[tokio::test]
async fn descriptors_the_daemon_inherited_do_not_reach_the_sandbox() {
    use std::os::fd::{AsFd, AsRawFd};
    let file = std::fs::File::open("/etc/hostname").unwrap();
    // `dup` drops close-on-exec, like a descriptor an MCP client leaves open.
    let inherited = rustix::io::dup(file.as_fd()).unwrap();
    let o = run(&env("bash"), "ls /proc/self/fd | sort -n | tr '\\n' ' '").await;
    assert_eq!(
        o.stdout.text,
        "0 1 2 3 ",
        "descriptor {} leaked: {o:?}",
        inherited.as_raw_fd()
    );
}
