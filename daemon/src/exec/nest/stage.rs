//! Staging a sandbox's writable filesystems inside the nest, in the child
//! that becomes its bubblewrap, before exec: a mount namespace of the
//! sandbox's own (so that everything staged disappears with it), with the
//! nest's /proc (bubblewrap names processes by its own pid namespace), one tmpfs
//! with a size and a file count holding the scratch directories the jail
//! binds (see [`crate::jail::staged`]) and the sandbox's /dev (`dev.rs`),
//! and the project seen through
//! overlayfs: the host's tree as the lower layer, never written, and an
//! upper layer on that tmpfs taking every change. The overlay's options
//! name only paths relative to the tmpfs, so the sandbox's mountinfo shows
//! no host path. The child sends the daemon a descriptor on the staged
//! tmpfs, through which the daemon reads the changes, or the step that
//! failed.

use std::ffi::CString;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::dev::DevPlan;
use super::network;
use crate::jail::{StagedProject, staged};

/// The overlay's upper layer (the project's changes) and its work
/// directory, inside the staged tmpfs.
pub const UPPER: &str = "upper";
const WORK: &str = "work";
/// Where the host's project is bound, as the overlay's lower layer.
const LOWER: &str = "lower";
/// An empty second lower layer: overlayfs mounts without an upper layer
/// only with two lower ones.
const EMPTY: &str = "empty";

/// What to stage for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Spec {
    pub size_bytes: u64,
    pub files: u64,
    pub project: Option<StagedProject>,
    /// The top-level entries of the host's root that the sandbox's
    /// bubblewrap sees (see `root.rs`); empty: the whole root.
    pub host_root: Vec<std::path::PathBuf>,
    /// The sandbox's network namespace is the stage's to give (one with
    /// only a loopback, see `network.rs`), not bubblewrap's to make.
    pub network: bool,
}

impl Spec {
    /// Scratch space only, small: for probing.
    pub fn scratch() -> Spec {
        Spec {
            size_bytes: 1 << 20,
            files: 64,
            project: None,
            host_root: Vec::new(),
            network: false,
        }
    }
}

/// The steps of staging, in order; the child reports the one that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(in crate::exec) enum Step {
    Done = 0,
    UserNamespace = 1,
    PidNamespace = 2,
    Fork = 3,
    MountNamespace = 4,
    Proc = 5,
    Tmpfs = 6,
    Directories = 7,
    ProjectBind = 8,
    Overlay = 9,
    HostRoot = 10,
    Pivot = 11,
    Dev = 12,
    Network = 13,
}

impl Step {
    fn from_byte(b: u8) -> Option<Step> {
        [
            Step::Done,
            Step::UserNamespace,
            Step::PidNamespace,
            Step::Fork,
            Step::MountNamespace,
            Step::Proc,
            Step::Tmpfs,
            Step::Directories,
            Step::ProjectBind,
            Step::Overlay,
            Step::HostRoot,
            Step::Pivot,
            Step::Dev,
            Step::Network,
        ]
        .into_iter()
        .find(|s| *s as u8 == b)
    }

    pub(in crate::exec) fn describe(self) -> &'static str {
        match self {
            Step::Done => "staging",
            Step::UserNamespace => "entering the nest's user namespace",
            Step::PidNamespace => "entering the nest's pid namespace",
            Step::Fork => "starting a process in the nest",
            Step::MountNamespace => "creating a mount namespace in the nest",
            Step::Proc => "mounting the nest's /proc",
            Step::Tmpfs => "mounting the sandbox's tmpfs",
            Step::Directories => "creating the scratch directories",
            Step::ProjectBind => "binding the project as the overlay's lower layer",
            Step::Overlay => "mounting the project's overlay",
            Step::HostRoot => "binding the host's directories into the sandbox's own root",
            Step::Pivot => "changing to the sandbox's own root",
            Step::Dev => "making the sandbox's /dev",
            Step::Network => "making or joining the sandbox's network namespace",
        }
    }
}

/// What a child staged: the tmpfs, and the network namespace it is in
/// when the stage gave it.
pub(super) type Staged<'a> = (OwnedFd, Option<network::NamespaceFd<'a>>);

/// A staging plan, prepared before the child starts: only C strings and descriptors.
pub(in crate::exec) struct Plan {
    /// Where the scratch tmpfs is mounted: the stage root, or the same
    /// path inside the sandbox's own root.
    scratch: CString,
    tmpfs_options: CString,
    root: Root,
    /// Who the scratch directories belong to when it is not the stager (a
    /// root daemon's sandboxes run as another uid).
    owner: Option<(u32, u32)>,
    project: Option<ProjectPlan>,
    dev: DevPlan,
    network: Option<network::Plan>,
}

/// Where a staged sandbox's bubblewrap finds the host's root.
enum Root {
    /// The nest's copy of the host's, whole.
    Host,
    /// One of its own, built by the stage (see `root.rs`).
    Own(RootPlan),
    /// A copy of one built once for the same entries, with the device
    /// nodes of /dev made there already (see [`Template`]): the mount
    /// namespace holding it.
    Copy(Arc<OwnedFd>),
}

struct ProjectPlan {
    /// The project directory's owner and mode, which the overlay's root
    /// (its upper directory's) takes, so that it looks like the host's.
    lower_owner: (u32, u32),
    lower_mode: u32,
    host: CString,
    /// An idmapped copy of the project's mount (see `idmap.rs`), attached
    /// as the lower layer instead of a bind of `host`.
    idmapped: Option<OwnedFd>,
    /// `scratch/lower`, absolute: the bind's target.
    lower: CString,
    /// Relative to `root`, where the child has changed directory.
    overlay_options: CString,
    read_only: bool,
}

pub(super) fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in a path"))
}

impl Plan {
    /// `network`: what gives the sandbox its network namespace, when
    /// `spec` says the stage does.
    /// `template`: the mount namespace of a root built once for
    /// `spec.host_root` (see [`Template`]), when there is one.
    /// `idmapped`: the project's lower layer as an idmapped copy of its
    /// mount, whose owner is `owner` (see `idmap.rs`).
    pub(in crate::exec) fn new(
        root: &Path,
        spec: &Spec,
        owner: Option<(u32, u32)>,
        network: Option<network::Plan>,
        template: Option<Arc<OwnedFd>>,
        idmapped: Option<OwnedFd>,
    ) -> io::Result<Plan> {
        use std::os::unix::fs::MetadataExt;
        let c = |s: String| CString::new(s).map_err(|_| io::Error::other("NUL in an option"));
        let host_root = match (spec.host_root.is_empty(), template) {
            (true, _) => Root::Host,
            (false, Some(template)) => Root::Copy(template),
            (false, None) => Root::Own(RootPlan::new(root, &spec.host_root)?),
        };
        // In the sandbox's own root (before the stage enters it), at the
        // same path as on the host.
        let scratch = match host_root {
            Root::Own(_) => in_own_root(root),
            Root::Host | Root::Copy(_) => root.to_path_buf(),
        };
        let project = match &spec.project {
            None => None,
            Some(p) => {
                let meta = std::fs::metadata(&p.host_path)?;
                let lower_owner = match (&idmapped, owner) {
                    (Some(_), Some(owner)) => owner,
                    _ => (meta.uid(), meta.gid()),
                };
                Some(ProjectPlan {
                    lower_owner,
                    lower_mode: meta.mode() & 0o7777,
                    host: c_path(&p.host_path)?,
                    idmapped,
                    lower: c_path(&scratch.join(LOWER))?,
                    overlay_options: c(if p.writable {
                        format!("lowerdir={LOWER},upperdir={UPPER},workdir={WORK},userxattr")
                    } else {
                        format!("lowerdir={LOWER}:{EMPTY},userxattr")
                    })?,
                    read_only: !p.writable,
                })
            }
        };
        Ok(Plan {
            dev: DevPlan::new(&scratch)?,
            scratch: c_path(&scratch)?,
            root: host_root,
            tmpfs_options: c(format!(
                "size={},nr_inodes={},mode=0755",
                spec.size_bytes.max(4096),
                spec.files.max(64)
            ))?,
            owner,
            project,
            network,
        })
    }

    /// In the child, inside the nest: builds everything, or fails naming
    /// the step.
    pub(super) fn apply(&self) -> Result<Staged<'_>, (Step, rustix::io::Errno)> {
        // First, while /proc is still the daemon's (see `network.rs`).
        let network = match &self.network {
            Some(plan) => Some(plan.apply().map_err(|e| (Step::Network, e))?),
            None => None,
        };
        match &self.root {
            Root::Copy(template) => {
                // Its root and its /proc (the nest's) are the template's;
                // the copy is the sandbox's, and slave to the host's mounts
                // as the template is.
                rustix::thread::move_into_link_name_space(
                    template.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Mount),
                )
                .map_err(|e| (Step::MountNamespace, e))?;
                new_mount_namespace()?;
            }
            Root::Host => {
                new_mount_namespace()?;
                mount_nest_proc()?;
            }
            Root::Own(r) => {
                new_mount_namespace()?;
                slave_to_host()?;
                mount_nest_proc()?;
                r.build().map_err(|e| (Step::HostRoot, e))?;
            }
        }
        rustix::mount::mount(
            c"tmpfs",
            self.scratch.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(self.tmpfs_options.as_c_str()),
        )
        .map_err(|e| (Step::Tmpfs, e))?;
        let dir = rustix::fs::open(
            self.scratch.as_c_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| (Step::Directories, e))?;
        let sticky = Mode::from_raw_mode(0o1777);
        let project_dirs: &[(&str, Mode)] = match self.project {
            Some(_) => &PROJECT_DIRS,
            None => &[],
        };
        for (name, mode) in SCRATCH_DIRS.iter().chain(project_dirs) {
            rustix::fs::mkdirat(&dir, *name, *mode).map_err(|e| (Step::Directories, e))?;
            if *mode == sticky {
                // mkdir applies the umask; the sticky directories are for everyone.
                rustix::fs::chmodat(&dir, *name, sticky, rustix::fs::AtFlags::empty())
                    .map_err(|e| (Step::Directories, e))?;
            }
        }
        let chown = |name: &str, (uid, gid): (u32, u32)| {
            rustix::fs::chownat(
                &dir,
                name,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                rustix::fs::AtFlags::empty(),
            )
            .map_err(|e| (Step::Directories, e))
        };
        if let Some(owner) = self.owner {
            for (name, _) in SCRATCH_DIRS.iter() {
                chown(name, owner)?;
            }
        }
        match self.root {
            Root::Copy(_) => self.dev.bind_template(&dir, self.owner),
            Root::Host | Root::Own(_) => self.dev.build(&dir, self.owner),
        }
        .map_err(|e| (Step::Dev, e))?;
        if let Some(p) = &self.project {
            let mode = Mode::from_raw_mode(p.lower_mode);
            rustix::fs::chmodat(&dir, UPPER, mode, rustix::fs::AtFlags::empty())
                .map_err(|e| (Step::Directories, e))?;
            if self.owner.is_some() {
                chown(UPPER, p.lower_owner)?;
            }
        }
        if let Some(p) = &self.project {
            match &p.idmapped {
                Some(copy) => rustix::mount::move_mount(
                    copy,
                    c"",
                    rustix::fs::CWD,
                    p.lower.as_c_str(),
                    rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                ),
                // Recursive: a plain bind of a tree holding mounts the nest
                // may not reveal is refused.
                None => rustix::mount::mount_bind_recursive(p.host.as_c_str(), p.lower.as_c_str()),
            }
            .map_err(|e| (Step::ProjectBind, e))?;
            rustix::process::fchdir(&dir).map_err(|e| (Step::Overlay, e))?;
            let flags = if p.read_only {
                MountFlags::RDONLY
            } else {
                MountFlags::empty()
            };
            let mounted = rustix::mount::mount(
                c"overlay",
                staged::PROJECT,
                c"overlay",
                flags | MountFlags::NOSUID | MountFlags::NODEV,
                Some(p.overlay_options.as_c_str()),
            );
            let _ = rustix::process::chdir(c"/");
            mounted.map_err(|e| (Step::Overlay, e))?;
        }
        if let Root::Own(r) = &self.root {
            r.enter().map_err(|e| (Step::Pivot, e))?;
        }
        Ok((dir, network))
    }
}

/// `path` as seen from inside an own root mounted at `root` (before the
/// stage enters it): the same path under `root`.
fn in_own_root(root: &Path) -> std::path::PathBuf {
    root.join(root.strip_prefix("/").unwrap_or(root))
}

/// In the child: a mount namespace of its own, a copy of the current one.
fn new_mount_namespace() -> Result<(), (Step, rustix::io::Errno)> {
    // SAFETY: only CLONE_NEWNS: the mount namespace is per process and
    // the child has one thread.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .map_err(|e| (Step::MountNamespace, e))
}

/// In the child, as bubblewrap does: nothing mounted here reaches the host.
fn slave_to_host() -> Result<(), (Step, rustix::io::Errno)> {
    rustix::mount::mount_change(
        c"/",
        MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
    )
    .map_err(|e| (Step::HostRoot, e))
}

/// In the child: bubblewrap reads its children's /proc entries by the pids
/// its own pid namespace gives them, so /proc must be the nest's.
fn mount_nest_proc() -> Result<(), (Step, rustix::io::Errno)> {
    rustix::mount::mount(
        c"proc",
        c"/proc",
        c"proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .map_err(|e| (Step::Proc, e))
}

/// A sandbox's own root built once, for every sandbox whose bubblewrap
/// needs the same entries of the host's root (see `root.rs`): a mount
/// namespace holding it, slave to the host's mounts, with the nest's /proc
/// and the device nodes of /dev (bound from the host's, the usual links)
/// at `/dev` of that root. Each stage then starts from a copy of that
/// namespace (a few mounts) instead of building the root, binding each
/// device node and mounting a /proc of its own from a copy of all of the
/// host's mounts, which it then let go (on a desktop's dozens of mounts,
/// most of a sandbox's set-up; docs/performance.md).
pub(in crate::exec) struct Template {
    root: RootPlan,
    dev: DevPlan,
    owner: Option<(u32, u32)>,
}

impl Template {
    /// The template of the root holding `entries`, mounted at `stage_root`
    /// while it is built; `owner` owns its /dev, when not the stager.
    pub(in crate::exec) fn new(
        stage_root: &Path,
        entries: &[std::path::PathBuf],
        owner: Option<(u32, u32)>,
    ) -> io::Result<Template> {
        Ok(Template {
            root: RootPlan::new(stage_root, entries)?,
            dev: DevPlan::new(stage_root)?,
            owner,
        })
    }

    /// In the child, inside the nest: builds it and enters it; the
    /// descriptor of its mount namespace, or the step that failed.
    pub(super) fn apply(&self) -> Result<OwnedFd, (Step, rustix::io::Errno)> {
        new_mount_namespace()?;
        slave_to_host()?;
        mount_nest_proc()?;
        let root = self.root.build().map_err(|e| (Step::HostRoot, e))?;
        self.dev
            .make_nodes(&root, self.owner)
            .map_err(|e| (Step::Dev, e))?;
        drop(root);
        self.root.enter().map_err(|e| (Step::Pivot, e))?;
        rustix::fs::open(
            c"/proc/self/ns/mnt",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| (Step::MountNamespace, e))
    }
}

/// The sandbox's own root (see `root.rs`), prepared before the child starts.
struct RootPlan {
    /// Where its tmpfs is mounted before the pivot: the stage root.
    at: CString,
    /// Directories bound with what is mounted under them: the host's path,
    /// the path in the new root before the pivot, the entry's name. The one
    /// holding the stage root comes first, so that its copy holds nothing
    /// bound into the new root.
    binds: Vec<(CString, CString, CString)>,
    /// Symlinks copied: where they lead, their name.
    links: Vec<(CString, CString)>,
    /// bubblewrap mounts its own root's tmpfs on /tmp, which must exist.
    make_tmp: bool,
}

impl RootPlan {
    fn new(at: &Path, entries: &[std::path::PathBuf]) -> io::Result<RootPlan> {
        let c = |s: &std::ffi::OsStr| {
            CString::new(s.as_bytes()).map_err(|_| io::Error::other("NUL in a path"))
        };
        let mut binds = Vec::new();
        let mut links = Vec::new();
        for entry in entries {
            let Some(name) = entry.file_name() else {
                continue;
            };
            // An entry gone since the recipe was made is left out: what
            // needed it fails in bubblewrap, with its own message.
            let Ok(meta) = entry.symlink_metadata() else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = std::fs::read_link(entry) {
                    links.push((c(target.as_os_str())?, c(name)?));
                }
            } else if meta.is_dir() {
                binds.push((
                    c_path(entry)?,
                    c_path(&at.join(name))?,
                    c(name)?,
                    at.starts_with(entry),
                ));
            }
        }
        binds.sort_by_key(|b| !b.3);
        let make_tmp = !entries.iter().any(|e| e == Path::new("/tmp"));
        Ok(RootPlan {
            at: c_path(at)?,
            binds: binds.into_iter().map(|(a, b, n, _)| (a, b, n)).collect(),
            links,
            make_tmp,
        })
    }

    /// In the child: mounts the new root and fills it; a descriptor on it.
    fn build(&self) -> Result<OwnedFd, rustix::io::Errno> {
        rustix::mount::mount(
            c"tmpfs",
            self.at.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(c"size=64k,nr_inodes=64,mode=0755"),
        )?;
        let root = rustix::fs::open(
            self.at.as_c_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let dir_mode = Mode::from_raw_mode(0o755);
        for (host, inside, name) in &self.binds {
            rustix::fs::mkdirat(&root, name.as_c_str(), dir_mode)?;
            // Recursive: a tree holding mounts the nest may not reveal
            // cannot be bound without them.
            rustix::mount::mount_bind_recursive(host.as_c_str(), inside.as_c_str())?;
        }
        for (target, name) in &self.links {
            rustix::fs::symlinkat(target.as_c_str(), &root, name.as_c_str())?;
        }
        if self.make_tmp {
            rustix::fs::mkdirat(&root, c"tmp", Mode::from_raw_mode(0o1777))?;
        }
        Ok(root)
    }

    /// In the child, once everything is staged: makes the new root the
    /// process's, and lets the host's go (pivot_root(2), with the new root
    /// as its own put-old directory).
    fn enter(&self) -> Result<(), rustix::io::Errno> {
        rustix::process::chdir(self.at.as_c_str())?;
        rustix::process::pivot_root(c".", c".")?;
        rustix::mount::unmount(c".", rustix::mount::UnmountFlags::DETACH)?;
        rustix::process::chdir(c"/")
    }
}

/// The scratch directories every staged sandbox has.
const SCRATCH_DIRS: [(&str, Mode); 3] = [
    (staged::WORKSPACE, Mode::from_raw_mode(0o755)),
    (staged::TMP, Mode::from_raw_mode(0o1777)),
    (staged::SHM, Mode::from_raw_mode(0o1777)),
];

const PROJECT_DIRS: [(&str, Mode); 5] = [
    (LOWER, Mode::from_raw_mode(0o755)),
    (EMPTY, Mode::from_raw_mode(0o755)),
    (UPPER, Mode::from_raw_mode(0o755)),
    (WORK, Mode::from_raw_mode(0o755)),
    (staged::PROJECT, Mode::from_raw_mode(0o755)),
];

/// The first message of a child entering the nest: the pid of the process
/// that becomes bubblewrap (see [`super::Entry::enter`]).
const BUBBLEWRAP_PID: u8 = b'g';

/// Reports the pid of the process that becomes bubblewrap. In the child:
/// no allocation.
pub(super) fn report_pid(socket: &OwnedFd, pid: i32) {
    let mut message = [BUBBLEWRAP_PID, 0, 0, 0, 0];
    message[1..].copy_from_slice(&pid.to_le_bytes());
    let _ = rustix::net::send(socket, &message, SendFlags::empty());
}

/// Sends the outcome of staging to the daemon: the step byte, with the
/// staged tmpfs's descriptor and the network namespace's, if the stage
/// gave it, when it succeeded. In the child: no allocation.
pub(super) fn report(socket: &OwnedFd, result: Result<&[BorrowedFd<'_>], Step>) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let byte;
    match result {
        Ok(fds) => {
            byte = [Step::Done as u8];
            control.push(SendAncillaryMessage::ScmRights(fds));
        }
        Err(step) => byte = [step as u8],
    }
    let _ = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(&byte)],
        &mut control,
        SendFlags::empty(),
    );
}

/// What a child entering the nest reported, read by the daemon once the
/// spawn returned.
#[derive(Debug, Default)]
pub(in crate::exec) struct Reported {
    /// The host pid of the process that became (or was to become) bubblewrap.
    pub(in crate::exec) bubblewrap: Option<i32>,
    /// The staged tmpfs, or why staging failed; `None` when nothing was staged.
    pub(in crate::exec) staged: Option<Result<OwnedFd, String>>,
    /// The network namespace the stage gave the sandbox.
    pub(in crate::exec) network: Option<OwnedFd>,
}

/// Reads every report waiting on `socket`.
pub(in crate::exec) fn receive(socket: &OwnedFd) -> Reported {
    let mut reported = Reported::default();
    loop {
        let mut message = [0u8; 8];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let Ok(got) = rustix::net::recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut message)],
            &mut control,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) else {
            return reported;
        };
        let (mut fd, mut network) = (None, None);
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(mut fds) = m {
                fd = fds.next();
                network = fds.next();
            }
        }
        match (got.bytes, message[0]) {
            (0, _) => return reported,
            (5, BUBBLEWRAP_PID) => {
                let pid = i32::from_le_bytes([message[1], message[2], message[3], message[4]]);
                reported.bubblewrap = Some(pid);
            }
            (1, byte) => {
                reported.network = network;
                reported.staged = Some(match (Step::from_byte(byte), fd) {
                    (Some(Step::Done), Some(fd)) => Ok(fd),
                    (Some(step), _) => Err(format!("{} failed", step.describe())),
                    (None, _) => Err("staging reported nonsense".to_string()),
                });
            }
            _ => reported.staged = Some(Err("staging reported nonsense".to_string())),
        }
    }
}
