//! The sandbox policy, pure: what a sandbox is, as data, and how bubblewrap
//! is told to make it. Nothing here touches the system.
//!
//! | file | owns |
//! |---|---|
//! | `plan.rs` | [`Sandbox`] (an environment, a project, one kind of call) → [`Plan`]: namespaces, identity, variables, the ordered mount operations, what the nest mounts from outside and stages, seccomp policy, limits, the command. Every rule of the policy is here. |
//! | `bwrap.rs` | a [`Plan`] and the call's [`Wiring`] (descriptors, the code file) → bubblewrap's options; the host paths a plan binds |
//! | `mod.rs` | the sandbox's fixed layout and identity, the project's and caches' mounts |
//!
//! A prepared sandbox is reused for a call exactly when their plans are
//! equal (the pool's key is the [`Plan`]). A mount kind, a limit or a
//! backend is added to [`Plan`] and rendered by one renderer.

mod bwrap;
mod plan;

pub use bwrap::{Features, Wiring, options, sources};
pub use plan::{
    Access, Code, NetworkNamespace, Op, OutsideMount, OutsideMounts, Pipe, Plan, ProcMasks,
    Sandbox, Source, Stage, StagedProject, Value, plan,
};

use std::path::{Path, PathBuf};

use crate::environment::Environment;

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
    /// What the chosen bubblewrap can do.
    pub features: Features,
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
/// mounted over the store (see [`Op::StoreView`]); the view hides it. It is
/// on a small tmpfs of its own, so that the root, where bubblewrap would
/// otherwise hold it open for writing, can be made read-only from outside.
pub const VIEW_SYNC_FILE: &str = ".nsm-view-sync";

/// The file bubblewrap writes while the /proc masks are mounted from
/// outside (see [`ProcMasks::FromOutside`]); the sandbox's /tmp hides it.
pub const PROC_MASKS_SYNC_FILE: &str = "/tmp/.nsm-masks-sync";

/// The size of the tmpfs holding [`VIEW_SYNC_FILE`], or
/// [`PROC_MASKS_SYNC_FILE`] when the root is made read-only from outside:
/// room for the pipe's page.
const SYNC_TMPFS_BYTES: u64 = 65536;

/// Where `path` of the sandbox is while bubblewrap sets the sandbox up
/// (it builds the root at /newroot, then makes it the root): where a store
/// view is mounted from outside.
pub fn while_set_up(path: &Path) -> PathBuf {
    Path::new("/newroot").join(path.strip_prefix("/").unwrap_or(path))
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

/// The directories (relative, innermost first) that hold the protected
/// path `rel`, the project's root left out.
pub fn protected_path_dirs(rel: &str) -> impl Iterator<Item = &Path> {
    Path::new(rel.trim_end_matches('/'))
        .ancestors()
        .skip(1)
        .filter(|dir| !dir.as_os_str().is_empty())
}

#[cfg(test)]
mod bwrap_tests;
#[cfg(test)]
mod mount_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod test_calls;
