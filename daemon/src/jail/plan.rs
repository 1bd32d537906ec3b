//! The policy: one kind of sandbox ([`Sandbox`]) becomes a [`Plan`], a
//! typed description with no descriptors and no host state. In order:
//!
//! 1. namespaces and identity: every namespace the sandbox's own; the
//!    network's is bubblewrap's to make, or given by the nest (loopback
//!    only) for an environment without network;
//! 2. variables: cleared, then PATH, HOME, TMPDIR, LANG, TERM, the
//!    environment's, the inherited ones, the proxy's, a hook's last;
//! 3. the root: the host's system directories or the closure (a store view
//!    last of all), read-only; /etc (the server's, with the host entries it
//!    needs); /proc and its masks; /dev; the writable filesystems (each a
//!    sized tmpfs, or directories of the staged tmpfs); the project; the
//!    caches; the code file; then the root made read-only;
//! 4. what the nest mounts from outside ([`OutsideMounts`]) and stages
//!    ([`Stage`]), derived from the same steps;
//! 5. seccomp policy, limits and the command.

use std::path::{Path, PathBuf};

use super::{
    CacheMount, HOSTNAME, HostLayout, PROC_MASKS_SYNC_FILE, ProjectAccess, ProjectMount,
    SANDBOX_GID, SANDBOX_UID, SYNC_TMPFS_BYTES, TMP, WORKSPACE, protected_path_dirs, staged,
    staged_code_path, store_dir,
};
use crate::environment::{Environment, RootFs};
use crate::limits::Limits;

/// One kind of sandbox: what a plan is made from.
#[derive(Debug, Clone)]
pub struct Sandbox<'a> {
    pub env: &'a Environment,
    pub project: Option<&'a ProjectMount>,
    /// Where the code file appears in the sandbox; `None` for a command
    /// run as is, which reads none.
    pub code_at: Option<&'a str>,
    /// Values of the `inherit_env` variables from the server's environment.
    pub inherited: &'a [(String, String)],
    /// Where the command starts, when not in [`WORKSPACE`].
    pub workdir: Option<&'a str>,
    /// The root of the sandbox's staged tmpfs (see [`staged`]), when the
    /// nest stages its writable filesystems and its view of the project;
    /// without it bubblewrap makes the writable filesystems itself, and
    /// the project is bound from the host.
    pub staged: Option<&'a Path>,
    /// The closure comes as a store view (see `exec::nest::view`), mounted
    /// over the store from outside once bubblewrap has made every other
    /// mount. Without it each store path is bound.
    pub store_view: bool,
    pub proc_masks: ProcMasks,
    /// The process that becomes bubblewrap is already in a network
    /// namespace of the sandbox's own, holding only a loopback (see
    /// `exec::nest::network`). Ignored for an environment with network,
    /// whose namespace bubblewrap always makes.
    pub network_given: bool,
    /// The project's protected paths that exist on the host as files or
    /// directories (not symlinks), relative: read-only in a read-write project.
    pub protected: &'a [String],
    /// Host directories bound writable into the sandbox, over its home or
    /// its project: the environment's caches.
    pub caches: &'a [CacheMount],
    /// Variables set after every other (a pre-started interpreter's hook,
    /// see exec's `warm`).
    pub hook_vars: &'a [(String, Value)],
    /// What bubblewrap runs.
    pub command: &'a [String],
}

/// How the host-identifying files under /proc are masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcMasks {
    /// bubblewrap binds an empty file over each, and a read-only tmpfs
    /// over each directory.
    Bubblewrap,
    /// Mounted from outside (see `exec::nest::view`) once bubblewrap has
    /// mounted /proc, while it reads a pipe ([`Pipe::ProcMasks`]) as the
    /// content of [`PROC_MASKS_SYNC_FILE`]. With a staged sandbox its /etc
    /// and staged filesystems are mounted from outside then too
    /// ([`OutsideMounts`]): each bind of bubblewrap's reads and parses the
    /// whole mount table.
    FromOutside,
}

/// A sandbox, as data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    pub network: NetworkNamespace,
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    /// Nested user namespaces refused, where the backend can.
    pub refuse_nested_userns: bool,
    /// The whole environment, in order (a later one wins).
    pub vars: Vec<(String, Value)>,
    /// The mount operations, in order.
    pub ops: Vec<Op>,
    /// Where the command starts.
    pub workdir: String,
    /// Mounted from outside, at [`Pipe::ProcMasks`].
    pub outside: OutsideMounts,
    /// What the nest stages for the sandbox, when it does.
    pub stage: Option<Stage>,
    pub code: Code,
    /// System calls allowed beyond the default policy (see `seccomp`).
    pub seccomp_allow: Vec<String>,
    pub limits: Limits,
    pub command: Vec<String>,
}

/// Whose network namespace the sandbox has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetworkNamespace {
    /// bubblewrap makes one (with a loopback only).
    Own,
    /// The nest gives one, with a loopback only.
    Given,
}

/// A variable's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    Text(String),
    /// `/dev/fd/N` of the pipe a pre-started interpreter waits on
    /// ([`super::Wiring::go`]).
    GoPipe,
}

/// One mount operation, made in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    Bind {
        source: Source,
        target: PathBuf,
        access: Access,
    },
    Symlink {
        /// What the link says.
        target: PathBuf,
        link: PathBuf,
    },
    Proc {
        target: PathBuf,
    },
    /// A minimal /dev (device nodes bound from the host's).
    Dev {
        target: PathBuf,
    },
    Tmpfs {
        target: PathBuf,
        size_bytes: Option<u64>,
        mode: Option<u32>,
    },
    /// A directory: a mount point for a mount from outside.
    Dir {
        target: PathBuf,
    },
    RemountReadOnly {
        target: PathBuf,
    },
    /// A file whose content is read from a pipe: setting up waits there
    /// while something is mounted from outside.
    Sync {
        pipe: Pipe,
        target: PathBuf,
    },
    /// The closure `closure`, all in directory `store`, as one view mounted
    /// over `store` from outside after every other mount (while setting up
    /// waits at [`Pipe::StoreView`] in a file under it, which the view hides),
    /// and the root then made read-only from outside: remounting it from
    /// inside, bubblewrap would read a mount table holding the view's mounts.
    StoreView {
        store: PathBuf,
        closure: Vec<PathBuf>,
    },
}

/// Where a bind comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    Host(PathBuf),
    /// The call's code file, a host file made for each sandbox
    /// ([`super::Wiring::code_file`]).
    CodeFile,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    ReadOnly,
    ReadWrite,
    /// Read-write, device nodes usable.
    Devices,
}

/// A pipe setting up waits on while something is mounted from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pipe {
    ProcMasks,
    StoreView,
}

/// Where the code goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Code {
    /// None: a command run as is.
    None,
    /// Written into the staged /workspace when the call comes, at
    /// `in_stage`, relative to the staged tmpfs (see [`staged_code_path`]).
    Staged { in_stage: String },
    /// A host file ([`Source::CodeFile`]), bound read-only at `at`.
    Bound { at: PathBuf },
}

/// A mount made from outside (see [`ProcMasks::FromOutside`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutsideMount {
    /// In the mount namespace bubblewrap runs in.
    pub source: Source,
    /// Where the sandbox sees it.
    pub target: PathBuf,
    /// Made read-only, no set-uid, no devices (a copy otherwise keeps its
    /// source's flags: the staged filesystems' are the sandbox's already).
    pub read_only: bool,
}

/// What is mounted from outside.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct OutsideMounts {
    /// In order (a mount inside another comes after it): the sandbox's
    /// /etc with the host entries bound on it, the staged filesystems (see
    /// [`staged`]): /dev (read-only, as `--remount-ro` made it), /tmp,
    /// /workspace and the project's overlay, and the code file when it is
    /// in one of them. Empty without staging.
    pub mounts: Vec<OutsideMount>,
    /// The sandbox's root is made read-only from outside too, after them:
    /// when bubblewrap mounts nothing after them (no read-write project,
    /// cache, store view or code file of its own to bind).
    pub read_only_root: bool,
}

/// What the nest stages: one tmpfs, bounded in size and files, holding the
/// sandbox's writable filesystems and the project's overlay.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stage {
    /// Where it is, in the nest's mount namespace.
    pub root: PathBuf,
    pub size_bytes: u64,
    pub files: u64,
    pub project: Option<StagedProject>,
}

/// The project, seen through the stage's overlay.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StagedProject {
    pub host_path: PathBuf,
    /// Writable (changes go to the upper layer) or read-only.
    pub writable: bool,
}

/// The plan for `sandbox` on a host laid out as `layout`.
pub fn plan(layout: &HostLayout, sandbox: &Sandbox) -> Plan {
    let env = sandbox.env;
    let outside = outside_mounts(layout, sandbox);
    let from_outside = !outside.mounts.is_empty();
    let mut ops = Ops::default();
    root(&mut ops, layout, sandbox);
    if !from_outside {
        ops.bind(&layout.etc_dir, Path::new("/etc"), Access::ReadOnly);
        for f in etc_entries(layout, sandbox) {
            ops.bind(f, f, Access::ReadOnly);
        }
    }
    kernel_and_scratch(&mut ops, layout, sandbox, &outside);
    if let Some(p) = sandbox.project {
        project(&mut ops, sandbox, p, from_outside);
    }
    // After the project: a cache in it is a mount over the project's view.
    for c in sandbox.caches {
        ops.bind(&c.host, Path::new(&c.at), Access::ReadWrite);
    }
    let code = code(sandbox);
    if let Code::Bound { at } = &code
        && !outside.mounts.iter().any(|m| &m.target == at)
    {
        ops.0.push(Op::Bind {
            source: Source::CodeFile,
            target: at.clone(),
            access: Access::ReadOnly,
        });
    }
    // A store view comes after every other mount: bubblewrap reads the
    // whole mount table for each bind, and none of them may see the
    // view's mounts.
    if let Some((store, closure)) = store_view(sandbox) {
        ops.0.push(Op::StoreView {
            store: store.to_path_buf(),
            closure: closure.to_vec(),
        });
    }
    // Last: everything above is mounted, and nothing else under / may be
    // written (the writable filesystems are mounts of their own). With a
    // store view, the view's mount does it from outside.
    if !outside.read_only_root && store_view(sandbox).is_none() {
        ops.0.push(Op::RemountReadOnly { target: "/".into() });
    }
    Plan {
        network: if sandbox.network_given && env.network.policy().is_none() {
            NetworkNamespace::Given
        } else {
            NetworkNamespace::Own
        },
        uid: SANDBOX_UID,
        gid: SANDBOX_GID,
        hostname: HOSTNAME.to_string(),
        refuse_nested_userns: true,
        vars: vars(sandbox),
        ops: ops.0,
        workdir: sandbox.workdir.unwrap_or(WORKSPACE).to_string(),
        outside,
        stage: sandbox.staged.map(|root| Stage {
            root: root.to_path_buf(),
            size_bytes: env.limits.workspace_bytes,
            files: env.limits.workspace_files,
            project: sandbox
                .project
                .filter(|p| staged_project(p))
                .map(|p| StagedProject {
                    host_path: p.host_path.clone(),
                    writable: p.access == ProjectAccess::Overlay,
                }),
        }),
        code,
        seccomp_allow: env.seccomp_allow.clone(),
        limits: env.limits,
        command: sandbox.command.to_vec(),
    }
}

/// Nothing from the server's environment except what is named.
fn vars(sandbox: &Sandbox) -> Vec<(String, Value)> {
    let env = sandbox.env;
    let text = |k: &str, v: &str| (k.to_string(), Value::Text(v.to_string()));
    let mut vars = vec![
        text("PATH", &env.path.join(":")),
        text("HOME", WORKSPACE),
        text("TMPDIR", TMP),
        text("LANG", "C.UTF-8"),
        text("TERM", "dumb"),
    ];
    vars.extend(env.vars.iter().map(|(k, v)| text(k, v)));
    vars.extend(sandbox.inherited.iter().map(|(k, v)| text(k, v)));
    // The network, only through the server's proxy, which listens on the
    // sandbox's own loopback.
    if let Some(policy) = env.network.policy() {
        vars.extend(
            crate::network::sandbox_env(policy)
                .into_iter()
                .map(|(k, v)| (k, Value::Text(v))),
        );
    }
    vars.extend(sandbox.hook_vars.iter().cloned());
    vars
}

/// The root filesystem, read-only: the host's system directories, or the
/// closure (bound path by path, unless it comes as a store view).
fn root(ops: &mut Ops, layout: &HostLayout, sandbox: &Sandbox) {
    match &sandbox.env.root {
        RootFs::Host { extra } => {
            for dir in &layout.system_dirs {
                ops.bind(dir, dir, Access::ReadOnly);
            }
            for (target, link) in &layout.system_links {
                ops.symlink(target, link);
            }
            for dir in extra {
                ops.bind(dir, dir, Access::ReadOnly);
            }
        }
        RootFs::Closure { store_paths, links } => {
            if store_view(sandbox).is_none() {
                for p in store_paths {
                    ops.bind(p, p, Access::ReadOnly);
                }
            }
            for (link, target) in links {
                ops.symlink(target, link);
            }
        }
    }
}

/// /proc and its masks, /dev, and the writable filesystems. Every writable
/// filesystem has a size: staged, one tmpfs bounded in size and files
/// holds them all.
fn kernel_and_scratch(
    ops: &mut Ops,
    layout: &HostLayout,
    sandbox: &Sandbox,
    outside: &OutsideMounts,
) {
    let from_outside = !outside.mounts.is_empty();
    ops.0.push(Op::Proc {
        target: "/proc".into(),
    });
    match sandbox.staged {
        Some(_) if from_outside => {}
        // One bind, where `--dev` makes one per device node.
        Some(root) => ops.bind(&root.join(staged::DEV), Path::new("/dev"), Access::Devices),
        None => ops.0.push(Op::Dev {
            target: "/dev".into(),
        }),
    }
    match sandbox.proc_masks {
        ProcMasks::FromOutside => {
            // Mount points inside another outside mount are its.
            for m in &outside.mounts {
                if !outside
                    .mounts
                    .iter()
                    .any(|o| o.target != m.target && m.target.starts_with(&o.target))
                {
                    ops.0.push(Op::Dir {
                        target: m.target.clone(),
                    });
                }
            }
            if outside.read_only_root {
                // bubblewrap holds the sync file open for writing while the
                // helper mounts: on a small tmpfs of its own (hidden by the
                // sandbox's /tmp), not on the root the helper makes read-only.
                ops.0.push(Op::Tmpfs {
                    target: TMP.into(),
                    size_bytes: Some(SYNC_TMPFS_BYTES),
                    mode: None,
                });
            }
            ops.0.push(Op::Sync {
                pipe: Pipe::ProcMasks,
                target: PROC_MASKS_SYNC_FILE.into(),
            });
        }
        ProcMasks::Bubblewrap => {
            for f in &layout.proc_masked_files {
                ops.bind(&layout.empty_file, f, Access::ReadOnly);
            }
            for d in &layout.proc_masked_dirs {
                ops.0.push(Op::Tmpfs {
                    target: d.clone(),
                    size_bytes: None,
                    mode: None,
                });
                ops.0.push(Op::RemountReadOnly { target: d.clone() });
            }
        }
    }
    match sandbox.staged {
        Some(_) if from_outside => {}
        Some(root) => {
            for (dir, at) in [(staged::TMP, TMP), (staged::WORKSPACE, WORKSPACE)] {
                ops.bind(&root.join(dir), Path::new(at), Access::ReadWrite);
            }
        }
        None => {
            let size = Some(sandbox.env.limits.workspace_bytes);
            for (target, mode) in [("/dev/shm", None), (TMP, Some(0o1777)), (WORKSPACE, None)] {
                ops.0.push(Op::Tmpfs {
                    target: target.into(),
                    size_bytes: size,
                    mode,
                });
            }
        }
    }
    // bubblewrap's /dev is a tmpfs of its own, unbounded (staged, a
    // directory of the staged tmpfs); with /dev/shm mounted, nothing else
    // there needs writing (device nodes are binds). From outside, it is
    // mounted read-only.
    if !from_outside {
        ops.0.push(Op::RemountReadOnly {
            target: "/dev".into(),
        });
    }
}

/// The project: the host's tree (read-write, or read-only), or the staged
/// overlay.
fn project(ops: &mut Ops, sandbox: &Sandbox, p: &ProjectMount, from_outside: bool) {
    let at = Path::new(&p.mount_point);
    match (p.access, sandbox.staged) {
        (ProjectAccess::ReadWrite, _) => {
            ops.bind(&p.host_path, at, Access::ReadWrite);
            // Each directory holding a protected path becomes a mount of
            // its own: a mount point cannot be renamed or removed, so a
            // protected path cannot be moved aside with its directory and
            // made again under its name.
            for dir in protected_parents(sandbox.protected) {
                ops.bind(&p.host_path.join(dir), &at.join(dir), Access::ReadWrite);
            }
            for rel in sandbox.protected {
                let rel = rel.trim_end_matches('/');
                ops.bind(&p.host_path.join(rel), &at.join(rel), Access::ReadOnly);
            }
        }
        (_, Some(_)) if from_outside && staged_project(p) => {}
        (_, Some(root)) if staged_project(p) => {
            ops.bind(&root.join(staged::PROJECT), at, Access::ReadWrite)
        }
        _ => ops.bind(&p.host_path, at, Access::ReadOnly),
    }
}

/// Where the code goes: into the staged /workspace when it is directly
/// in /workspace and the sandbox is staged, else a bound host file.
fn code(sandbox: &Sandbox) -> Code {
    let Some(at) = sandbox.code_at else {
        return Code::None;
    };
    match staged_code_path(at).filter(|_| sandbox.staged.is_some()) {
        Some(in_stage) => Code::Staged { in_stage },
        None => Code::Bound { at: at.into() },
    }
}

/// The closure's store directory and paths, when it comes as a store view.
fn store_view<'a>(sandbox: &'a Sandbox) -> Option<(&'a Path, &'a [PathBuf])> {
    match &sandbox.env.root {
        RootFs::Closure { store_paths, .. } if sandbox.store_view => {
            store_dir(store_paths).map(|store| (store, store_paths.as_slice()))
        }
        _ => None,
    }
}

/// What is mounted from outside for `sandbox`: nothing unless it is staged
/// with its /proc masks mounted from outside.
fn outside_mounts(layout: &HostLayout, sandbox: &Sandbox) -> OutsideMounts {
    let (ProcMasks::FromOutside, Some(root)) = (sandbox.proc_masks, sandbox.staged) else {
        return OutsideMounts::default();
    };
    let read_only = |source: &Path, target: &Path| OutsideMount {
        source: Source::Host(source.to_path_buf()),
        target: target.to_path_buf(),
        read_only: true,
    };
    let mut mounts = vec![read_only(&layout.etc_dir, Path::new("/etc"))];
    mounts.extend(etc_entries(layout, sandbox).map(|f| read_only(f, f)));
    let staged = [
        (staged::DEV, "/dev", true),
        (staged::TMP, TMP, false),
        (staged::WORKSPACE, WORKSPACE, false),
    ];
    let project = sandbox
        .project
        .filter(|p| staged_project(p))
        .map(|p| (staged::PROJECT, p.mount_point.as_str(), false));
    mounts.extend(
        staged
            .into_iter()
            .chain(project)
            .map(|(dir, at, read_only)| OutsideMount {
                source: Source::Host(root.join(dir)),
                target: PathBuf::from(at),
                read_only,
            }),
    );
    // Its mount point is made in the staged filesystem that holds it; one
    // elsewhere (a session's agent) is bubblewrap's to make and bind.
    let bound_code = match code(sandbox) {
        Code::Bound { at } => Some(at),
        _ => None,
    };
    let code_outside = bound_code.clone().filter(|at| {
        mounts
            .iter()
            .any(|m| !m.read_only && at.starts_with(&m.target))
    });
    if let Some(at) = code_outside.clone() {
        mounts.push(OutsideMount {
            source: Source::CodeFile,
            target: at,
            read_only: true,
        });
    }
    let read_only_root = sandbox.caches.is_empty()
        && store_view(sandbox).is_none()
        && sandbox.project.is_none_or(staged_project)
        && bound_code.is_none() == code_outside.is_none();
    OutsideMounts {
        mounts,
        read_only_root,
    }
}

/// The host's `/etc` entries a sandbox sees: those every host-mode sandbox
/// needs, and those only networked sandboxes need.
fn etc_entries<'a>(layout: &'a HostLayout, sandbox: &Sandbox) -> impl Iterator<Item = &'a PathBuf> {
    let host = matches!(sandbox.env.root, RootFs::Host { .. });
    let network = sandbox.env.network.policy().is_some();
    let host = layout.etc_host.iter().filter(move |_| host);
    host.chain(layout.etc_network.iter().filter(move |_| network))
}

/// Whether a staged sandbox sees `project` through the staged overlay.
fn staged_project(project: &ProjectMount) -> bool {
    project.overlay && project.access != ProjectAccess::ReadWrite
}

/// The directories (relative, shallowest first, each once) that hold the
/// protected paths `protected`, the project's root left out.
fn protected_parents(protected: &[String]) -> Vec<&Path> {
    let mut parents: Vec<&Path> = protected
        .iter()
        .flat_map(|rel| protected_path_dirs(rel))
        .collect();
    parents.sort_by_key(|dir| (dir.components().count(), *dir));
    parents.dedup();
    parents
}

/// The operations as they are planned.
#[derive(Default)]
struct Ops(Vec<Op>);

impl Ops {
    fn bind(&mut self, source: &Path, target: &Path, access: Access) {
        self.0.push(Op::Bind {
            source: Source::Host(source.to_path_buf()),
            target: target.to_path_buf(),
            access,
        });
    }

    fn symlink(&mut self, target: &Path, link: &Path) {
        self.0.push(Op::Symlink {
            target: target.to_path_buf(),
            link: link.to_path_buf(),
        });
    }
}
