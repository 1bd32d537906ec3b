//! Tests of the sandbox policy on the argv itself: every rule as the
//! bubblewrap options it becomes.

use super::*;
use crate::environment::RootFs;
use crate::environment::{Limits, Origin};
use crate::network::NetworkSetting;

fn layout() -> HostLayout {
    HostLayout {
        system_dirs: vec!["/usr".into()],
        system_links: vec![("usr/bin".into(), "/bin".into())],
        etc_host: vec!["/etc/ld.so.cache".into()],
        etc_network: vec!["/etc/ssl/certs".into()],
        proc_masked_files: vec!["/proc/cmdline".into()],
        proc_masked_dirs: vec!["/proc/acpi".into()],
        empty_file: "/run/nsm/empty".into(),
        etc_dir: "/run/nsm/etc".into(),
        features: Features {
            disable_userns: true,
            add_seccomp_fd: true,
            json_status_fd: true,
        },
    }
}

fn env() -> Environment {
    Environment {
        name: "python".into(),
        description: "Python".into(),
        origin: Origin::Host {
            program: "/usr/bin/python3".into(),
        },
        interpreter: vec!["python3".into(), "{file}".into()],
        file_name: ".main.py".into(),
        root: RootFs::Host { extra: vec![] },
        path: vec!["/usr/bin".into(), "/bin".into()],
        vars: [("PYTHONUNBUFFERED".to_string(), "1".to_string())].into(),
        limits: Limits::resolve(Default::default()),
        settings: Default::default(),
        network: NetworkSetting::Off,
        seccomp_allow: vec![],
        caches: vec![],
        cache_bytes: 0,
        tools: vec![],
        kind: None,
    }
}

/// One sandbox and its wiring, as the tests write them: a [`Sandbox`]
/// whose pipes are given as the descriptors bubblewrap reads them from.
#[derive(Clone)]
struct Call<'a> {
    env: &'a Environment,
    project: Option<&'a ProjectMount>,
    /// The host's code file and where it appears.
    code_file: Option<(&'a Path, &'a str)>,
    block_fd: Option<i32>,
    seccomp_fds: Vec<i32>,
    status_fd: Option<i32>,
    inherited: &'a [(String, String)],
    workdir: Option<&'a str>,
    staged: Option<&'a Path>,
    /// A store view's pipe.
    store_view: Option<i32>,
    /// The /proc masks' pipe ([`ProcMasks::FromOutside`]).
    proc_masks_sync: Option<i32>,
    protected: &'a [String],
    caches: &'a [CacheMount],
    hook_vars: &'a [(String, Value)],
    network_given: bool,
}

fn argv(
    env: &Environment,
    project: Option<&ProjectMount>,
    inherited: &[(String, String)],
) -> Vec<String> {
    argv_staged(env, project, inherited, None)
}

fn argv_staged(
    env: &Environment,
    project: Option<&ProjectMount>,
    inherited: &[(String, String)],
    staged: Option<&Path>,
) -> Vec<String> {
    options(&Call {
        code_file: Some((Path::new("/run/nsm/code/1"), "/workspace/.main.py")),
        block_fd: Some(11),
        seccomp_fds: vec![8, 9],
        status_fd: Some(10),
        inherited,
        staged,
        ..bare_call(env, project)
    })
}

/// A call with nothing but an environment and a project.
fn bare_call<'a>(env: &'a Environment, project: Option<&'a ProjectMount>) -> Call<'a> {
    Call {
        env,
        project,
        code_file: None,
        block_fd: None,
        seccomp_fds: vec![],
        status_fd: None,
        inherited: &[],
        workdir: None,
        staged: None,
        store_view: None,
        proc_masks_sync: None,
        protected: &[],
        caches: &[],
        hook_vars: &[],
        network_given: false,
    }
}

const COMMAND: &[String] = &[];

fn plan_of(call: &Call) -> Plan {
    plan(
        &layout(),
        &Sandbox {
            env: call.env,
            project: call.project,
            code_at: call.code_file.map(|(_, at)| at),
            inherited: call.inherited,
            workdir: call.workdir,
            staged: call.staged,
            store_view: call.store_view.is_some(),
            proc_masks: match call.proc_masks_sync {
                Some(_) => ProcMasks::FromOutside,
                None => ProcMasks::Bubblewrap,
            },
            network_given: call.network_given,
            protected: call.protected,
            caches: call.caches,
            hook_vars: call.hook_vars,
            command: COMMAND,
        },
    )
}

fn wiring<'a>(call: &Call<'a>) -> Wiring<'a> {
    Wiring {
        code_file: call.code_file.map(|(file, _)| file),
        block: call.block_fd,
        seccomp: call.seccomp_fds.clone(),
        status: call.status_fd,
        proc_masks: call.proc_masks_sync,
        store_view: call.store_view,
        go: None,
    }
}

fn options(call: &Call) -> Vec<String> {
    super::options(&plan_of(call), layout().features, &wiring(call))
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
}

fn outside_mounts(call: &Call) -> OutsideMounts {
    plan_of(call).outside
}

/// Every bind's source in the options, then every mount from outside's.
fn bind_sources(call: &Call) -> Vec<PathBuf> {
    sources(&plan_of(call))
}

/// True when `needle` appears in `hay` as consecutive arguments.
fn has(hay: &[String], needle: &[&str]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
}

fn pos(hay: &[String], needle: &[&str]) -> usize {
    hay.windows(needle.len())
        .position(|w| w.iter().zip(needle).all(|(a, b)| a == b))
        .unwrap_or_else(|| panic!("{needle:?} not in {hay:?}"))
}

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

/// A staged call whose /etc and staged filesystems are mounted from
/// outside at the masks' sync (descriptor 12), its code written into the
/// staged /workspace.
fn outside_call<'a>(env: &'a Environment, project: Option<&'a ProjectMount>) -> Call<'a> {
    Call {
        staged: Some(Path::new("/run/nsm/stage")),
        proc_masks_sync: Some(12),
        ..bare_call(env, project)
    }
}

fn overlay_project() -> ProjectMount {
    ProjectMount {
        access: ProjectAccess::Overlay,
        overlay: true,
        ..read_write_project(&[])
    }
}

#[test]
fn etc_and_staged_filesystems_mounted_from_outside_get_mount_points_before_the_masks_sync_and_no_binds()
 {
    let env = env();
    let project = overlay_project();
    let call = outside_call(&env, Some(&project));
    let outside = outside_mounts(&call);
    let mounts: Vec<(String, String, bool)> = outside
        .mounts
        .iter()
        .map(|m| {
            let s = |p: &Path| p.to_str().unwrap().to_string();
            let Source::Host(source) = &m.source else {
                panic!("{m:?}")
            };
            (s(source), s(&m.target), m.read_only)
        })
        .collect();
    let expected = [
        ("/run/nsm/etc", "/etc", true),
        ("/etc/ld.so.cache", "/etc/ld.so.cache", true),
        ("/run/nsm/stage/dev", "/dev", true),
        ("/run/nsm/stage/tmp", "/tmp", false),
        ("/run/nsm/stage/workspace", "/workspace", false),
        ("/run/nsm/stage/project", "/project", false),
    ]
    .map(|(a, b, r)| (a.to_string(), b.to_string(), r));
    assert_eq!(mounts, expected);
    assert!(outside.read_only_root);
    let a = options(&call);
    let sync = pos(&a, &["--file", "12", PROC_MASKS_SYNC_FILE]);
    for at in ["/etc", "/dev", "/tmp", "/workspace", "/project"] {
        assert!(pos(&a, &["--dir", at]) < sync, "{at}: {a:?}");
    }
    // The host entries' mount points are in the sandbox's /etc already.
    assert!(!a.iter().any(|x| x == "/etc/ld.so.cache"), "{a:?}");
    for source in ["/run/nsm/stage", "/run/nsm/etc", "/etc/ld.so.cache"] {
        assert!(!a.iter().any(|x| x.starts_with(source)), "{source}: {a:?}");
    }
    assert!(pos(&a, &["--proc", "/proc"]) < sync);
    // /dev and the root are made read-only from outside; the sync file is
    // on a tmpfs of its own, so that the root has no file open for writing.
    assert!(!a.iter().any(|x| x == "--remount-ro"), "{a:?}");
    assert_eq!(
        pos(
            &a,
            &["--size", &SYNC_TMPFS_BYTES.to_string(), "--tmpfs", "/tmp"]
        ) + 4,
        sync
    );
    // Where bubblewrap runs, their sources must be there too.
    let sources = bind_sources(&call);
    for m in &outside.mounts {
        let Source::Host(source) = &m.source else {
            panic!("{m:?}")
        };
        assert!(sources.contains(source), "{m:?}: {sources:?}");
    }
    // A networked environment's entries come along.
    let mut networked = env.clone();
    networked.network = NetworkSetting::Proxied(crate::network::Policy::any_public());
    let with_network = Call {
        env: &networked,
        ..call.clone()
    };
    assert!(
        outside_mounts(&with_network)
            .mounts
            .iter()
            .any(|m| m.target == Path::new("/etc/ssl/certs") && m.read_only)
    );
    // Without the masks' sync there is no moment to mount them: bound.
    let a = options(&Call {
        proc_masks_sync: None,
        ..call.clone()
    });
    assert!(has(&a, &["--ro-bind", "/run/nsm/etc", "/etc"]));
    assert!(has(
        &a,
        &["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    ));
    assert!(has(&a, &["--dev-bind", "/run/nsm/stage/dev", "/dev"]));
    assert!(has(
        &a,
        &["--bind", "/run/nsm/stage/workspace", "/workspace"]
    ));
    assert!(has(&a, &["--bind", "/run/nsm/stage/project", "/project"]));
    assert!(has(&a, &["--remount-ro", "/dev"]));
    assert_eq!(&a[a.len() - 2..], &["--remount-ro", "/"]);
    // A read-write project is the host's, bound by bubblewrap either way.
    let rw = read_write_project(&[]);
    let a = options(&Call {
        project: Some(&rw),
        ..call.clone()
    });
    assert!(has(&a, &["--bind", "/home/u/proj", "/project"]));
    assert!(!has(&a, &["--dir", "/project"]));
}

#[test]
fn the_root_stays_bubblewraps_to_make_read_only_when_bubblewrap_mounts_after_the_sync() {
    let env = env();
    let mut closure_env = env.clone();
    closure_env.root = RootFs::Closure {
        store_paths: vec!["/nix/store/aaa-python".into()],
        links: vec![],
    };
    let rw = read_write_project(&[]);
    let caches = [CacheMount {
        host: "/home/u/.cache/pip".into(),
        at: "/workspace/.cache/pip".into(),
    }];
    let overlay = overlay_project();
    let cases = [
        ("a read-write project", outside_call(&env, Some(&rw))),
        (
            "a cache",
            Call {
                caches: &caches,
                ..outside_call(&env, Some(&overlay))
            },
        ),
        (
            "a host code file (a session's agent)",
            Call {
                code_file: Some((Path::new("/run/nsm/code/1"), "/run/nsm/.main.py")),
                ..outside_call(&env, None)
            },
        ),
        (
            "a store view",
            Call {
                store_view: Some(7),
                ..outside_call(&closure_env, None)
            },
        ),
    ];
    for (what, call) in cases {
        let outside = outside_mounts(&call);
        assert!(!outside.read_only_root, "{what}");
        let a = options(&call);
        assert_eq!(&a[a.len() - 2..], &["--remount-ro", "/"], "{what}");
        assert!(
            !has(&a, &["--size", &SYNC_TMPFS_BYTES.to_string()]),
            "{what}: {a:?}"
        );
        // /dev is read-only from outside all the same.
        assert!(!has(&a, &["--remount-ro", "/dev"]), "{what}: {a:?}");
    }
    // A host code file is bubblewrap's to bind, where it makes its
    // directory.
    let agent = Call {
        code_file: Some((Path::new("/run/nsm/code/1"), "/run/nsm/.main.py")),
        ..outside_call(&env, None)
    };
    assert!(has(
        &options(&agent),
        &["--ro-bind", "/run/nsm/code/1", "/run/nsm/.main.py"]
    ));
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
fn project_read_only_unless_configured() {
    let p = ProjectMount {
        host_path: "/home/u/proj".into(),
        mount_point: "/project".into(),
        access: ProjectAccess::ReadOnly,
        overlay: false,
        downgraded: false,
        protected: Vec::new(),
    };
    let a = argv(&env(), Some(&p), &[]);
    assert!(has(&a, &["--ro-bind", "/home/u/proj", "/project"]));
    // the project is mounted after the tmpfs so a mount point under /workspace works
    assert!(pos(&a, &["--ro-bind", "/home/u/proj"]) > pos(&a, &["--tmpfs", "/workspace"]));
    let rw = ProjectMount {
        access: ProjectAccess::ReadWrite,
        ..p.clone()
    };
    let a = argv(&env(), Some(&rw), &[]);
    assert!(has(&a, &["--bind", "/home/u/proj", "/project"]));
    let a = argv(&env(), None, &[]);
    assert!(!a.iter().any(|x| x == "/project"));
}

#[test]
fn a_staged_project_is_its_overlay_and_never_the_host_tree() {
    let stage = Path::new("/run/nsm/stage");
    let overlay = ProjectMount {
        host_path: "/home/u/proj".into(),
        mount_point: "/project".into(),
        access: ProjectAccess::Overlay,
        overlay: true,
        downgraded: false,
        protected: Vec::new(),
    };
    let read_only = ProjectMount {
        access: ProjectAccess::ReadOnly,
        ..overlay.clone()
    };
    for p in [&overlay, &read_only] {
        let a = argv_staged(&env(), Some(p), &[], Some(stage));
        assert!(
            has(&a, &["--bind", "/run/nsm/stage/project", "/project"]),
            "{a:?}"
        );
        assert!(!a.iter().any(|x| x == "/home/u/proj"), "{a:?}");
    }
    // Where the nest cannot make the overlay: read-only, from the host.
    let no_overlay = ProjectMount {
        overlay: false,
        ..overlay.clone()
    };
    let a = argv_staged(&env(), Some(&no_overlay), &[], Some(stage));
    assert!(has(&a, &["--ro-bind", "/home/u/proj", "/project"]));
    // Read-write is the host's tree, staged or not.
    let rw = ProjectMount {
        access: ProjectAccess::ReadWrite,
        ..overlay
    };
    let a = argv_staged(&env(), Some(&rw), &[], Some(stage));
    assert!(has(&a, &["--bind", "/home/u/proj", "/project"]));
}

/// /home/u/proj read-write at /project, with `protected` protected.
fn read_write_project(protected: &[String]) -> ProjectMount {
    ProjectMount {
        host_path: "/home/u/proj".into(),
        mount_point: "/project".into(),
        access: ProjectAccess::ReadWrite,
        overlay: false,
        downgraded: false,
        protected: protected.to_vec(),
    }
}

#[test]
fn a_read_write_project_keeps_its_protected_files_read_only() {
    let existing = [".mcp.json".to_string(), ".claude/".to_string()];
    let p = read_write_project(&existing);
    let env = env();
    let a = options(&Call {
        protected: &existing,
        ..bare_call(&env, Some(&p))
    });
    let project = pos(&a, &["--bind", "/home/u/proj", "/project"]);
    for (host, inside) in [
        ("/home/u/proj/.mcp.json", "/project/.mcp.json"),
        ("/home/u/proj/.claude", "/project/.claude"),
    ] {
        assert!(pos(&a, &["--ro-bind", host, inside]) > project, "{inside}");
    }
}

#[test]
fn directories_holding_protected_paths_are_mounts_before_the_paths_in_them() {
    let existing = [
        ".git/hooks/".to_string(),
        ".git/config".to_string(),
        "a/b/c.md".to_string(),
        "CLAUDE.md".to_string(),
    ];
    let p = read_write_project(&existing);
    let env = env();
    let a = options(&Call {
        protected: &existing,
        ..bare_call(&env, Some(&p))
    });
    let binds: Vec<_> = a
        .windows(3)
        .filter(|w| w[0] == "--bind" && w[2].starts_with("/project/"))
        .map(|w| w[2].clone())
        .collect();
    // Each once, a directory before the directories in it.
    assert_eq!(binds, ["/project/.git", "/project/a", "/project/a/b"]);
    let git = pos(&a, &["--bind", "/home/u/proj/.git", "/project/.git"]);
    assert!(pos(&a, &["--bind", "/home/u/proj", "/project"]) < git);
    assert!(
        git < pos(
            &a,
            &[
                "--ro-bind",
                "/home/u/proj/.git/hooks",
                "/project/.git/hooks"
            ]
        )
    );
    assert!(
        git < pos(
            &a,
            &[
                "--ro-bind",
                "/home/u/proj/.git/config",
                "/project/.git/config"
            ]
        )
    );
}

#[test]
fn caches_are_bound_writable_over_the_home_and_the_project() {
    let p = ProjectMount {
        host_path: "/home/u/proj".into(),
        mount_point: "/project".into(),
        access: ProjectAccess::ReadOnly,
        overlay: false,
        downgraded: false,
        protected: vec![],
    };
    let caches = [
        CacheMount {
            host: "/home/u/.cache/nix-sandbox-mcp/caches/proj-1/python/a".into(),
            at: "/workspace/.cache/pip".into(),
        },
        CacheMount {
            host: "/home/u/.cache/nix-sandbox-mcp/caches/proj-1/python/b".into(),
            at: "/project/target".into(),
        },
    ];
    let env = env();
    let a = options(&Call {
        caches: &caches,
        ..bare_call(&env, Some(&p))
    });
    let project = pos(&a, &["--ro-bind", "/home/u/proj", "/project"]);
    let workspace = pos(&a, &["--tmpfs", "/workspace"]);
    for c in &caches {
        let at = pos(&a, &["--bind", c.host.to_str().unwrap(), &c.at]);
        assert!(at > project && at > workspace, "{}", c.at);
    }
}

#[test]
fn staged_writable_filesystems_are_directories_of_one_bounded_tmpfs() {
    let a = argv_staged(&env(), None, &[], Some(Path::new("/run/nsm/stage")));
    for (dir, at) in [("tmp", "/tmp"), ("workspace", "/workspace")] {
        assert!(
            has(&a, &["--bind", &format!("/run/nsm/stage/{dir}"), at]),
            "{at}"
        );
    }
    // /dev, with /dev/shm in it, is staged too: one bind instead of `--dev`.
    assert!(
        has(&a, &["--dev-bind", "/run/nsm/stage/dev", "/dev"]),
        "{a:?}"
    );
    assert!(!a.iter().any(|x| x == "--dev" || x == "/dev/shm"), "{a:?}");
    // Only the emptied /proc directories are tmpfs of their own (read-only, empty).
    assert!(!a.iter().any(|x| x == "--size"), "{a:?}");
    for w in a.windows(2).filter(|w| w[0] == "--tmpfs") {
        assert!(w[1].starts_with("/proc/"), "{a:?}");
    }
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
fn proc_masks_mounted_from_outside_leave_bubblewrap_a_sync_file_under_tmp() {
    let env = env();
    for staged in [None, Some(Path::new("/run/nsm/stage"))] {
        let call = Call {
            proc_masks_sync: Some(6),
            staged,
            ..bare_call(&env, None)
        };
        let a = options(&call);
        // Once /proc is mounted, before the sandbox's /tmp hides the file:
        // bubblewrap's tmpfs after it or, staged, the staged /tmp mounted
        // from outside while bubblewrap waits on it.
        let sync = pos(&a, &["--file", "6", PROC_MASKS_SYNC_FILE]);
        assert!(sync > pos(&a, &["--proc", "/proc"]), "{a:?}");
        match staged {
            None => {
                let tmp = a.iter().rposition(|x| x == "/tmp").unwrap();
                assert_eq!(a[tmp - 1], "--tmpfs", "{a:?}");
                assert!(tmp > sync, "{a:?}");
            }
            Some(root) => assert!(
                outside_mounts(&call)
                    .mounts
                    .iter()
                    .any(|m| m.target == Path::new(TMP)
                        && m.source == Source::Host(root.join(staged::TMP))),
                "{a:?}"
            ),
        }
        assert!(
            !a.iter().any(|x| x == "/proc/cmdline" || x == "/proc/acpi"),
            "{a:?}"
        );
    }
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
    // file, after every other mount and before the root goes read-only.
    let sync = pos(
        &a,
        &[
            "--dir",
            "/nix/store",
            "--file",
            "7",
            "/nix/store/.nsm-view-sync",
        ],
    );
    assert!(sync > pos(&a, &["--tmpfs", "/workspace"]));
    assert!(sync < pos(&a, &["--remount-ro", "/"]));
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

#[test]
fn a_code_file_directly_in_the_workspace_has_a_place_in_the_staged_tmpfs() {
    assert_eq!(
        staged_code_path("/workspace/.main.py").as_deref(),
        Some("workspace/.main.py")
    );
    for elsewhere in [
        "/run/nsm/.main.py",
        "/workspace",
        "/workspace/",
        "/workspace/sub/.main.py",
        "/workspaces/.main.py",
    ] {
        assert_eq!(staged_code_path(elsewhere), None, "{elsewhere}");
    }
}
