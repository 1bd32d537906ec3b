//! Tests of the systemd delegation: finding our cgroup, deciding whether
//! it is delegated to us, and the D-Bus conversation.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use futures::StreamExt;
use zbus::{MessageStream, OwnedObjectPath};

use super::dbus::{
    BusEnv, Endpoint, MANAGER_INTERFACE, MANAGER_PATH, UNIT_EXISTS, connect, endpoints,
};
use super::*;

const MOUNTINFO: &str = "\
24 1 0:22 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

#[test]
fn finds_our_cgroup_under_the_cgroup2_mount() {
    let cgroup = "0::/user.slice/user-1000.slice/session-3.scope\n";
    assert_eq!(
        cgroup_v2_dir(cgroup, MOUNTINFO),
        Some(PathBuf::from(
            "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
        ))
    );
    // Hybrid hosts list v1 hierarchies too; only the `0::` line counts.
    let hybrid = "4:memory:/x\n0::/\n";
    let mounts = "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
    assert_eq!(
        cgroup_v2_dir(hybrid, mounts),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
}

#[test]
fn maps_through_a_mount_of_a_subtree() {
    let mounts = "50 1 0:28 /app.slice /mnt/cg\\040x rw - cgroup2 cgroup2 rw\n";
    assert_eq!(
        cgroup_v2_dir("0::/app.slice/a.scope\n", mounts),
        Some(PathBuf::from("/mnt/cg x/a.scope"))
    );
    assert_eq!(cgroup_v2_dir("0::/app.slicex/a\n", mounts), None);
    assert_eq!(cgroup_v2_dir("0::/other\n", mounts), None);
    assert_eq!(cgroup_v2_dir("1:memory:/a\n", MOUNTINFO), None);
}

/// A directory that looks like a cgroup holding `procs`.
fn fake_cgroup(procs: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("cgroup.procs", procs),
        ("cgroup.subtree_control", ""),
        ("cgroup.controllers", "cpu memory pids\n"),
        ("cgroup.type", "domain\n"),
    ] {
        fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn why(result: Result<(), ScopeError>) -> String {
    match result {
        Err(ScopeError::NotDelegated { why, .. }) => why,
        other => panic!("expected NotDelegated, got {other:?}"),
    }
}

#[test]
fn a_group_of_our_own_that_only_we_are_in_is_delegated() {
    let dir = fake_cgroup("42\n");
    let owner = fs::metadata(dir.path()).unwrap().uid();
    check_delegated_as(dir.path(), owner, false, 42).unwrap();
}

#[test]
fn a_group_owned_by_someone_else_is_not_ours_and_the_error_says_how_to_get_one() {
    let dir = fake_cgroup("42\n");
    let owner = fs::metadata(dir.path()).unwrap().uid();
    let why = why(check_delegated_as(dir.path(), owner + 1, true, 42));
    assert!(why.contains(&format!("belongs to uid {owner}")), "{why}");
    assert!(
        why.contains("systemd-run --user --scope -p Delegate=yes"),
        "{why}"
    );
}

#[test]
fn a_group_shared_with_other_processes_is_not_ours() {
    let dir = fake_cgroup("42\n7\n");
    let owner = fs::metadata(dir.path()).unwrap().uid();
    let why = why(check_delegated_as(dir.path(), owner, false, 42));
    assert!(
        why.contains("shared with 1 other process (pids 7)"),
        "{why}"
    );
    // The root of the hierarchy may hold processes and still delegate.
    fs::remove_file(dir.path().join("cgroup.type")).unwrap();
    check_delegated_as(dir.path(), owner, false, 42).unwrap();
}

#[test]
fn root_under_systemd_needs_the_delegation_mark() {
    let dir = fake_cgroup("42\n");
    let owner = fs::metadata(dir.path()).unwrap().uid();
    if owner != 0 {
        return; // Only root's files are owned by uid 0.
    }
    let why = why(check_delegated_as(dir.path(), 0, true, 42));
    assert!(why.contains("Delegate=yes"), "{why}");
    // Without systemd nothing else manages the tree: root may.
    check_delegated_as(dir.path(), 0, false, 42).unwrap();
    // systemd's mark; tmpfs before Linux 6.6 takes no user attributes.
    let marked = rustix::fs::setxattr(
        dir.path(),
        "user.delegate",
        b"1",
        rustix::fs::XattrFlags::empty(),
    );
    if marked.is_ok() {
        check_delegated_as(dir.path(), 0, true, 42).unwrap();
    }
}

#[test]
fn features_list_controllers_and_interface_files() {
    let dir = fake_cgroup("");
    fs::write(dir.path().join("cgroup.kill"), "").unwrap();
    let f = features(dir.path());
    assert_eq!(f.controllers, ["cpu", "memory", "pids"]);
    assert!(f.has("memory") && !f.has("io"));
    assert!(f.kill && !f.freeze && !f.memory_peak);
}

#[test]
fn a_user_without_a_bus_is_told_what_was_tried_and_how_to_fix_it() {
    let empty = tempfile::tempdir().unwrap();
    let env = BusEnv {
        uid: 1000,
        runtime_dir: Some(empty.path().to_path_buf()),
        ..BusEnv::default()
    };
    let found = endpoints(Manager::User, &env);
    assert!(found.0.is_empty());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let Err(e) = runtime.block_on(connect(Manager::User, &found)) else {
        panic!("connected to nothing");
    };
    let text = e.to_string();
    for said in [
        "DBUS_SESSION_BUS_ADDRESS unset",
        &format!("no {}/bus", empty.path().display()),
        "loginctl enable-linger",
        "systemd-run --user --scope -p Delegate=yes nix-sandbox-mcp --stdio",
    ] {
        assert!(text.contains(said), "{said:?} missing from: {text}");
    }
}

#[test]
fn the_session_address_comes_first_then_the_runtime_dir_bus() {
    let dir = tempfile::tempdir().unwrap();
    let _bus = std::os::unix::net::UnixListener::bind(dir.path().join("bus")).unwrap();
    let env = BusEnv {
        uid: 1000,
        runtime_dir: Some(dir.path().to_path_buf()),
        session_bus: Some("unix:path=/elsewhere".into()),
        ..BusEnv::default()
    };
    assert_eq!(
        endpoints(Manager::User, &env).0,
        [
            Endpoint::Address("unix:path=/elsewhere".into()),
            Endpoint::Socket(dir.path().join("bus")),
        ]
    );
    // The same bus twice is tried once.
    let env = BusEnv {
        session_bus: Some(format!("unix:path={}/bus", dir.path().display())),
        ..env
    };
    assert_eq!(endpoints(Manager::User, &env).0.len(), 1);
}

#[test]
fn only_a_user_managers_own_units_are_asked_about() {
    let user = Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service");
    let scope = user.join("app.slice/run-r1.scope");
    assert_eq!(
        unit_to_confirm(&scope, 1000, true).as_deref(),
        Some("run-r1.scope")
    );
    let service = user.join("app.slice/nix-sandbox-mcp.service");
    assert!(unit_to_confirm(&service, 1000, true).is_some());
    // A group below a unit is a delegate's; root and hosts without
    // systemd go by the filesystem; a system unit chowned to the user
    // was delegated by the system manager.
    for (dir, uid, systemd) in [
        (scope.join("daemon"), 1000, true),
        (scope.clone(), 0, true),
        (scope.clone(), 1000, false),
        (
            PathBuf::from("/sys/fs/cgroup/system.slice/nsm.service"),
            1000,
            true,
        ),
    ] {
        assert_eq!(unit_to_confirm(&dir, uid, systemd), None, "{dir:?}");
    }
}

/// What the stand-in manager does with StartTransientUnit.
#[derive(Clone, Copy)]
enum Script {
    /// Emits another job's JobRemoved, then ours with this result.
    Finish(&'static str),
    /// Refuses the first start with UnitExists.
    ExistsOnce,
}

/// Runs `start_scope` against a stand-in for systemd's manager on a
/// socket pair, speaking the same D-Bus calls and signals; returns the
/// result and the methods the manager was called with.
fn against_manager(script: Script) -> (Result<(), ScopeError>, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = zbus::connection::Builder::unix_stream(theirs)
            .server(zbus::Guid::generate())
            .p2p()
            .build();
        let client = zbus::connection::Builder::unix_stream(ours).p2p().build();
        let (server, client) = futures::try_join!(server, client).unwrap();
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = calls.clone();
        let manager = tokio::spawn(async move {
            let mut incoming = MessageStream::from(&server);
            let mut refused = false;
            while let Some(Ok(call)) = incoming.next().await {
                let header = call.header();
                let member = header.member().map(|m| m.to_string()).unwrap_or_default();
                seen.lock().unwrap().push(member.clone());
                if member == "ResetFailedUnit" {
                    server.reply(&header, &()).await.unwrap();
                    continue;
                }
                if let (Script::ExistsOnce, false) = (script, refused) {
                    refused = true;
                    server
                        .reply_error(&header, UNIT_EXISTS, &("Unit exists",))
                        .await
                        .unwrap();
                    continue;
                }
                let job = OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap();
                server.reply(&header, &job).await.unwrap();
                let result = match script {
                    Script::Finish(result) => result,
                    Script::ExistsOnce => "done",
                };
                for (id, path, result) in [
                    (6u32, "/org/freedesktop/systemd1/job/6", "failed"),
                    (7, "/org/freedesktop/systemd1/job/7", result),
                ] {
                    let body = (id, OwnedObjectPath::try_from(path).unwrap(), "u", result);
                    server
                        .emit_signal(
                            None::<&str>,
                            MANAGER_PATH,
                            MANAGER_INTERFACE,
                            "JobRemoved",
                            &body,
                        )
                        .await
                        .unwrap();
                }
            }
        });
        let result = tokio::time::timeout(
            Duration::from_secs(3),
            start_scope(&client, Manager::User, "nix-sandbox-mcp-1.scope", 1),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ScopeError::Timeout {
                manager: Manager::User,
                unit: "nix-sandbox-mcp-1.scope".into(),
            })
        });
        manager.abort();
        let calls = calls.lock().unwrap().clone();
        (result, calls)
    })
}

#[test]
fn waits_for_its_own_job_and_ignores_others() {
    let (result, calls) = against_manager(Script::Finish("done"));
    result.unwrap();
    assert_eq!(calls, ["StartTransientUnit"]);
}

#[test]
fn a_failed_job_names_the_unit_and_where_to_look() {
    let (result, _) = against_manager(Script::Finish("failed"));
    let text = result.unwrap_err().to_string();
    assert!(text.contains("nix-sandbox-mcp-1.scope"), "{text}");
    assert!(text.contains("`failed`"), "{text}");
    assert!(
        text.contains("journalctl --user -u nix-sandbox-mcp-1.scope"),
        "{text}"
    );
}

#[test]
fn a_leftover_unit_of_the_same_name_is_reset_and_tried_again() {
    let (result, calls) = against_manager(Script::ExistsOnce);
    result.unwrap();
    assert_eq!(
        calls,
        [
            "StartTransientUnit",
            "ResetFailedUnit",
            "StartTransientUnit"
        ]
    );
}

#[test]
fn each_refusal_names_a_step_that_fits_it() {
    let unit = "nix-sandbox-mcp-1.scope".to_string();
    // Without systemd: root makes its own group, a user is given one.
    let root = step_for(&ScopeError::NoSystemd, 0);
    assert!(
        root.contains("mkdir /sys/fs/cgroup/nix-sandbox-mcp")
            && root.contains("cgroup.subtree_control")
            && !root.contains("systemd-run"),
        "{root}"
    );
    let user = step_for(&ScopeError::NoSystemd, 1001);
    assert!(
        user.contains("chown 1001 /sys/fs/cgroup/nix-sandbox-mcp.user-1001 ")
            && user.contains("/sys/fs/cgroup/nix-sandbox-mcp.user-1001/cgroup.procs")
            && !user.contains("systemd-run"),
        "{user}"
    );
    let not_delegated = ScopeError::NotDelegated {
        dir: "/sys/fs/cgroup/x".into(),
        why: "shared".into(),
    };
    assert_eq!(step_for(&not_delegated, 1001), user);
    // A fix the refusal already found is the step.
    let no_bus = ScopeError::NoBus {
        manager: Manager::User,
        tried: "nothing".into(),
        fix: "log in".into(),
    };
    assert_eq!(step_for(&no_bus, 1001), "log in");
    let refused = ScopeError::Refused {
        manager: Manager::User,
        unit: unit.clone(),
        error: "denied".into(),
        fix: "; the manager does not let this user start units",
    };
    assert_eq!(
        step_for(&refused, 1001),
        "the manager does not let this user start units"
    );
    // Otherwise: run the server in a scope of the manager that was asked.
    for (manager, uid, asked) in [
        (
            Manager::User,
            1001,
            "systemd-run --user --scope -p Delegate=yes",
        ),
        (Manager::System, 0, "systemd-run --scope -p Delegate=yes"),
    ] {
        let timeout = ScopeError::Timeout {
            manager,
            unit: unit.clone(),
        };
        assert!(step_for(&timeout, uid).contains(asked), "{manager}");
        let refused = ScopeError::Refused {
            manager,
            unit: unit.clone(),
            error: "no".into(),
            fix: "",
        };
        assert!(step_for(&refused, uid).contains(asked), "{manager}");
    }
    assert!(step_for(&ScopeError::NoCgroup2, 1001).contains("--cgroupns=private"));
}

#[test]
fn without_systemd_a_group_of_someone_elses_does_not_point_at_systemd_run() {
    let dir = fake_cgroup("42\n");
    let owner = fs::metadata(dir.path()).unwrap().uid();
    let why = why(check_delegated_as(dir.path(), owner + 1, false, 42));
    assert!(why.contains(&format!("belongs to uid {owner}")), "{why}");
    assert!(!why.contains("systemd-run"), "{why}");
}
