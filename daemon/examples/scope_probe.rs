//! Obtains a delegated cgroup the way the server does and tries what the
//! server will do with it: move itself into a leaf, enable controllers for
//! the subtree, put a process in a run group, set its limits, freeze and
//! kill it, and see the memory and process limits fire. Prints one line per
//! step (`ok`, `no` or `FAIL`); exits non-zero when no delegated cgroup could
//! be had. Run it as the user to test, e.g. in tests/vm/run-tier.sh.

use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix_sandbox_mcp::systemd_scope::{self, ScopeError};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter("nix_sandbox_mcp=debug")
        .init();
    let uid = rustix::process::geteuid().as_raw();
    println!("uid {uid}, pid {}", std::process::id());
    println!("systemd running: {}", systemd_scope::systemd_booted());
    let Some(start) = systemd_scope::current_cgroup_v2() else {
        println!("FAIL {}", ScopeError::NoCgroup2);
        return ExitCode::FAILURE;
    };
    println!("started in {}", start.display());
    describe_marks(&start);
    match systemd_scope::check_delegated(&start) {
        Ok(()) => println!("ok   the filesystem says delegated (owner or mark, alone in it)"),
        Err(e) => println!("no   {e}"),
    }
    let t = Instant::now();
    let delegated = match systemd_scope::delegated_cgroup() {
        Ok(d) => d,
        Err(e) => {
            println!("FAIL {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = delegated.dir;
    match delegated.started {
        Some(unit) => println!(
            "ok   systemd started {unit} in {} ms",
            t.elapsed().as_millis()
        ),
        None => println!("ok   using the cgroup we were in"),
    }
    println!("delegated {}", dir.display());
    describe_marks(&dir);
    let f = systemd_scope::features(&dir);
    println!(
        "controllers: {}; cgroup.kill {}, cgroup.freeze {}, memory.peak {}",
        f.controllers.join(" "),
        f.kill,
        f.freeze,
        f.memory_peak
    );
    if !(f.has("memory") && f.has("pids")) {
        println!("FAIL memory and pids are not both available to the subtree");
        return ExitCode::FAILURE;
    }
    exercise(&dir);
    ExitCode::SUCCESS
}

/// Owner and systemd's delegation marks of a cgroup directory.
fn describe_marks(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let owner = fs::metadata(dir).map(|m| m.uid().to_string());
    let mark = |name: &str| {
        let mut value = [0u8; 8];
        match rustix::fs::getxattr(dir, name, &mut value) {
            Ok(n) => String::from_utf8_lossy(&value[..n]).into_owned(),
            Err(e) => format!("({e})"),
        }
    };
    println!(
        "  owner uid {}, user.delegate={}, trusted.delegate={}",
        owner.unwrap_or_else(|e| e.to_string()),
        mark("user.delegate"),
        mark("trusted.delegate")
    );
}

fn step(what: &str, result: std::io::Result<()>) -> bool {
    match &result {
        Ok(()) => println!("ok   {what}"),
        Err(e) => println!("FAIL {what}: {e}"),
    }
    result.is_ok()
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    fs::write(path, value)
}

/// What the caller does with the delegated group, step by step.
fn exercise(dir: &Path) {
    let leaf = dir.join("daemon");
    let _ = fs::create_dir(&leaf);
    // The root of the hierarchy (no cgroup.type) needs no leaf.
    if dir.join("cgroup.type").exists()
        && !step(
            "move into leaf `daemon` (no internal processes)",
            write(&leaf.join("cgroup.procs"), "0"),
        )
    {
        return;
    }
    for controller in ["memory", "pids", "cpu"] {
        step(
            &format!("enable +{controller} in cgroup.subtree_control"),
            write(
                &dir.join("cgroup.subtree_control"),
                &format!("+{controller}"),
            ),
        );
    }
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    println!("subtree_control now: {}", enabled.trim());
    let run = dir.join("run-1");
    let _ = fs::create_dir(&run);
    for (file, value) in [
        ("memory.max", "67108864"),
        ("memory.swap.max", "0"),
        ("pids.max", "16"),
        ("cpu.max", "50000 100000"),
    ] {
        step(
            &format!("write {file} = {value}"),
            write(&run.join(file), value),
        );
    }
    for file in [
        "memory.peak",
        "cgroup.kill",
        "cgroup.freeze",
        "memory.events",
    ] {
        let there = run.join(file).exists();
        println!(
            "{}  run group has {file}",
            if there { "ok  " } else { "no  " }
        );
    }
    hold_freeze_kill(&run);
    memory_limit_fires(&run);
    pids_limit_fires(&run);
    let _ = fs::remove_dir(&run);
}

/// A `sleep` moved into the group, frozen, thawed, then killed through cgroup.kill.
fn hold_freeze_kill(run: &Path) {
    let Ok(mut sleep) = Command::new("sleep").arg("60").spawn() else {
        println!("FAIL cannot start sleep");
        return;
    };
    if step(
        "move a sleep into run-1",
        write(&run.join("cgroup.procs"), &sleep.id().to_string()),
    ) {
        let frozen = write(&run.join("cgroup.freeze"), "1")
            .and_then(|()| wait_for(|| read_key(&run.join("cgroup.events"), "frozen") == Some(1)));
        step("freeze run-1 (cgroup.events frozen 1)", frozen);
        let _ = write(&run.join("cgroup.freeze"), "0");
        if step(
            "kill run-1 through cgroup.kill",
            write(&run.join("cgroup.kill"), "1"),
        ) {
            let status = sleep.wait();
            println!("     sleep ended: {status:?}");
        }
    }
    let _ = sleep.kill();
    let _ = sleep.wait();
}

/// A process that keeps 200 MiB is killed by the 64 MiB memory.max.
fn memory_limit_fires(run: &Path) {
    // `tail` keeps a whole "line" in memory, and /dev/zero has no newline.
    let script = format!(
        "echo $$ > {}/cgroup.procs && head -c 200M /dev/zero | tail > /dev/null",
        run.display()
    );
    let before = read_key(&run.join("memory.events"), "oom_kill").unwrap_or(0);
    let status = Command::new("sh").arg("-c").arg(&script).status();
    let after = read_key(&run.join("memory.events"), "oom_kill").unwrap_or(0);
    let peak = fs::read_to_string(run.join("memory.peak")).unwrap_or_default();
    println!(
        "{} memory.max fired: oom_kill {before} -> {after} ({status:?}), memory.peak {}",
        if after > before { "ok  " } else { "FAIL" },
        peak.trim()
    );
}

/// A shell that starts 30 sleeps is stopped at pids.max 16.
fn pids_limit_fires(run: &Path) {
    let script = format!(
        "echo $$ > {}/cgroup.procs && for i in $(seq 30); do sleep 2 & done 2>/dev/null; wait",
        run.display()
    );
    let before = read_key(&run.join("pids.events"), "max").unwrap_or(0);
    let status = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stderr(Stdio::null())
        .status();
    let after = read_key(&run.join("pids.events"), "max").unwrap_or(0);
    println!(
        "{} pids.max fired: pids.events max {before} -> {after} ({status:?})",
        if after > before { "ok  " } else { "FAIL" }
    );
}

fn wait_for(done: impl Fn() -> bool) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        if Instant::now() > deadline {
            return Err(std::io::Error::other("not within 5 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn read_key(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
