//! Hostile and broken code against the limits and the syscall filter, with
//! real bubblewrap: each case must be contained, attributed to the right limit,
//! and leave the executor serving normally.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{env, env_with, fixture, marker, processes_with, run};
use nix_sandbox_mcp::app;
use nix_sandbox_mcp::config::{Config, Positive};
use nix_sandbox_mcp::exec::{ExecError, LimitKind, Request};
use nix_sandbox_mcp::limits::Mechanism;
use tokio_util::sync::CancellationToken;

fn cgroups() -> bool {
    fixture().app.executor.enforcer().mechanism() != Mechanism::Rlimits
}

#[tokio::test]
async fn memory_bomb_is_killed_and_reported() {
    let e = env_with("python", |e| e.limits.memory_bytes = 96 << 20);
    let o = run(
        &e,
        "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n",
    )
    .await;
    assert!(!o.succeeded());
    if cgroups() {
        assert_eq!(o.limit, Some(LimitKind::Memory), "{o:?}");
    } else {
        assert!(o.stderr.text.contains("MemoryError"), "{o:?}");
    }
    assert!(run(&env("bash"), "echo alive").await.succeeded());
}

/// The pid namespace of a host process (the link `/proc/PID/ns/pid` names).
fn pid_namespace(pid: &str) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// Samples, until `stop`, how many host processes share the pid namespace
/// of the first process found carrying `marker` (the sandbox's): the
/// highest count seen.
fn most_processes_beside(marker: String, stop: Arc<AtomicBool>) -> usize {
    let mut namespace = None;
    let mut most = 0;
    while !stop.load(Ordering::SeqCst) {
        if namespace.is_none() {
            namespace = processes_with(&marker)
                .first()
                .and_then(|p| pid_namespace(p.split(':').next()?));
        }
        if let Some(ns) = &namespace {
            let count = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .filter(|e| pid_namespace(&e.file_name().to_string_lossy()).as_ref() == Some(ns))
                .count();
            most = most.max(count);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    most
}

#[tokio::test]
async fn fork_bomb_is_contained_and_leaves_nothing() {
    const PIDS: u64 = 48;
    let m = marker();
    let e = env_with("bash", |e| {
        e.limits.pids = PIDS;
        e.limits.timeout = Duration::from_secs(3);
    });
    // The host counts the sandbox's processes while the bomb runs: the
    // run's end alone (its time limit) says nothing about the process limit.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || most_processes_beside(m, stop))
    };
    let t = Instant::now();
    let o = run(
        &e,
        &format!("bomb() {{ sleep {m} & bomb | bomb & }}\nbomb\nwait\n"),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let most = sampler.join().unwrap() as u64;
    assert!(t.elapsed() < Duration::from_secs(8));
    assert!(!o.succeeded(), "{o:?}");
    // The limit held: forks were refused, and the sandbox never had more
    // processes than the limit, though the bomb came close to it.
    assert!(
        o.stderr
            .text
            .contains("fork: Resource temporarily unavailable")
            || o.stderr
                .text
                .contains("fork: retry: Resource temporarily unavailable"),
        "no fork was refused: {o:?}"
    );
    assert!(
        (PIDS / 2..=PIDS).contains(&most),
        "at most {most} processes in the sandbox at once, with a limit of {PIDS}"
    );
    if cgroups() {
        assert!(o.limits_reached.contains(&LimitKind::Processes), "{o:?}");
    }
    assert!(
        processes_with(&m).is_empty(),
        "left behind: {:?}",
        processes_with(&m).len()
    );
    assert!(run(&env("bash"), "echo alive").await.succeeded());
}

#[tokio::test]
async fn failed_fork_is_attributed_to_the_process_limit() {
    let e = env_with("python", |e| e.limits.pids = 16);
    let code = "import os, time\nkids = []\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(5); os._exit(0)\n    kids.append(pid)\n";
    let o = run(&e, code).await;
    assert_eq!(o.exit_code, Some(1), "{o:?}");
    assert!(
        o.stderr.text.contains("BlockingIOError")
            || o.stderr.text.contains("Resource temporarily unavailable"),
        "{o:?}"
    );
    if cgroups() {
        assert_eq!(o.limit, Some(LimitKind::Processes), "{o:?}");
    }
}

#[tokio::test]
async fn cpu_limit_stops_a_busy_loop() {
    let e = env_with("python", |e| {
        e.limits.cpu_seconds = 1;
        e.limits.timeout = Duration::from_secs(20);
    });
    let t = Instant::now();
    let o = run(&e, "while True: pass").await;
    assert_eq!(o.limit, Some(LimitKind::Cpu), "{o:?}");
    assert_eq!(o.signal, Some(libc::SIGXCPU));
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
}

#[tokio::test]
async fn file_size_limit_stops_a_growing_file() {
    let e = env_with("bash", |e| e.limits.file_size_bytes = 4 << 20);
    let o = run(&e, "exec head -c 64M /dev/zero > /workspace/big").await;
    assert_eq!(o.limit, Some(LimitKind::FileSize), "{o:?}");
    assert_eq!(o.signal, Some(libc::SIGXFSZ));
}

#[tokio::test]
async fn filling_the_disk_hits_the_tmpfs_bound() {
    let e = env_with("bash", |e| e.limits.workspace_bytes = 8 << 20);
    let code = "for d in /workspace /tmp /dev/shm; do head -c 64M /dev/zero > $d/fill 2>/dev/null; echo \"$d $(( $(stat -c %s $d/fill) >> 20 ))\"; done";
    let o = run(&e, code).await;
    // Each filesystem stops at its 8 MiB bound (the code file takes a little of /workspace).
    let sizes: Vec<(String, u64)> = o
        .stdout
        .text
        .lines()
        .map(|l| {
            let (d, mb) = l.split_once(' ').unwrap();
            (d.to_string(), mb.parse().unwrap())
        })
        .collect();
    assert_eq!(sizes.len(), 3, "{o:?}");
    for (dir, mb) in sizes {
        assert!((7..=8).contains(&mb), "{dir} grew to {mb} MiB");
    }
    let o = run(&env("bash"), "ls -A /workspace /tmp").await;
    assert!(!o.stdout.text.contains("fill"), "{o:?}");
}

#[tokio::test]
async fn open_files_are_limited() {
    let e = env_with("python", |e| e.limits.open_files = 64);
    let o = run(&e, "fs = []\ntry:\n    while True: fs.append(open('/dev/null'))\nexcept OSError as err:\n    print(len(fs) < 64, err.errno)\n").await;
    assert_eq!(o.stdout.text, "True 24\n", "{o:?}");
}

#[tokio::test]
async fn output_limit_kills_a_gigabyte_flood() {
    let e = env_with("bash", |e| e.limits.output_limit_bytes = 64 << 20);
    let t = Instant::now();
    let o = run(
        &e,
        "echo START; head -c 1G /dev/zero | tr '\\0' x; echo END",
    )
    .await;
    assert_eq!(o.limit, Some(LimitKind::Output), "{o:?}");
    assert!(o.stdout.text.starts_with("START\n"));
    assert!(o.stdout.total_bytes >= 64 << 20 && o.stdout.total_bytes < 1 << 30);
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// Python that makes each call the filter refuses, each in a child process of
/// its own, and prints `name errno` (0: the call succeeded). The arguments are
/// ones the kernel rejects, or accepts, before it looks at capabilities, so
/// that without the filter every call gets an answer of its own. The terminal
/// ioctls are tried on a pty made the caller's controlling terminal, where the
/// kernel would let TIOCSTI inject input.
const SYSCALL_PROBE: &str = r#"
import ctypes, fcntl, os, platform, pty, termios, threading
libc = ctypes.CDLL(None, use_errno=True)
nr = {
 "x86_64": dict(ptrace=101, process_vm_readv=310, process_vm_writev=311, keyctl=250, add_key=248,
   request_key=249, mount=165, umount2=166, pivot_root=155, unshare=272, clone_newuser=56, setns=308,
   kexec_load=246, kexec_file_load=320, bpf=321, perf_event_open=298, userfaultfd=323, personality=135,
   io_uring_setup=425, open_by_handle_at=304, init_module=175, reboot=169, syslog=103, clone3=435,
   kcmp=312, pidfd_getfd=438, process_madvise=440, socket_vsock=41, modify_ldt=154, iopl=172, ioperm=173,
   sysfs=139, ustat=136),
 "aarch64": dict(ptrace=117, process_vm_readv=270, process_vm_writev=271, keyctl=219, add_key=217,
   request_key=218, mount=40, umount2=39, pivot_root=41, unshare=97, clone_newuser=220, setns=268,
   kexec_load=104, kexec_file_load=294, bpf=280, perf_event_open=241, userfaultfd=282, personality=92,
   io_uring_setup=425, open_by_handle_at=265, init_module=105, reboot=142, syslog=116, clone3=435,
   kcmp=272, pidfd_getfd=438, process_madvise=440, socket_vsock=198),
}[platform.machine()]
args = dict(ptrace=[0, 0, 0, 0], unshare=[0x10000000], clone_newuser=[0x10000011, 0, 0, 0, 0],
            mount=[1, 1, 1, 0, 0], umount2=[0, 0xffff], bpf=[9999, 0, 0], userfaultfd=[1],
            personality=[0x0040000], open_by_handle_at=[-1, 1, 0],
            # Each answered by the kernel when allowed: compare fd 0 of this process with itself, a bad
            # pidfd (EBADF), a vsock socket (a descriptor, or EAFNOSUPPORT), read an empty LDT, drop to
            # I/O privilege 0, release one port, count filesystem types, a bad device (EINVAL).
            kcmp=[os.getpid(), os.getpid(), 0, 0, 0], pidfd_getfd=[-1, 0, 0], process_madvise=[-1, 0, 0, 0, 0],
            socket_vsock=[40, 1, 0], modify_ldt=[0, 0, 0], iopl=[0], ioperm=[0, 1, 0], sysfs=[3], ustat=[0, 0])

def in_child(probe):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            e = probe()
        except OSError as err:
            e = err.errno
        os.write(w, str(e).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    return int(os.read(r, 16))

def syscall(n, a):
    ctypes.set_errno(0)
    ret = libc.syscall(n, *[ctypes.c_long(x) for x in a])
    if ret == 0 and n == nr["clone_newuser"]:
        os._exit(0)
    return 0 if ret >= 0 else ctypes.get_errno()

def tty_ioctl(request, arg):
    master, tty = pty.openpty()
    os.setsid()
    fcntl.ioctl(tty, termios.TIOCSCTTY, 0)
    fcntl.ioctl(tty, request, arg)
    return 0

for name, n in nr.items():
    print(name, in_child(lambda: syscall(n, args.get(name, [0, 0, 0, 0, 0]))))
print("TIOCSTI", in_child(lambda: tty_ioctl(termios.TIOCSTI, b"x")))
print("TIOCLINUX", in_child(lambda: tty_ioctl(0x541C, b"\x00")))
t = threading.Thread(target=lambda: None); t.start(); t.join(); print("threads ok")
"#;

/// Every name `seccomp_allow` accepts that the probe exercises, on every
/// architecture (see [`X86_ONLY`]).
const PROBED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "pivot_root",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "personality",
    "io_uring_setup",
    "open_by_handle_at",
    "init_module",
    "reboot",
    "syslog",
    "ioctl",
    "clone",
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "socket",
];

/// The probed calls that exist only on x86-64: the same name in the probe
/// and in `seccomp_allow`, and told apart from the kernel's own answer.
#[cfg(target_arch = "x86_64")]
const X86_ONLY: &[&str] = &["modify_ldt", "iopl", "ioperm", "sysfs", "ustat"];
#[cfg(not(target_arch = "x86_64"))]
const X86_ONLY: &[&str] = &[];

/// Calls for which the kernel, without the filter, answers something other
/// than the filter's refusal on any Linux this runs on: argument checks come
/// before capability checks, or the call is open to unprivileged processes.
/// (pivot_root, reboot and syslog get EPERM from the kernel itself in a
/// sandbox without capabilities; whether bpf, io_uring, kexec and the others
/// do depends on the kernel's build and settings.)
const TOLD_APART: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "unshare",
    "clone_newuser",
    "setns",
    "perf_event_open",
    "userfaultfd",
    "personality",
    "clone3",
    "TIOCSTI",
    "TIOCLINUX",
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "socket_vsock",
];

/// Every probed name `seccomp_allow` accepts, for this architecture.
fn probed() -> impl Iterator<Item = &'static str> {
    PROBED.iter().chain(X86_ONLY).copied()
}

/// Every call told apart from the kernel's answer, for this architecture.
fn told_apart() -> impl Iterator<Item = &'static str> {
    TOLD_APART.iter().chain(X86_ONLY).copied()
}

fn probe_results(stdout: &str) -> std::collections::BTreeMap<String, i32> {
    stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// The probe's results in `e`, which must run it to the end.
async fn probe(
    e: &nix_sandbox_mcp::environment::Environment,
) -> std::collections::BTreeMap<String, i32> {
    let o = run(e, SYSCALL_PROBE).await;
    assert!(
        o.succeeded() && o.stdout.text.ends_with("threads ok\n"),
        "{o:?}"
    );
    let r = probe_results(&o.stdout.text);
    for name in told_apart() {
        assert!(r.contains_key(name), "{name} not probed: {}", o.stdout.text);
    }
    r
}

fn unfiltered() -> nix_sandbox_mcp::environment::Environment {
    env_with("python", |e| {
        e.seccomp_allow = probed().map(str::to_string).collect()
    })
}

#[tokio::test]
async fn seccomp_blocks_dangerous_syscalls_but_threads_work() {
    let filtered = probe(&env("python")).await;
    for (name, errno) in &filtered {
        let expected = if name == "clone3" {
            libc::ENOSYS
        } else {
            libc::EPERM
        };
        assert_eq!(*errno, expected, "{name}: {filtered:?}");
    }
    // The control: with every call allowed, the kernel answers these
    // otherwise, so the refusals above are the filter's.
    let kernel = probe(&unfiltered()).await;
    for name in told_apart() {
        assert_ne!(
            kernel[name], filtered[name],
            "{name}: the kernel alone gives the same answer\nfiltered: {filtered:?}\nkernel: {kernel:?}"
        );
    }
}

#[tokio::test]
async fn seccomp_allow_relaxes_only_what_is_named() {
    let relaxed = probe(&env_with("python", |e| {
        e.seccomp_allow = vec!["ptrace".into(), "personality".into()]
    }))
    .await;
    let kernel = probe(&unfiltered()).await;
    assert_eq!(relaxed["ptrace"], 0, "{relaxed:?}");
    assert_eq!(relaxed["personality"], 0, "{relaxed:?}");
    for name in told_apart() {
        if !["ptrace", "personality", "clone3"].contains(&name) {
            assert_eq!(relaxed[name], libc::EPERM, "{name}: {relaxed:?}");
            assert_ne!(kernel[name], libc::EPERM, "{name}: {kernel:?}");
        }
    }
}

#[tokio::test]
async fn proc_shows_only_the_sandbox_and_kernel_knobs_are_read_only() {
    let code = r#"
ls /proc | grep -c '^[0-9]'
ls /proc/1/root/ | tr '\n' ' '; echo
cat /proc/1/root/etc/shadow 2>&1 | head -1
for f in /proc/sys/kernel/core_pattern /proc/sysrq-trigger /proc/sys/vm/drop_caches; do (echo 1 > $f) 2>/dev/null && echo "WROTE $f" || echo "denied $f"; done
head -c 16 /proc/kcore >/dev/null 2>&1 && echo KCORE || echo "no kcore"
"#;
    let o = run(&env("bash"), code).await;
    let lines: Vec<&str> = o.stdout.text.lines().collect();
    assert!(lines[0].parse::<u32>().unwrap() < 10, "{o:?}");
    assert!(
        !lines[1].contains("home") && !lines[1].contains("root "),
        "{}",
        lines[1]
    );
    assert!(
        !o.stdout.text.contains("WROTE") && !o.stdout.text.contains("KCORE"),
        "{o:?}"
    );
    assert!(o.stdout.text.contains("No such file"), "{o:?}");
}

#[tokio::test]
async fn a_full_executor_answers_busy_at_once_and_queues_within_bounds() {
    let mut config = Config::default();
    config.server.max_concurrent_runs = Some(Positive(1));
    config.server.max_queued_runs = Some(1);
    let executor = app::executor_for(&config, true).unwrap();
    let bash = env("bash");
    let m = marker();
    let hold = CancellationToken::new();
    let request = |code: String, cancel: CancellationToken| {
        let code = code.into_bytes();
        let env = bash.clone();
        let executor = &executor;
        async move {
            executor
                .run(Request {
                    env: &env,
                    code: &code,
                    project: None,
                    inherited: &[],
                    cancel,
                    observer: None,
                    share: None,
                })
                .await
        }
    };
    // The first call holds the only slot until it is cancelled.
    let mut first = std::pin::pin!(request(format!("sleep {m}"), hold.clone()));
    tokio::select! {
        o = &mut first => panic!("the first call ended: {o:?}"),
        _ = tokio::time::sleep(Duration::from_secs(30)) => panic!("the first call never started"),
        _ = async {
            while processes_with(&m).is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } => {}
    }
    // The second waits in the queue; the third finds the queue full and is
    // answered on its first poll, without waiting for anything.
    let mut second = std::pin::pin!(request("echo second".into(), CancellationToken::new()));
    assert!(futures::poll!(second.as_mut()).is_pending());
    let mut third = std::pin::pin!(request("echo third".into(), CancellationToken::new()));
    match futures::poll!(third.as_mut()) {
        std::task::Poll::Ready(Err(ExecError::Busy {
            running: 1,
            queued: 1,
        })) => {}
        other => panic!("expected busy at once, got {other:?}"),
    }
    hold.cancel();
    let (a, b) = tokio::join!(first, second);
    assert!(a.unwrap().cancelled);
    assert_eq!(
        b.unwrap().stdout.text,
        "second\n",
        "the queued call runs once a slot frees"
    );
    executor.enforcer().cleanup();
}

#[tokio::test]
async fn cancelling_kills_the_sandbox_promptly() {
    let m = marker();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let watched = m.clone();
    tokio::spawn(async move {
        while processes_with(&watched).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        trigger.cancel();
    });
    let t = Instant::now();
    let o = common::run_with(
        &env("bash"),
        &format!("setsid sleep {m} & sleep 30"),
        cancel,
    )
    .await;
    assert!(o.cancelled, "{o:?}");
    // Far below the program's own 30 s; the latency itself is measured by
    // bench/latency.py.
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(processes_with(&m).is_empty());
}

#[tokio::test]
async fn rlimit_fallback_still_bounds_memory_and_processes() {
    use nix_sandbox_mcp::exec::{Bounds, Executor};
    use nix_sandbox_mcp::limits::Enforcer;
    use nix_sandbox_mcp::platform::Platform;
    let platform = Platform::probe(None).unwrap();
    let enforcer = Enforcer::rlimits_only("forced by the test", "do not force it");
    assert_eq!(enforcer.mechanism(), Mechanism::Rlimits);
    let bounds = Bounds {
        max_running: 2,
        max_waiting: 2,
        prestart: 0,
        memory_budget_mib: 4096,
    };
    let proxy =
        nix_sandbox_mcp::network::Proxy::new(nix_sandbox_mcp::network::Resolver::system(), None);
    let executor = Executor::new(
        Arc::new(platform),
        enforcer,
        bounds,
        proxy,
        Default::default(),
    );
    let go = |env: &nix_sandbox_mcp::environment::Environment, code: &str| {
        let code = code.as_bytes().to_vec();
        let env = env.clone();
        let executor = &executor;
        async move {
            executor
                .run(Request {
                    env: &env,
                    code: &code,
                    project: None,
                    inherited: &[],
                    cancel: CancellationToken::new(),
                    observer: None,
                    share: None,
                })
                .await
                .unwrap()
        }
    };
    let py = env_with("python", |e| e.limits.memory_bytes = 128 << 20);
    let o = go(&py, "x = bytearray(512 << 20)").await;
    assert!(o.stderr.text.contains("MemoryError"), "{o:?}");
    let py = env_with("python", |e| e.limits.pids = 16);
    let o = go(&py, "import os, time\nn = 0\ntry:\n    while n < 100:\n        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError:\n    print('stopped', n < 100)\n").await;
    assert_eq!(o.stdout.text, "stopped True\n", "{o:?}");
    // Node reserves address space far beyond its memory use; RLIMIT_DATA lets it start.
    let o = go(&env("node"), "console.log('node ok')").await;
    assert_eq!(o.stdout.text, "node ok\n", "{o:?}");
}
