//! `doctor`'s look inside a test sandbox: each protection is reported from
//! what the sandbox itself shows (its namespaces against the server's, its
//! capability sets, its seccomp state, whether `/` takes a write, its
//! rlimits) and from what it refused when this binary's probe (see
//! [`super::probe`]) tried to get past it (calls the filter blocks, more
//! processes and memory than its limits), never from what the
//! configuration says it should be.

use std::collections::BTreeMap;

use super::Finding;
use super::probe::{PROBE, REFUSED_CALLS};
use crate::environment::{Environment, RootFs};
use crate::exec::{Executor, LimitKind, Outcome, Request};
use crate::limits::Mechanism;

/// The limits the probe is tried against: small, so that reaching them is
/// quick, and well below what the probe tries for.
const PROBE_PIDS: u64 = 16;
const PROBE_MEMORY_MIB: u64 = 48;

/// Namespaces every sandbox gets, as `/proc/self/ns` names them.
const NAMESPACES: &[(&str, &str)] = &[
    ("user", "user"),
    ("pid", "pid"),
    ("ipc", "ipc"),
    ("uts", "uts"),
    ("cgroup", "cgroup"),
    ("net", "network"),
    ("mnt", "mount"),
];

/// Prints one `key value` line per fact; only POSIX sh and /proc.
const FACTS: &str = r#"for ns in user pid ipc uts cgroup net mnt; do echo "ns_$ns $(readlink /proc/self/ns/$ns)"; done
grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status | tr -d '\t' | sed 's/:/ /'
echo "uid_maps $(wc -l < /proc/self/uid_map)"
echo "uid_map $(head -n 1 /proc/self/uid_map | tr -s ' ' | sed 's/^ //')"
echo "hostname $(cat /proc/sys/kernel/hostname)"
echo "interfaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
if touch /.nsm-doctor 2>/dev/null; then echo "root writable"; else echo "root read-only"; fi
sed -n -e 's/^Max open files  *\([0-9a-z]*\).*/open_files \1/p' -e 's/^Max file size  *\([0-9a-z]*\).*/file_size \1/p' /proc/self/limits
"#;

async fn run(executor: &Executor, env: &Environment, code: &str) -> Result<Outcome, String> {
    executor
        .run(Request::internal(env, code.as_bytes()))
        .await
        .map_err(|e| e.to_string())
}

/// Runs the probes in test sandboxes and judges each protection.
pub(super) async fn check(executor: &Executor) -> Vec<Finding> {
    let mut found = observe(executor).await;
    found.extend(exercise(executor).await);
    found
}

/// What a test sandbox shows of itself.
async fn observe(executor: &Executor) -> Vec<Finding> {
    let env = crate::app::self_test_env(Default::default());
    let facts = match run(executor, &env, FACTS).await {
        Ok(o) if o.succeeded() => parse(&o.stdout.text),
        Ok(o) => {
            return vec![Finding::fail(
                "protections",
                format!(
                    "the probe failed in the test sandbox: {}",
                    o.stderr.text.trim()
                ),
                "report this with the output of `nix-sandbox-mcp doctor --json`",
            )];
        }
        Err(e) => {
            return vec![Finding::fail(
                "protections",
                e,
                "see the sandbox check above",
            )];
        }
    };
    vec![
        namespaces(&facts),
        identity(&facts),
        seccomp(&facts),
        network(&facts),
        root(&facts),
        rlimits(&facts, env.limits.open_files, env.limits.file_size_bytes),
    ]
}

/// Runs this binary's probe in test sandboxes with small limits: the calls
/// the filter must refuse, then more processes and more memory than the
/// limits allow.
async fn exercise(executor: &Executor) -> Vec<Finding> {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            return vec![Finding::warn(
                "probe",
                format!(
                    "cannot find this binary to run its probe in a test sandbox ({e}): the filter and the limits were not tried"
                ),
                "run doctor from an installed binary",
            )];
        }
    };
    let command = |args: &str| {
        format!(
            "exec {} {PROBE} {args}\n",
            crate::clients::shell_quote(&exe.to_string_lossy())
        )
    };
    let mut env = crate::app::self_test_env(Default::default());
    if let RootFs::Host { extra } = &mut env.root {
        extra.push(exe.clone());
    }
    let mut found = Vec::new();
    match run(executor, &env, &command("syscalls")).await {
        Ok(o) if o.succeeded() => found.push(refused_calls(&parse(&o.stdout.text))),
        other => return vec![unrunnable(&exe, other)],
    }
    let mut few = env.clone();
    few.limits.pids = PROBE_PIDS;
    let tries = PROBE_PIDS * 8;
    found.push(
        match run(executor, &few, &command(&format!("processes {tries}"))).await {
            Ok(o) if o.exit_code == Some(0) => processes(
                &parse(&o.stdout.text),
                &enforced_by(executor, "RLIMIT_NPROC"),
            ),
            other => unrunnable(&exe, other),
        },
    );
    let mut small = env;
    small.limits.memory_bytes = PROBE_MEMORY_MIB << 20;
    let tries = PROBE_MEMORY_MIB * 4;
    found.push(
        match run(executor, &small, &command(&format!("memory {tries}"))).await {
            Ok(o) => memory(
                &parse(&o.stdout.text),
                o.limit == Some(LimitKind::Memory) || o.signal == Some(libc::SIGKILL),
                &enforced_by(executor, "RLIMIT_DATA"),
            ),
            Err(e) => unrunnable(&exe, Err(e)),
        },
    );
    found
}

fn unrunnable(exe: &std::path::Path, outcome: Result<Outcome, String>) -> Finding {
    let why = match outcome {
        Ok(o) => format!("exit status {:?}: {}", o.exit_code, o.stderr.text.trim()),
        Err(e) => e,
    };
    Finding::warn(
        "probe",
        format!(
            "this binary ({}) did not run in a test sandbox ({why}): the filter and the limits were not tried",
            exe.display()
        ),
        "run doctor from a binary outside /tmp, /run and /dev (a sandbox has its own), or report this with the output of `nix-sandbox-mcp doctor --json`",
    )
}

/// What enforces a limit: the sandbox's cgroup, or `rlimit`.
fn enforced_by(executor: &Executor, rlimit: &str) -> String {
    match executor.enforcer().mechanism() {
        Mechanism::Rlimits => rlimit.to_string(),
        m => format!("its {}", m.as_str()),
    }
}

fn errno(n: &str) -> String {
    match n.parse::<i32>() {
        Ok(n) => std::io::Error::from_raw_os_error(n).to_string(),
        Err(_) => n.to_string(),
    }
}

fn refused_calls(facts: &BTreeMap<String, String>) -> Finding {
    let eperm = libc::EPERM.to_string();
    let let_through: Vec<String> = REFUSED_CALLS
        .iter()
        .filter(|name| fact(facts, name) != eperm)
        .map(|name| format!("{name}: {}", errno(fact(facts, name))))
        .collect();
    if let_through.is_empty() {
        return Finding::ok(
            "seccomp calls",
            "checked in a test sandbox: pidfd_getfd on itself, setns into its own user namespace and a vsock socket were refused with EPERM, the filter's answer (without the filter: success, EINVAL, and a socket or EAFNOSUPPORT)",
        );
    }
    Finding::fail(
        "seccomp calls",
        format!(
            "in a test sandbox, calls the filter refuses were not refused with EPERM: {}",
            let_through.join("; ")
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json` and `bwrap --version`",
    )
}

fn processes(facts: &BTreeMap<String, String>, by: &str) -> Finding {
    let started = fact(facts, "started").parse::<u64>().unwrap_or(u64::MAX);
    let refused = fact(facts, "refused");
    if started < PROBE_PIDS && refused != "none" && !refused.is_empty() {
        return Finding::ok(
            "processes",
            format!(
                "checked in a test sandbox limited to {PROBE_PIDS} processes: {started} started, the next was refused ({}), by {by}",
                errno(refused)
            ),
        );
    }
    Finding::fail(
        "processes",
        format!(
            "a test sandbox limited to {PROBE_PIDS} processes started {} ({by})",
            fact(facts, "started")
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json`",
    )
}

/// `killed`: the run ended by the memory limit (a cgroup's kill).
fn memory(facts: &BTreeMap<String, String>, killed: bool, by: &str) -> Finding {
    let allocated = match fact(facts, "allocated") {
        "" => "0",
        n => n,
    };
    let limit = format!("limited to {PROBE_MEMORY_MIB} MiB");
    let within = |mib: &str| mib.parse::<u64>().is_ok_and(|n| n <= PROBE_MEMORY_MIB);
    if killed && within(allocated) {
        return Finding::ok(
            "memory",
            format!(
                "checked in a test sandbox {limit}: killed by {by} when it held {allocated} MiB"
            ),
        );
    }
    if let Some(at) = facts.get("refused").filter(|at| within(at)) {
        return Finding::ok(
            "memory",
            format!(
                "checked in a test sandbox {limit}: an allocation was refused at {at} MiB, by {by}"
            ),
        );
    }
    Finding::fail(
        "memory",
        format!(
            "a test sandbox {limit} allocated {allocated} MiB, and was neither refused more nor killed ({by})"
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json`",
    )
}

fn parse(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn fact<'a>(facts: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    facts.get(key).map_or("", String::as_str)
}

fn namespaces(facts: &BTreeMap<String, String>) -> Finding {
    let shared: Vec<&str> = NAMESPACES
        .iter()
        .filter(|(ns, _)| {
            let inside = fact(facts, &format!("ns_{ns}"));
            let server = std::fs::read_link(format!("/proc/self/ns/{ns}"))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            inside.is_empty() || inside == server
        })
        .map(|(_, name)| *name)
        .collect();
    if shared.is_empty() {
        let names: Vec<&str> = NAMESPACES.iter().map(|(_, name)| *name).collect();
        return Finding::ok(
            "namespaces",
            format!(
                "checked in a test sandbox: its {} namespaces each differ from the server's",
                names.join(", ")
            ),
        );
    }
    Finding::fail(
        "namespaces",
        format!(
            "a test sandbox shares the server's {} namespace(s)",
            shared.join(", ")
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json` and `bwrap --version`",
    )
}

fn identity(facts: &BTreeMap<String, String>) -> Finding {
    let zero = |key| u64::from_str_radix(fact(facts, key), 16) == Ok(0);
    let one_uid = fact(facts, "uid_maps") == "1";
    let map = fact(facts, "uid_map");
    let sandbox_uid = map.split(' ').next() == Some(&crate::jail::SANDBOX_UID.to_string());
    if zero("CapEff")
        && zero("CapBnd")
        && fact(facts, "NoNewPrivs") == "1"
        && one_uid
        && sandbox_uid
    {
        return Finding::ok(
            "identity",
            format!(
                "checked in a test sandbox: uid map `{map}` (one uid, no other), no capabilities (effective and bounding sets empty), no new privileges"
            ),
        );
    }
    Finding::fail(
        "identity",
        format!(
            "a test sandbox has CapEff {}, CapBnd {}, NoNewPrivs {}, uid map `{map}` ({} line(s))",
            fact(facts, "CapEff"),
            fact(facts, "CapBnd"),
            fact(facts, "NoNewPrivs"),
            fact(facts, "uid_maps")
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json` and `bwrap --version`",
    )
}

fn seccomp(facts: &BTreeMap<String, String>) -> Finding {
    let mode = fact(facts, "Seccomp");
    // Seccomp_filters is shown from Linux 5.9 on.
    let loaded = facts.get("Seccomp_filters");
    let count_ok = loaded.is_none_or(|n| n.parse::<usize>().is_ok_and(|n| n >= 1));
    let rules = format!(
        "it refuses {} calls by name and {} more for some of their arguments",
        crate::seccomp::BLOCKED.len(),
        crate::seccomp::CONDITIONAL.len()
    );
    if mode == "2" && count_ok {
        let how_many = loaded.map_or(String::new(), |n| format!(", {n} program(s)"));
        return Finding::ok(
            "seccomp",
            format!("checked in a test sandbox: filter mode{how_many}; {rules}"),
        );
    }
    Finding::fail(
        "seccomp",
        format!(
            "a test sandbox shows Seccomp {mode:?} and {} filter program(s), where filter mode (2) and at least one program were expected",
            loaded.map_or("an unknown number of", String::as_str)
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json` and `bwrap --version`",
    )
}

fn network(facts: &BTreeMap<String, String>) -> Finding {
    let interfaces = fact(facts, "interfaces");
    if interfaces == "lo" {
        return Finding::ok(
            "network",
            "checked in a test sandbox: loopback is its only interface; environments reach the network only through the server's proxy, by allowlist",
        );
    }
    Finding::fail(
        "network",
        format!("a test sandbox has the interfaces {interfaces:?}, where only lo was expected"),
        "report this with the output of `nix-sandbox-mcp doctor --json`",
    )
}

fn root(facts: &BTreeMap<String, String>) -> Finding {
    if fact(facts, "root") == "read-only" {
        return Finding::ok(
            "root",
            "checked in a test sandbox: a write to / fails (read-only)",
        );
    }
    Finding::fail(
        "root",
        "a test sandbox could write to /",
        "report this with the output of `nix-sandbox-mcp doctor --json` and `bwrap --version`",
    )
}

fn rlimits(facts: &BTreeMap<String, String>, open_files: u64, file_size_bytes: u64) -> Finding {
    let seen = (fact(facts, "open_files"), fact(facts, "file_size"));
    let expected = (open_files.to_string(), file_size_bytes.to_string());
    if (seen.0, seen.1) == (expected.0.as_str(), expected.1.as_str()) {
        return Finding::ok(
            "rlimits",
            format!(
                "checked in a test sandbox: at most {} open files, files up to {} MiB",
                seen.0,
                file_size_bytes >> 20
            ),
        );
    }
    Finding::fail(
        "rlimits",
        format!(
            "a test sandbox allows {} open files and files of {} bytes, where {} and {} were set",
            seen.0, seen.1, expected.0, expected.1
        ),
        "report this with the output of `nix-sandbox-mcp doctor --json`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_judged_from_what_the_sandbox_showed() {
        let facts = parse(
            "CapEff 0000000000000000\nCapBnd 0000000000000000\nNoNewPrivs 1\nSeccomp 2\nSeccomp_filters 2\nuid_maps 1\nuid_map 1000 1002 1\ninterfaces lo \nroot read-only\nopen_files 1024\nfile_size 268435456\n",
        );
        assert_eq!(identity(&facts).status, super::super::Status::Ok);
        assert_eq!(seccomp(&facts).status, super::super::Status::Ok);
        for unfiltered in ["Seccomp 0\n", "Seccomp 2\nSeccomp_filters 0\n"] {
            assert_eq!(
                seccomp(&parse(unfiltered)).status,
                super::super::Status::Fail
            );
        }
        assert_eq!(network(&facts).status, super::super::Status::Ok);
        assert_eq!(root(&facts).status, super::super::Status::Ok);
        assert_eq!(
            rlimits(&facts, 1024, 256 << 20).status,
            super::super::Status::Ok
        );
        assert_eq!(
            rlimits(&facts, 64, 256 << 20).status,
            super::super::Status::Fail
        );
        let mut weak = facts.clone();
        weak.insert("CapBnd".into(), "000001ffffffffff".into());
        weak.insert("root".into(), "writable".into());
        assert_eq!(identity(&weak).status, super::super::Status::Fail);
        assert_eq!(root(&weak).status, super::super::Status::Fail);
        // Namespaces the probe did not report count as shared.
        assert_eq!(namespaces(&facts).status, super::super::Status::Fail);
    }

    #[test]
    fn the_probe_passes_only_what_was_refused() {
        use super::super::Status::{Fail, Ok};
        let refused = parse("pidfd_getfd 1\nsetns 1\nsocket_vsock 1\n");
        assert_eq!(refused_calls(&refused).status, Ok);
        // The kernel's own answers, as without the filter.
        let open = parse("pidfd_getfd ok\nsetns 22\nsocket_vsock 97\n");
        let judged = refused_calls(&open);
        assert_eq!(judged.status, Fail);
        assert!(
            judged.detail.contains("setns: Invalid argument"),
            "{judged:?}"
        );
        assert_eq!(refused_calls(&parse("")).status, Fail);

        let by = "RLIMIT_NPROC";
        assert_eq!(processes(&parse("started 13\nrefused 11\n"), by).status, Ok);
        assert_eq!(
            processes(&parse("started 128\nrefused none\n"), by).status,
            Fail
        );
        assert_eq!(
            processes(&parse("started 20\nrefused 11\n"), by).status,
            Fail
        );
        assert_eq!(processes(&parse(""), by).status, Fail);

        let by = "RLIMIT_DATA";
        assert_eq!(memory(&parse("allocated 44\n"), true, by).status, Ok);
        assert_eq!(
            memory(&parse("allocated 44\nrefused 44\n"), false, by).status,
            Ok
        );
        assert_eq!(
            memory(&parse("allocated 192\nreached 192\n"), false, by).status,
            Fail
        );
        assert_eq!(memory(&parse(""), false, by).status, Fail);
        assert_eq!(
            memory(&parse("allocated 188\nrefused 188\n"), false, by).status,
            Fail
        );
        assert_eq!(memory(&parse("allocated 100\n"), true, by).status, Fail);
    }
}
