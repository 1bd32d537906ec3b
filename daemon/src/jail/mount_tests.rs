//! Tests of the project's mounts, the caches, and what the nest stages and
//! mounts from outside, on the argv and the plan's outside mounts.

use super::test_calls::{
    Call, argv, argv_staged, bare_call, bind_sources, env, has, options, outside_call,
    outside_mounts, overlay_project, pos, read_write_project,
};
use super::*;
use crate::environment::RootFs;
use crate::network::NetworkSetting;

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
    // With a store view, the view's mount (the last) makes the root
    // read-only from outside: bubblewrap would read a mount table holding
    // every store path to do it. The sync file is on a tmpfs of its own,
    // not held open on the root.
    let view = Call {
        store_view: Some(7),
        ..outside_call(&closure_env, None)
    };
    assert!(!outside_mounts(&view).read_only_root);
    let a = options(&view);
    assert_eq!(
        &a[a.len() - 7..],
        &[
            "--size",
            &SYNC_TMPFS_BYTES.to_string(),
            "--tmpfs",
            "/nix/store",
            "--file",
            "7",
            "/nix/store/.nsm-view-sync"
        ]
    );
    assert!(!has(&a, &["--remount-ro", "/"]), "{a:?}");
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
fn project_read_only_unless_configured() {
    let p = ProjectMount {
        access: ProjectAccess::ReadOnly,
        ..read_write_project(&[])
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
        access: ProjectAccess::ReadOnly,
        ..read_write_project(&[])
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
