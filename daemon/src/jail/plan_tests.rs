//! Tests of the sandbox policy on the argv itself: every rule as the
//! bubblewrap options it becomes (namespaces, network, variables, the code,
//! /proc, /dev, the root and its store). The project, caches and what the
//! nest mounts from outside are in `mount_tests.rs`.

use super::test_calls::{
    Call, argv, argv_staged, bare_call, bind_sources, env, has, options, pos, read_write_project,
};
use super::*;
use crate::environment::RootFs;
use crate::network::NetworkSetting;

#[test]
fn every_namespace_and_no_capabilities() {
    let a = argv(&env(), None, &[]);
    for ns in [
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup",
        "--unshare-net",
    ] {
        assert!(a.iter().any(|x| x == ns), "{ns} missing");
    }
    assert!(has(&a, &["--cap-drop", "ALL"]));
    assert!(has(&a, &["--disable-userns"]));
    assert!(has(&a, &["--die-with-parent"]));
    assert!(has(&a, &["--new-session"]));
    assert!(has(&a, &["--uid", "1000"]));
    assert!(!a.iter().any(|x| x == "--share-net"));
}

#[test]
fn a_given_network_namespace_replaces_bubblewraps_but_never_for_an_environment_with_network() {
    let plain = env();
    let given = |e| {
        options(&Call {
            network_given: true,
            ..bare_call(e, None)
        })
    };
    let a = given(&plain);
    assert!(!a.iter().any(|x| x == "--unshare-net"), "{a:?}");
    assert!(!a.iter().any(|x| x == "--share-net"), "{a:?}");
    // Every other namespace is still bubblewrap's to make.
    assert!(has(
        &a,
        &[
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup",
            "--uid"
        ]
    ));
    let mut networked = env();
    networked.network = NetworkSetting::Proxied(crate::network::Policy::any_public());
    assert!(given(&networked).iter().any(|x| x == "--unshare-net"));
}

#[test]
fn network_only_through_the_proxy_and_only_when_opted_in() {
    let mut e = env();
    e.network = NetworkSetting::Proxied(crate::network::Policy::any_public());
    let a = argv(&e, None, &[]);
    // Its own namespace all the same: the proxy is the only way out.
    assert!(a.iter().any(|x| x == "--unshare-net"));
    assert!(has(&a, &["--ro-bind", "/etc/ssl/certs", "/etc/ssl/certs"]));
    assert!(has(
        &a,
        &["--setenv", "HTTPS_PROXY", "http://127.0.0.1:3128"]
    ));
    assert!(!a.iter().any(|x| x.contains("resolv.conf")));
    let a = argv(&env(), None, &[]);
    assert!(a.iter().any(|x| x == "--unshare-net"));
    assert!(
        !a.iter()
            .any(|x| x == "/etc/ssl/certs" || x.contains("PROXY"))
    );
}

#[test]
fn environment_is_cleared_then_minimal() {
    let inherited = vec![("DATABASE_URL".to_string(), "pg://x".to_string())];
    let a = argv(&env(), None, &inherited);
    let clear = pos(&a, &["--clearenv"]);
    for (k, v) in [
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/workspace"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
        ("PYTHONUNBUFFERED", "1"),
        ("DATABASE_URL", "pg://x"),
    ] {
        assert!(pos(&a, &["--setenv", k, v]) > clear, "{k}");
    }
    assert_eq!(a.iter().filter(|x| *x == "--setenv").count(), 7);
}

#[test]
fn host_identifying_proc_files_are_masked_over_the_new_proc() {
    let env = env();
    let a = options(&bare_call(&env, None));
    let proc_at = pos(&a, &["--proc", "/proc"]);
    assert!(pos(&a, &["--ro-bind", "/run/nsm/empty", "/proc/cmdline"]) > proc_at);
    let emptied = pos(&a, &["--tmpfs", "/proc/acpi", "--remount-ro", "/proc/acpi"]);
    assert!(emptied > proc_at);
}

#[test]
fn dev_is_read_only_once_dev_shm_is_mounted() {
    let env = env();
    let a = argv_staged(&env, None, &[], None);
    let shm = a.iter().rposition(|x| x == "/dev/shm").unwrap();
    assert!(pos(&a, &["--remount-ro", "/dev"]) > shm, "{a:?}");
    // Staged, /dev/shm is mounted in /dev before bubblewrap binds it.
    let a = argv_staged(&env, None, &[], Some(Path::new("/run/nsm/stage")));
    let dev = pos(&a, &["--dev-bind", "/run/nsm/stage/dev", "/dev"]);
    assert!(pos(&a, &["--remount-ro", "/dev"]) > dev, "{a:?}");
}

#[test]
fn the_root_is_read_only_once_everything_is_mounted() {
    for staged in [None, Some(Path::new("/run/nsm/stage"))] {
        let a = argv_staged(&env(), None, &[], staged);
        assert_eq!(&a[a.len() - 2..], &["--remount-ro", "/"]);
    }
}

#[test]
fn writable_filesystems_are_sized_tmpfs() {
    let a = argv(&env(), None, &[]);
    let size = env().limits.workspace_bytes.to_string();
    for dir in ["/workspace", "/tmp", "/dev/shm"] {
        let i = pos(&a, &["--tmpfs", dir]);
        assert_eq!(
            &a[i - 2..i],
            &["--size".to_string(), size.clone()],
            "--size must directly precede --tmpfs {dir}"
        );
    }
    assert!(has(&a, &["--chdir", "/workspace"]));
}

#[test]
fn code_is_a_file_not_an_argument() {
    let a = argv(&env(), None, &[]);
    assert!(has(
        &a,
        &["--ro-bind", "/run/nsm/code/1", "/workspace/.main.py"]
    ));
    // after the tmpfs it lives in
    assert!(pos(&a, &["--ro-bind", "/run/nsm/code/1"]) > pos(&a, &["--tmpfs", "/workspace"]));
    assert!(has(&a, &["--block-fd", "11"]));
    assert!(has(&a, &["--add-seccomp-fd", "8", "--add-seccomp-fd", "9"]));
    assert!(has(&a, &["--json-status-fd", "10"]));
    // The command follows on bubblewrap's own command line, with the path only.
    assert!(!a.iter().any(|x| x == "--"));
    assert_eq!(
        env().command_for(&code_path(&env())),
        ["python3", "/workspace/.main.py"]
    );
}

#[test]
fn a_call_may_start_elsewhere_than_the_workspace() {
    let e = env();
    let a = options(&Call {
        workdir: Some("/project/sub"),
        ..bare_call(&e, None)
    });
    assert!(has(&a, &["--chdir", "/project/sub"]));
    assert!(!has(&a, &["--chdir", "/workspace"]));
}

#[test]
fn host_root_binds_system_dirs_and_prepared_etc() {
    let a = argv(&env(), None, &[]);
    assert!(has(&a, &["--ro-bind", "/usr", "/usr"]));
    assert!(has(&a, &["--symlink", "usr/bin", "/bin"]));
    assert!(has(&a, &["--ro-bind", "/run/nsm/etc", "/etc"]));
    // host /etc files go on top of the prepared /etc
    assert!(pos(&a, &["--ro-bind", "/etc/ld.so.cache"]) > pos(&a, &["--ro-bind", "/run/nsm/etc"]));
    assert!(!a.iter().any(|x| x == "/home" || x == "/root"));
}

#[test]
fn closure_root_shows_only_the_closure() {
    let mut e = env();
    e.root = RootFs::Closure {
        store_paths: vec![
            "/nix/store/aaa-python".into(),
            "/nix/store/bbb-glibc".into(),
        ],
        links: vec![("/bin/sh".into(), "/nix/store/ccc-bash/bin/bash".into())],
    };
    let a = argv(&e, None, &[]);
    assert!(has(
        &a,
        &[
            "--ro-bind",
            "/nix/store/aaa-python",
            "/nix/store/aaa-python"
        ]
    ));
    assert!(has(
        &a,
        &["--ro-bind", "/nix/store/bbb-glibc", "/nix/store/bbb-glibc"]
    ));
    assert!(has(
        &a,
        &["--symlink", "/nix/store/ccc-bash/bin/bash", "/bin/sh"]
    ));
    assert!(!a.iter().any(|x| x == "/usr" || x == "/etc/ld.so.cache"));
}

#[test]
fn a_store_view_replaces_the_closures_binds_with_one() {
    let mut e = env();
    let closure: Vec<PathBuf> = vec![
        "/nix/store/aaa-python".into(),
        "/nix/store/bbb-glibc".into(),
    ];
    e.root = RootFs::Closure {
        store_paths: closure.clone(),
        links: vec![("/bin/sh".into(), "/nix/store/ccc-bash/bin/bash".into())],
    };
    let a = options(&Call {
        store_view: Some(7),
        ..bare_call(&e, None)
    });
    // The view is mounted from outside while bubblewrap writes the sync
    // file, after every other mount; the root goes read-only with it.
    let sync = pos(
        &a,
        &[
            "--tmpfs",
            "/nix/store",
            "--file",
            "7",
            "/nix/store/.nsm-view-sync",
        ],
    );
    assert!(sync > pos(&a, &["--tmpfs", "/workspace"]));
    assert_eq!(sync + 5, a.len(), "the last: {a:?}");
    assert!(!a.iter().any(|x| x == "--ro-bind-fd"));
    assert!(
        !a.iter()
            .any(|x| x == "/nix/store/aaa-python" || x == "/nix/store/bbb-glibc")
    );
    assert!(has(
        &a,
        &["--symlink", "/nix/store/ccc-bash/bin/bash", "/bin/sh"]
    ));
    // Paths in several directories have no one store to bind over: each is bound.
    e.root = RootFs::Closure {
        store_paths: vec![
            "/nix/store/aaa-python".into(),
            "/opt/store/bbb-glibc".into(),
        ],
        links: vec![],
    };
    let a = options(&Call {
        store_view: Some(7),
        ..bare_call(&e, None)
    });
    assert!(!a.iter().any(|x| x == "--file"));
    assert!(has(
        &a,
        &["--ro-bind", "/opt/store/bbb-glibc", "/opt/store/bbb-glibc"]
    ));
    assert_eq!(store_dir(&closure), Some(Path::new("/nix/store")));
    assert_eq!(store_dir(&[]), None);
}

#[test]
fn a_hook_variable_is_set_after_every_other_and_so_wins() {
    let mut env = env();
    env.vars.insert("PYTHONPATH".into(), "/lib/a".into());
    let inherited = [("PYTHONPATH".to_string(), "/lib/b".to_string())];
    let hook = [(
        "PYTHONPATH".to_string(),
        Value::Text("/tmp/.nsm-prestart:/lib/b".to_string()),
    )];
    let a = options(&Call {
        inherited: &inherited,
        hook_vars: &hook,
        ..bare_call(&env, None)
    });
    let last_setenv = a.iter().rposition(|x| x == "--setenv").unwrap();
    assert_eq!(
        a[last_setenv..last_setenv + 3],
        ["--setenv", "PYTHONPATH", "/tmp/.nsm-prestart:/lib/b"]
    );
    assert!(pos(&a, &["--setenv", "PYTHONPATH", "/lib/b"]) < last_setenv);
}

#[test]
fn bind_sources_are_the_first_argument_of_every_bind() {
    let env = env();
    let protected = [".git/".to_string()];
    let project = read_write_project(&protected);
    let call = Call {
        code_file: Some((Path::new("/run/nsm/code/1"), "/workspace/.main.py")),
        protected: &protected,
        ..bare_call(&env, Some(&project))
    };
    let argv = options(&call);
    // The code file is the caller's (made per sandbox), not the plan's.
    let expected: Vec<String> = argv
        .windows(2)
        .filter(|w| w[0].ends_with("bind") || w[0].ends_with("bind-try"))
        .map(|w| w[1].clone())
        .filter(|source| source != "/run/nsm/code/1")
        .collect();
    assert!(has(&argv, &["--ro-bind", "/run/nsm/code/1"]), "{argv:?}");
    let sources: Vec<String> = bind_sources(&call)
        .into_iter()
        .map(|p| p.into_os_string().into_string().unwrap())
        .collect();
    assert_eq!(sources, expected);
    assert!(sources.contains(&"/usr".to_string()), "{sources:?}");
}
