//! The renderer against [`Plan`] values alone: no environment, no host.
//! Each operation and setting becomes exactly these options.

use std::path::PathBuf;

use super::*;
use crate::limits::Limits;

/// A plan with nothing in it but what every plan has.
fn bare() -> Plan {
    Plan {
        network: NetworkNamespace::Own,
        uid: 1000,
        gid: 1000,
        hostname: "sandbox".into(),
        refuse_nested_userns: true,
        vars: vec![],
        ops: vec![],
        workdir: "/workspace".into(),
        outside: OutsideMounts::default(),
        stage: None,
        code: Code::None,
        seccomp_allow: vec![],
        limits: Limits::resolve(Default::default()),
        command: vec!["true".into()],
    }
}

const ALL: Features = Features {
    disable_userns: true,
    add_seccomp_fd: true,
    json_status_fd: true,
};

fn render(plan: &Plan, features: Features, wiring: &Wiring) -> Vec<String> {
    options(plan, features, wiring)
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// What every plan renders to before its mounts (and with no wiring).
const PRELUDE: &str = "--unshare-user --unshare-ipc --unshare-pid --unshare-uts --unshare-cgroup \
    --unshare-net --uid 1000 --gid 1000 --hostname sandbox --disable-userns --cap-drop ALL \
    --die-with-parent --new-session --clearenv";

#[test]
fn a_bare_plan_is_every_namespace_no_capability_and_nothing_mounted() {
    let a = render(&bare(), ALL, &Wiring::default());
    assert_eq!(a, words(&format!("{PRELUDE} --chdir /workspace")));
}

#[test]
fn a_given_network_namespace_is_not_made_again() {
    let plan = Plan {
        network: NetworkNamespace::Given,
        ..bare()
    };
    let a = render(&plan, ALL, &Wiring::default());
    assert_eq!(
        a,
        words(&format!("{PRELUDE} --chdir /workspace").replace(" --unshare-net", ""))
    );
}

#[test]
fn variables_are_set_in_order_after_clearing_and_the_go_pipe_is_named_by_its_descriptor() {
    let plan = Plan {
        vars: vec![
            ("PATH".into(), Value::Text("/bin".into())),
            ("BASH_ENV".into(), Value::GoPipe),
            ("PATH".into(), Value::Text("/usr/bin".into())),
        ],
        ..bare()
    };
    let wiring = Wiring {
        go: Some(9),
        ..Wiring::default()
    };
    let a = render(&plan, ALL, &wiring);
    let expected = format!(
        "{PRELUDE} --setenv PATH /bin --setenv BASH_ENV /dev/fd/9 --setenv PATH /usr/bin --chdir /workspace"
    );
    assert_eq!(a, words(&expected));
}

#[test]
fn each_operation_becomes_its_options() {
    let bind = |source: &str, access| Op::Bind {
        source: Source::Host(source.into()),
        target: "/t".into(),
        access,
    };
    let cases: Vec<(Op, &str)> = vec![
        (bind("/s", Access::ReadOnly), "--ro-bind /s /t"),
        (bind("/s", Access::ReadWrite), "--bind /s /t"),
        (bind("/s", Access::Devices), "--dev-bind /s /t"),
        (
            Op::Bind {
                source: Source::CodeFile,
                target: "/workspace/.main.py".into(),
                access: Access::ReadOnly,
            },
            "--ro-bind /run/code/7 /workspace/.main.py",
        ),
        (
            Op::Symlink {
                target: "usr/bin".into(),
                link: "/bin".into(),
            },
            "--symlink usr/bin /bin",
        ),
        (
            Op::Proc {
                target: "/proc".into(),
            },
            "--proc /proc",
        ),
        (
            Op::Dev {
                target: "/dev".into(),
            },
            "--dev /dev",
        ),
        (
            Op::Tmpfs {
                target: "/tmp".into(),
                size_bytes: Some(4096),
                mode: Some(0o1777),
            },
            "--perms 1777 --size 4096 --tmpfs /tmp",
        ),
        (
            Op::Tmpfs {
                target: "/proc/acpi".into(),
                size_bytes: None,
                mode: None,
            },
            "--tmpfs /proc/acpi",
        ),
        (
            Op::Dir {
                target: "/etc".into(),
            },
            "--dir /etc",
        ),
        (Op::RemountReadOnly { target: "/".into() }, "--remount-ro /"),
        (
            Op::Sync {
                pipe: Pipe::ProcMasks,
                target: "/tmp/.sync".into(),
            },
            "--file 5 /tmp/.sync",
        ),
        (
            Op::StoreView {
                store: "/nix/store".into(),
                closure: vec!["/nix/store/aaa-x".into()],
            },
            "--size 65536 --tmpfs /nix/store --file 6 /nix/store/.nsm-view-sync",
        ),
    ];
    let wiring = Wiring {
        code_file: Some(std::path::Path::new("/run/code/7")),
        proc_masks: Some(5),
        store_view: Some(6),
        ..Wiring::default()
    };
    for (op, expected) in cases {
        let plan = Plan {
            ops: vec![op.clone()],
            ..bare()
        };
        let a = render(&plan, ALL, &wiring);
        assert_eq!(
            a,
            words(&format!("{PRELUDE} --chdir /workspace {expected}")),
            "{op:?}"
        );
    }
}

#[test]
fn the_wiring_comes_before_the_mounts_which_keep_their_order() {
    let plan = Plan {
        ops: vec![
            Op::Proc {
                target: "/proc".into(),
            },
            Op::RemountReadOnly { target: "/".into() },
        ],
        workdir: "/project".into(),
        ..bare()
    };
    let wiring = Wiring {
        block: Some(11),
        seccomp: vec![8, 9],
        status: Some(10),
        ..Wiring::default()
    };
    let a = render(&plan, ALL, &wiring);
    let expected = format!(
        "{PRELUDE} --add-seccomp-fd 8 --add-seccomp-fd 9 --json-status-fd 10 --block-fd 11 \
         --chdir /project --proc /proc --remount-ro /"
    );
    assert_eq!(a, words(&expected));
}

#[test]
fn an_older_bubblewrap_gets_what_it_understands() {
    let wiring = Wiring {
        seccomp: vec![8, 9],
        status: Some(10),
        ..Wiring::default()
    };
    let a = render(&bare(), Features::default(), &wiring);
    // One seccomp program (the main filter), no status, no userns refusal.
    let expected =
        format!("{PRELUDE} --seccomp 8 --chdir /workspace").replace(" --disable-userns", "");
    assert_eq!(a, words(&expected));
}

#[test]
#[should_panic(expected = "the plan needs the code file")]
fn a_plan_binding_the_code_file_needs_one_wired() {
    let plan = Plan {
        ops: vec![Op::Bind {
            source: Source::CodeFile,
            target: "/workspace/.main.py".into(),
            access: Access::ReadOnly,
        }],
        ..bare()
    };
    render(&plan, ALL, &Wiring::default());
}

#[test]
#[should_panic(expected = "the plan needs the store view's pipe")]
fn a_plan_with_a_store_view_needs_its_pipe_wired() {
    let plan = Plan {
        ops: vec![Op::StoreView {
            store: "/nix/store".into(),
            closure: vec![],
        }],
        ..bare()
    };
    render(&plan, ALL, &Wiring::default());
}

#[test]
fn sources_are_the_host_paths_bound_then_mounted_from_outside_never_the_code_file() {
    let host = |p: &str| Source::Host(p.into());
    let plan = Plan {
        ops: vec![
            Op::Bind {
                source: host("/usr"),
                target: "/usr".into(),
                access: Access::ReadOnly,
            },
            Op::Bind {
                source: Source::CodeFile,
                target: "/run/.main.py".into(),
                access: Access::ReadOnly,
            },
            Op::Tmpfs {
                target: "/tmp".into(),
                size_bytes: None,
                mode: None,
            },
        ],
        outside: OutsideMounts {
            mounts: vec![
                OutsideMount {
                    source: host("/run/nsm/etc"),
                    target: "/etc".into(),
                    read_only: true,
                },
                OutsideMount {
                    source: Source::CodeFile,
                    target: "/tmp/.main.py".into(),
                    read_only: true,
                },
            ],
            read_only_root: false,
        },
        ..bare()
    };
    assert_eq!(
        sources(&plan),
        vec![PathBuf::from("/usr"), PathBuf::from("/run/nsm/etc")]
    );
}
