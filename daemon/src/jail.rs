//! The sandbox policy: turns an environment and one call into bubblewrap's
//! options. A pure function over plain data, so every rule is unit-tested
//! on the argv itself; nothing here touches the system.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::environment::{Environment, RootFs};

/// The writable working directory (and `HOME`) inside every sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The sandbox's scratch directory (`TMPDIR`).
pub const TMP: &str = "/tmp";
/// Identity the code runs as inside the sandbox.
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
pub const SANDBOX_USER: &str = "sandbox";
pub const HOSTNAME: &str = "sandbox";

/// How the host looks, probed once at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLayout {
    /// System directories bound read-only in host mode (`/usr`, and `/bin`,
    /// `/lib`… where they are real directories).
    pub system_dirs: Vec<PathBuf>,
    /// `(target, link)` for top-level directories that are symlinks (merged /usr).
    pub system_links: Vec<(PathBuf, PathBuf)>,
    /// Host `/etc` entries every host-mode sandbox needs (loader cache, alternatives).
    pub etc_host: Vec<PathBuf>,
    /// Host `/etc` entries only networked sandboxes need (resolver, certificates).
    pub etc_network: Vec<PathBuf>,
    /// Files under `/proc` that tell about the host and no program in a
    /// sandbox needs (boot parameters, kernel configuration, boot id…):
    /// `empty_file` is bound over each, read-only.
    pub proc_masked_files: Vec<PathBuf>,
    /// An empty, read-only file prepared at start-up. (`/dev/null` would not
    /// do: a bind inherits `nodev`, and the device could not be opened.)
    pub empty_file: PathBuf,
    /// Directories under `/proc` of the same kind (hardware): an empty
    /// read-only tmpfs covers each.
    pub proc_masked_dirs: Vec<PathBuf>,
    /// A directory prepared at start-up that becomes `/etc`: passwd, group, hosts
    /// and empty mount points for the host entries above.
    pub etc_dir: PathBuf,
    /// bubblewrap understands `--disable-userns` (0.8 and later).
    pub disable_userns: bool,
    /// bubblewrap takes several seccomp programs (`--add-seccomp-fd`).
    pub add_seccomp_fd: bool,
    /// bubblewrap reports its status as JSON (`--json-status-fd`).
    pub json_status_fd: bool,
}

/// The project directory as the sandbox sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectMount {
    pub host_path: PathBuf,
    pub mount_point: String,
    pub access: ProjectAccess,
    /// The nest can show this project through overlayfs (probed at start):
    /// required by [`ProjectAccess::Overlay`], and used for a read-only
    /// project too, which then shows no host path and takes no lock on the
    /// host's files.
    pub overlay: bool,
    /// An overlay was asked for but the host cannot make one, so the
    /// project is read-only instead.
    pub downgraded: bool,
    /// Paths (relative; a trailing `/` for a directory) kept read-only in
    /// a read-write project, and flagged when an overlay's change touches them.
    pub protected: Vec<String>,
}

/// How the sandbox may change the project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProjectAccess {
    /// Writable through a copy-on-write overlay: changes stay in the
    /// sandbox's upper layer, the host's files are never written.
    Overlay,
    ReadOnly,
    /// The host's files themselves, writable.
    ReadWrite,
}

impl ProjectAccess {
    /// The configuration's name for it.
    pub fn name(self) -> &'static str {
        match self {
            ProjectAccess::Overlay => "overlay",
            ProjectAccess::ReadOnly => "readonly",
            ProjectAccess::ReadWrite => "readwrite",
        }
    }
}

/// The layout of a staged tmpfs (see exec's nest): the directories, each
/// relative to its root, that become the sandbox's writable filesystems
/// and its view of the project.
pub mod staged {
    pub const WORKSPACE: &str = "workspace";
    pub const TMP: &str = "tmp";
    pub const SHM: &str = "shm";
    /// The sandbox's /dev, as bubblewrap's `--dev` makes it (device nodes
    /// bound from the host's, a new devpts, the usual links), with
    /// [`SHM`] bound at `dev/shm`.
    pub const DEV: &str = "dev";
    /// The project's overlay (writable or read-only).
    pub const PROJECT: &str = "project";
}

/// Per-call inputs to the jail.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub env: &'a Environment,
    pub project: Option<&'a ProjectMount>,
    /// Host file holding the code and where it appears in the sandbox
    /// (read-only): the environment's code path for a run, elsewhere for a
    /// session's agent. The daemon writes the code into it when the call
    /// arrives. None for a run in the nest, whose code the daemon writes
    /// into the staged /workspace itself (see [`staged_code_path`]).
    pub code_file: Option<(&'a Path, &'a str)>,
    /// bubblewrap waits on this descriptor, with the sandbox fully set up,
    /// before it starts the command.
    pub block_fd: Option<RawFd>,
    /// File descriptors holding the compiled seccomp programs, in load order.
    pub seccomp_fds: Vec<RawFd>,
    /// Where bubblewrap writes its JSON status (to tell its own failures from the program's).
    pub status_fd: Option<RawFd>,
    /// Values of the `inherit_env` variables from the daemon's environment.
    pub inherited: &'a [(String, String)],
    /// Where the command starts, when not in [`WORKSPACE`] (a declared
    /// command's working directory in the project).
    pub workdir: Option<&'a str>,
    /// The root of the sandbox's staged tmpfs (see [`staged`]), when the
    /// nest stages its writable filesystems and its project view; without
    /// it bubblewrap makes the writable filesystems itself, and the project
    /// is bound from the host.
    pub staged: Option<&'a Path>,
    /// The closure comes as a store view (see `exec::nest::view`), mounted
    /// over the store from outside once bubblewrap has made every other
    /// mount: this descriptor is the pipe bubblewrap reads, as the content
    /// of a file under the store, while that happens (the file is hidden
    /// by the view). Without it each store path is bound.
    pub store_view: Option<RawFd>,
    /// The /proc masks are mounted from outside (see `exec::nest::view`)
    /// once bubblewrap has mounted /proc: this descriptor is the pipe
    /// bubblewrap reads, as the content of a file under /tmp, while that
    /// happens (the file is hidden by the sandbox's /tmp). Without it
    /// bubblewrap mounts each mask.
    pub proc_masks_sync: Option<RawFd>,
    /// /etc and the staged filesystems ([`outside_mounts`]) are mounted
    /// from outside with the /proc masks, not bound by bubblewrap, which
    /// then only makes their mount points: each bind of bubblewrap's reads
    /// and parses the whole mount table. Only with `staged` and
    /// `proc_masks_sync`.
    pub mounts_from_outside: bool,
    /// The project's protected paths that exist on the host as files or
    /// directories (not symlinks), relative: read-only in a read-write project.
    pub protected: &'a [String],
    /// Host directories bound writable into the sandbox, over its home or
    /// its project: the environment's caches.
    pub caches: &'a [CacheMount],
    /// Variables set after every other (a pre-started interpreter's hook,
    /// see exec's `warm`).
    pub hook_vars: &'a [(String, String)],
    /// The process that becomes bubblewrap is already in a network
    /// namespace of the sandbox's own, holding only a loopback (see
    /// `exec::nest::network`): bubblewrap makes none. Ignored for an
    /// environment with network, whose namespace bubblewrap always makes.
    pub network_given: bool,
}

/// A cache directory: kept on the host, bound at `at` in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheMount {
    pub host: PathBuf,
    pub at: String,
}

/// Where `env`'s code file appears in the sandbox: in the working directory.
pub fn code_path(env: &Environment) -> String {
    format!("{WORKSPACE}/{}", env.file_name)
}

/// Where a code file at `at` in the sandbox is in its staged tmpfs (see
/// [`staged`]), relative to it: for one directly in /workspace.
pub fn staged_code_path(at: &str) -> Option<String> {
    let name = at.strip_prefix(WORKSPACE)?.strip_prefix('/')?;
    (!name.is_empty() && !name.contains('/')).then(|| format!("{}/{name}", staged::WORKSPACE))
}

/// The file under the store that bubblewrap writes while a store view is
/// mounted over the store (see [`Call::store_view`]); the view hides it.
pub const VIEW_SYNC_FILE: &str = ".nsm-view-sync";

/// The file bubblewrap writes while the /proc masks are mounted from
/// outside (see [`Call::proc_masks_sync`]); the sandbox's /tmp hides it.
pub const PROC_MASKS_SYNC_FILE: &str = "/tmp/.nsm-masks-sync";

/// The size of the tmpfs holding [`PROC_MASKS_SYNC_FILE`] when the root is
/// made read-only from outside: room for the pipe's page.
const SYNC_TMPFS_BYTES: &str = "65536";

/// Where `path` of the sandbox is while bubblewrap sets the sandbox up
/// (it builds the root at /newroot, then makes it the root): where a store
/// view is mounted from outside.
pub fn while_set_up(path: &Path) -> PathBuf {
    Path::new("/newroot").join(path.strip_prefix("/").unwrap_or(path))
}

/// A mount made from outside (see [`Call::mounts_from_outside`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideMount {
    /// In the mount namespace bubblewrap runs in.
    pub source: PathBuf,
    /// Where the sandbox sees it.
    pub target: PathBuf,
    /// Made read-only, no set-uid, no devices (a copy otherwise keeps its
    /// source's flags: the staged filesystems' are the sandbox's already).
    pub read_only: bool,
}

/// What is mounted from outside (see [`Call::mounts_from_outside`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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

/// What is mounted from outside for `call`: nothing unless it has a
/// staged sandbox, the masks' sync and [`Call::mounts_from_outside`].
pub fn outside_mounts(layout: &HostLayout, call: &Call) -> OutsideMounts {
    let (true, Some(_), Some(root)) = (call.mounts_from_outside, call.proc_masks_sync, call.staged)
    else {
        return OutsideMounts::default();
    };
    let read_only = |source: &Path, target: &Path| OutsideMount {
        source: source.to_path_buf(),
        target: target.to_path_buf(),
        read_only: true,
    };
    let mut mounts = vec![read_only(&layout.etc_dir, Path::new("/etc"))];
    mounts.extend(etc_entries(layout, call).map(|f| read_only(f, f)));
    let staged = [
        (staged::DEV, "/dev", true),
        (staged::TMP, TMP, false),
        (staged::WORKSPACE, WORKSPACE, false),
    ];
    let project = call
        .project
        .filter(|p| staged_project(p))
        .map(|p| (staged::PROJECT, p.mount_point.as_str(), false));
    mounts.extend(
        staged
            .into_iter()
            .chain(project)
            .map(|(dir, at, read_only)| OutsideMount {
                source: root.join(dir),
                target: PathBuf::from(at),
                read_only,
            }),
    );
    // Its mount point is made in the staged filesystem that holds it; one
    // elsewhere (a session's agent) is bubblewrap's to make and bind.
    let code = call.code_file.filter(|(_, at)| {
        mounts
            .iter()
            .any(|m| !m.read_only && Path::new(at).starts_with(&m.target))
    });
    if let Some((file, at)) = code {
        mounts.push(read_only(file, Path::new(at)));
    }
    let read_only_root = call.caches.is_empty()
        && call.store_view.is_none()
        && call.project.is_none_or(staged_project)
        && call.code_file.is_none() == code.is_none();
    OutsideMounts {
        mounts,
        read_only_root,
    }
}

/// The host's `/etc` entries a sandbox sees: those every host-mode sandbox
/// needs, and those only networked sandboxes need.
fn etc_entries<'a>(layout: &'a HostLayout, call: &Call) -> impl Iterator<Item = &'a PathBuf> {
    let host = matches!(call.env.root, RootFs::Host { .. });
    let network = call.env.network.policy().is_some();
    let host = layout.etc_host.iter().filter(move |_| host);
    host.chain(layout.etc_network.iter().filter(move |_| network))
}

/// Whether a staged sandbox sees `project` through the staged overlay.
fn staged_project(project: &ProjectMount) -> bool {
    project.overlay && project.access != ProjectAccess::ReadWrite
}

/// The store directory of a closure: the one parent all its paths have
/// (`None` for an empty closure, or paths in several directories, which
/// are bound one by one).
pub fn store_dir(paths: &[PathBuf]) -> Option<&Path> {
    let first = paths.first()?.parent()?;
    paths
        .iter()
        .all(|p| p.parent() == Some(first))
        .then_some(first)
}

/// The bubblewrap options for `call`: everything but the command, which
/// bubblewrap takes after `--` on its own command line.
pub fn bwrap_options(layout: &HostLayout, call: &Call) -> Vec<OsString> {
    build(layout, call).argv
}

/// The bubblewrap options for `call`, and the host paths they bind into
/// the sandbox (the source of every bind, in order, then of every mount
/// from outside: all must be there where bubblewrap runs).
pub fn bwrap_options_and_sources(
    layout: &HostLayout,
    call: &Call,
) -> (Vec<OsString>, Vec<PathBuf>) {
    let a = build(layout, call);
    (a.argv, a.sources)
}

fn build(layout: &HostLayout, call: &Call) -> Args {
    let mut a = Args::default();
    let env = call.env;

    // Namespaces and identity. Every namespace is the sandbox's own, the
    // network's too: bubblewrap makes it, or it is given, with a loopback
    // and nothing else; an environment with network reaches it only
    // through the daemon's proxy, which listens on the sandbox's own
    // loopback. Capabilities are dropped even when bwrap runs with
    // privileges, and nested user namespaces are refused where bwrap can.
    a.flags(&[
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup",
    ]);
    if !call.network_given || env.network.policy().is_some() {
        a.flag("--unshare-net");
    }
    a.pair("--uid", &SANDBOX_UID.to_string());
    a.pair("--gid", &SANDBOX_GID.to_string());
    a.pair("--hostname", HOSTNAME);
    if layout.disable_userns {
        a.flag("--disable-userns");
    }
    a.pair("--cap-drop", "ALL");
    a.flags(&["--die-with-parent", "--new-session"]);

    // Environment: nothing from the daemon except what is named.
    a.flag("--clearenv");
    let path = env.path.join(":");
    let base: [(&str, &str); 5] = [
        ("PATH", &path),
        ("HOME", WORKSPACE),
        ("TMPDIR", TMP),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
    ];
    for (k, v) in base {
        a.triple("--setenv", k, v);
    }
    for (k, v) in &env.vars {
        a.triple("--setenv", k, v);
    }
    for (k, v) in call.inherited {
        a.triple("--setenv", k, v);
    }
    if env.network.policy().is_some() {
        for (k, v) in crate::network::proxy_env(crate::network::PROXY_PORT) {
            a.triple("--setenv", &k, &v);
        }
    }
    for (k, v) in call.hook_vars {
        a.triple("--setenv", k, v);
    }

    // Root filesystem, read-only. A store view comes after every other
    // mount: bubblewrap reads the whole mount table for each bind, and none
    // of them may see the view's mounts.
    let mut store_view = None;
    match &env.root {
        RootFs::Host { extra } => {
            for dir in &layout.system_dirs {
                a.bind_ro(dir, dir);
            }
            for (target, link) in &layout.system_links {
                a.triple_os("--symlink", target.as_os_str(), link.as_os_str());
            }
            for dir in extra {
                a.bind_ro(dir, dir);
            }
        }
        RootFs::Closure { store_paths, links } => {
            match (call.store_view, store_dir(store_paths)) {
                (Some(view), Some(store)) => store_view = Some((view, store)),
                _ => {
                    for p in store_paths {
                        a.bind_ro(p, p);
                    }
                }
            }
            for (link, target) in links {
                a.triple_os("--symlink", target.as_os_str(), link.as_os_str());
            }
        }
    }
    // Empty without staging: bubblewrap binds all then.
    let from_outside = outside_mounts(layout, call);
    let outside = !from_outside.mounts.is_empty();
    if outside {
        a.sources
            .extend(from_outside.mounts.iter().map(|m| m.source.clone()));
    } else {
        a.bind_ro(&layout.etc_dir, Path::new("/etc"));
        for f in etc_entries(layout, call) {
            a.bind_ro(f, f);
        }
    }

    // Kernel interfaces and scratch space. Every writable filesystem has a
    // size: staged, one tmpfs bounded in size and files holds them all.
    a.pair("--proc", "/proc");
    match call.staged {
        Some(_) if outside => {}
        // One bind, where `--dev` makes one per device node.
        Some(root) => a.triple_os(
            "--dev-bind",
            root.join(staged::DEV).as_os_str(),
            "/dev".as_ref(),
        ),
        None => a.pair("--dev", "/dev"),
    }
    match call.proc_masks_sync {
        Some(sync) => {
            // Mount points inside another outside mount are its.
            for m in &from_outside.mounts {
                if !from_outside
                    .mounts
                    .iter()
                    .any(|o| o.target != m.target && m.target.starts_with(&o.target))
                {
                    a.pair_os("--dir", m.target.as_os_str());
                }
            }
            if from_outside.read_only_root {
                // bubblewrap holds the sync file open for writing while the
                // helper mounts: on a small tmpfs of its own (hidden by the
                // sandbox's /tmp), not on the root the helper makes read-only.
                a.pair("--size", SYNC_TMPFS_BYTES);
                a.pair("--tmpfs", TMP);
            }
            a.triple("--file", &sync.to_string(), PROC_MASKS_SYNC_FILE)
        }
        None => {
            for f in &layout.proc_masked_files {
                a.bind_ro(&layout.empty_file, f);
            }
            for d in &layout.proc_masked_dirs {
                a.pair_os("--tmpfs", d.as_os_str());
                a.pair_os("--remount-ro", d.as_os_str());
            }
        }
    }
    match call.staged {
        Some(_) if outside => {}
        Some(root) => {
            for (dir, at) in [(staged::TMP, TMP), (staged::WORKSPACE, WORKSPACE)] {
                a.triple_os("--bind", root.join(dir).as_os_str(), at.as_ref());
            }
        }
        None => {
            let size = env.limits.workspace_bytes.to_string();
            a.pair("--size", &size);
            a.pair("--tmpfs", "/dev/shm");
            a.pair("--perms", "1777");
            a.pair("--size", &size);
            a.pair("--tmpfs", TMP);
            a.pair("--size", &size);
            a.pair("--tmpfs", WORKSPACE);
        }
    }
    // bubblewrap's /dev is a tmpfs of its own, unbounded (staged, a
    // directory of the staged tmpfs); with /dev/shm mounted, nothing else
    // there needs writing (device nodes are binds). From outside, it is
    // mounted read-only.
    if !outside {
        a.pair("--remount-ro", "/dev");
    }

    if let Some(p) = call.project {
        let at = Path::new(&p.mount_point).as_os_str();
        match (p.access, call.staged) {
            (ProjectAccess::ReadWrite, _) => {
                a.triple_os("--bind", p.host_path.as_os_str(), at);
                // Each directory holding a protected path becomes a mount of
                // its own: a mount point cannot be renamed or removed, so a
                // protected path cannot be moved aside with its directory
                // and made again under its name.
                for dir in protected_parents(call.protected) {
                    a.triple_os(
                        "--bind",
                        p.host_path.join(dir).as_os_str(),
                        Path::new(&p.mount_point).join(dir).as_os_str(),
                    );
                }
                for rel in call.protected {
                    let rel = rel.trim_end_matches('/');
                    a.bind_ro(&p.host_path.join(rel), &Path::new(&p.mount_point).join(rel));
                }
            }
            (_, Some(_)) if outside && staged_project(p) => {}
            (_, Some(root)) if staged_project(p) => {
                a.triple_os("--bind", root.join(staged::PROJECT).as_os_str(), at)
            }
            _ => a.triple_os("--ro-bind", p.host_path.as_os_str(), at),
        }
    }

    // After the project: a cache in it is a mount over the project's view.
    for c in call.caches {
        a.triple_os("--bind", c.host.as_os_str(), c.at.as_ref());
    }
    if let Some((file, at)) = call.code_file
        && !from_outside
            .mounts
            .iter()
            .any(|m| m.target == Path::new(at))
    {
        a.bind_ro(file, Path::new(at));
    }
    if let Some((sync, store)) = store_view {
        a.pair_os("--dir", store.as_os_str());
        a.triple_os(
            "--file",
            sync.to_string().as_ref(),
            store.join(VIEW_SYNC_FILE).as_os_str(),
        );
    }
    if layout.add_seccomp_fd {
        for fd in &call.seccomp_fds {
            a.pair("--add-seccomp-fd", &fd.to_string());
        }
    } else if let Some(fd) = call.seccomp_fds.first() {
        // Older bubblewrap loads one program: the main filter.
        a.pair("--seccomp", &fd.to_string());
    }
    if let (true, Some(fd)) = (layout.json_status_fd, call.status_fd) {
        a.pair("--json-status-fd", &fd.to_string());
    }
    if let Some(fd) = call.block_fd {
        a.pair("--block-fd", &fd.to_string());
    }
    a.pair("--chdir", call.workdir.unwrap_or(WORKSPACE));
    // Last: everything above is mounted, and nothing else under / may be
    // written (the writable filesystems are mounts of their own).
    if !from_outside.read_only_root {
        a.pair("--remount-ro", "/");
    }
    a
}

/// The directories (relative, innermost first) that hold the protected
/// path `rel`, the project's root left out.
pub fn protected_path_dirs(rel: &str) -> impl Iterator<Item = &Path> {
    Path::new(rel.trim_end_matches('/'))
        .ancestors()
        .skip(1)
        .filter(|dir| !dir.as_os_str().is_empty())
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

/// bubblewrap's options as they are built, and the host paths they bind.
#[derive(Default)]
struct Args {
    argv: Vec<OsString>,
    sources: Vec<PathBuf>,
}

/// The options whose first argument is a path on the host.
const BINDS: [&str; 6] = [
    "--bind",
    "--ro-bind",
    "--dev-bind",
    "--bind-try",
    "--ro-bind-try",
    "--dev-bind-try",
];

impl Args {
    fn flag(&mut self, f: &str) {
        self.argv.push(f.into());
    }
    fn flags(&mut self, fs: &[&str]) {
        for f in fs {
            self.flag(f);
        }
    }
    fn pair(&mut self, f: &str, v: &str) {
        self.argv.push(f.into());
        self.argv.push(v.into());
    }
    fn pair_os(&mut self, f: &str, v: &std::ffi::OsStr) {
        self.argv.push(f.into());
        self.argv.push(v.into());
    }
    fn triple(&mut self, f: &str, a: &str, b: &str) {
        self.triple_os(f, a.as_ref(), b.as_ref());
    }
    fn triple_os(&mut self, f: &str, a: &std::ffi::OsStr, b: &std::ffi::OsStr) {
        if BINDS.contains(&f) {
            self.sources.push(PathBuf::from(a));
        }
        self.argv.push(f.into());
        self.argv.push(a.into());
        self.argv.push(b.into());
    }
    fn bind_ro(&mut self, src: &Path, dest: &Path) {
        self.triple_os("--ro-bind", src.as_os_str(), dest.as_os_str());
    }
}

#[cfg(test)]
mod tests;
