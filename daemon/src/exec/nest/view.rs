//! Store views: a Nix closure's store paths, bound once per closure into a
//! tmpfs in a mount namespace of the nest's own, so that a sandbox sees
//! exactly its closure through one mount instead of one bind per store
//! path (bubblewrap reads the whole mount table for each bind it makes,
//! so per-path binds cost more than linearly: see `bench/closure_binds.py`).
//! The namespace lives as long as a descriptor on it (the daemon's, a
//! recipe's).
//!
//! A sandbox gets a copy of the view, mounted over its store from outside
//! ([`attach`]) while its bubblewrap waits, every other mount made: none
//! of bubblewrap's binds then reads a mount table holding the view's
//! mounts. bubblewrap waits by reading a file's content from a pipe (see
//! `jail::Call::store_view`); the daemon fills the pipe before bubblewrap
//! starts, so the pipe has room again exactly when bubblewrap has got that
//! far, and closes it once the view is mounted.
//!
//! The view is made by a helper run from this binary (`__view`), which
//! joins the nest's user namespace, makes the mount namespace, binds each
//! path read-only (keeping the flags the host's mount has, which a user
//! namespace may not drop), says `ready`, and waits until the daemon has
//! opened its mount namespace and closes its standard input.

use std::io::{BufRead, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use rustix::mount::MountFlags;
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

/// The helper's subcommand: `__view USER_NAMESPACE VIEW_DIR`, the paths on
/// standard input, one per line.
pub const VIEWER: &str = "__view";
const READY: &[u8] = b"ready\n";

/// A closure's view: the mount namespace holding it.
#[derive(Debug)]
pub struct View {
    pub(in crate::exec) namespace: OwnedFd,
    /// Set when mounting it into a sandbox failed: closures are then bound
    /// path by path.
    pub(in crate::exec) failed: std::sync::atomic::AtomicBool,
}

/// Makes the view of `paths` (absolute, with no newline) at `view_dir`,
/// in a new mount namespace owned by the user namespace at `user_namespace`
/// (a `/proc/PID/ns/user` path). Blocking: a helper process, and a mount
/// per path.
pub fn make(user_namespace: &Path, view_dir: &Path, paths: &[PathBuf]) -> Result<View, String> {
    // One path a line: a path that is not absolute, or holds a newline,
    // could make the helper bind something else.
    if let Some(p) = paths
        .iter()
        .find(|p| !p.is_absolute() || p.as_os_str().as_bytes().contains(&b'\n'))
    {
        return Err(format!(
            "cannot make the store view: {p:?} cannot be named to the helper"
        ));
    }
    let mut helper = Command::new("/proc/self/exe")
        .arg(VIEWER)
        .arg(user_namespace)
        .arg(view_dir)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the store view's helper: {e}"))?;
    let result = (|| -> Result<View, String> {
        let mut stdin = helper.stdin.take().expect("piped");
        let mut list = Vec::new();
        for p in paths {
            list.extend_from_slice(p.as_os_str().as_bytes());
            list.push(b'\n');
        }
        list.push(b'\n');
        stdin.write_all(&list).map_err(|e| e.to_string())?;
        // A helper stuck (a mount that hangs) must not hold every call.
        super::expect_line(&mut helper, READY, "the store view's helper")?;
        let path = format!("/proc/{}/ns/mnt", helper.id());
        let namespace = rustix::fs::open(
            path.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {path}: {e}"))?;
        drop(stdin);
        Ok(View {
            namespace,
            failed: Default::default(),
        })
    })();
    let why = super::stop_helper(&mut helper, "nix-sandbox-mcp view: ");
    result.map_err(|e| {
        if why.is_empty() {
            format!("cannot make the store view: {e}")
        } else {
            format!("cannot make the store view: {why}")
        }
    })
}

/// The helper's body (see the module's header).
pub fn viewer_main(user_namespace: Option<&str>, view_dir: Option<&str>) -> ExitCode {
    let (Some(user_namespace), Some(view_dir)) = (user_namespace, view_dir) else {
        eprintln!("nix-sandbox-mcp view: usage: __view USER_NAMESPACE VIEW_DIR");
        return ExitCode::from(2);
    };
    match view(Path::new(user_namespace), Path::new(view_dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nix-sandbox-mcp view: {e}");
            ExitCode::from(1)
        }
    }
}

fn view(user_namespace: &Path, view_dir: &Path) -> std::io::Result<()> {
    let io = |what: &str, e: rustix::io::Errno| std::io::Error::other(format!("{what}: {e}"));
    let ns = rustix::fs::open(
        user_namespace,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io("opening the nest's user namespace", e))?;
    rustix::thread::move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::User))
        .map_err(|e| io("joining the nest's user namespace", e))?;
    // SAFETY: only CLONE_NEWNS, in this single-threaded helper (nothing
    // started a thread before main).
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }
        .map_err(|e| io("making the view's mount namespace", e))?;
    rustix::mount::mount(
        "none",
        view_dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(c"mode=0755"),
    )
    .map_err(|e| io("mounting the view's tmpfs", e))?;
    private(view_dir).map_err(|e| io("making the view private", e))?;
    let mut input = std::io::stdin().lock();
    loop {
        let mut line = String::new();
        input.read_line(&mut line)?;
        let line = line.trim_end_matches('\n');
        if line.is_empty() {
            break;
        }
        let source = Path::new(line);
        let name = source
            .file_name()
            .ok_or_else(|| std::io::Error::other(format!("{line}: not a store path")))?;
        let target = view_dir.join(name);
        // A store path is a directory or a file; the bind needs its like.
        if source.is_dir() {
            std::fs::create_dir(&target)?;
        } else {
            std::fs::File::create(&target)?;
        }
        rustix::mount::mount_bind_recursive(source, &target)
            .map_err(|e| io(&format!("binding {line}"), e))?;
        private(&target).map_err(|e| io(&format!("making {line} private"), e))?;
        read_only(&target).map_err(|e| io(&format!("making {line} read-only"), e))?;
    }
    read_only(view_dir).map_err(|e| io("making the view read-only", e))?;
    // What each sandbox's copy will need (open_tree, Linux 5.2, which a
    // container's seccomp profile may refuse).
    rustix::mount::open_tree(
        rustix::fs::CWD,
        view_dir,
        rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
            | rustix::mount::OpenTreeFlags::AT_RECURSIVE
            | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| io("copying the view (open_tree)", e))?;
    let mut out = std::io::stdout();
    out.write_all(READY)?;
    out.flush()?;
    // The daemon opens this namespace, then closes our standard input.
    let mut rest = Vec::new();
    let _ = input.read_to_end(&mut rest);
    Ok(())
}

/// The steps of [`attach`], in order; the child exits with the number of
/// the one that failed.
const ATTACH_STEPS: [&str; 10] = [
    "joining the nest's user namespace",
    "joining the view's mount namespace",
    "copying the view",
    "joining the sandbox's mount namespace",
    "mounting the copy in the sandbox",
    "counting the mounts",
    "joining the stage's mount namespace",
    "copying from the stage",
    "making a mount from the stage read-only",
    "making the sandbox's root read-only",
];

/// The most mounts one [`attach`] makes: every /proc mask (17), /etc with
/// every host entry (12) and the staged filesystems (4) fit.
pub(in crate::exec) const ATTACH_MOST: usize = 40;

/// The mounts of one [`attach`] from a view: sources there, targets in the
/// sandbox.
type Mounts = [(std::ffi::CString, std::ffi::CString)];

/// A mount of one [`attach`] from the sandbox's stage.
#[derive(Debug)]
pub(in crate::exec) struct StagedMount {
    pub(in crate::exec) source: std::ffi::CString,
    pub(in crate::exec) target: std::ffi::CString,
    /// Made read-only, no set-uid, no devices, once mounted.
    pub(in crate::exec) read_only: bool,
}

/// Mounts a copy of each `(source, target)` of `from_view`'s mounts,
/// `source` in the view's namespace, and of `from_stage`'s, `source` in
/// that mount namespace (the sandbox's stage, where its bubblewrap runs),
/// each `target` in the mount namespace `sandbox`, from a child that joins
/// `user_namespace` (the nest's, which owns all three namespaces).
/// Then `read_only_root`, when given, is made read-only.
/// Blocking (a child and a few system calls a mount; a copy of a store is
/// one mount per store path, made by the kernel in one go).
pub(in crate::exec) fn attach(
    user_namespace: &OwnedFd,
    from_view: (&View, &Mounts),
    from_stage: (Option<&OwnedFd>, &[StagedMount]),
    sandbox: Option<&OwnedFd>,
    read_only_root: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    let (view, mounts) = from_view;
    let (stage, staged) = from_stage;
    let missing = |which: &str| std::io::Error::other(format!("no {which} mount namespace"));
    let sandbox = sandbox.ok_or_else(|| missing("sandbox's"))?;
    let stage = match staged.is_empty() {
        true => None,
        false => Some(stage.ok_or_else(|| missing("stage's"))?),
    };
    let cwd = rustix::fs::CWD;
    // Only system calls, on values prepared above (see `launch::in_child`);
    // the copies are descriptors in the daemon's table, which the child
    // shares: each is closed (dropped) before the child exits.
    let steps = || {
        if mounts.len() + staged.len() > ATTACH_MOST {
            return 6;
        }
        let join = |ns: &OwnedFd, kind| {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(kind)).is_err()
        };
        let copy = |source: &std::ffi::CStr| {
            rustix::mount::open_tree(
                cwd,
                source,
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::AT_RECURSIVE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
        };
        if join(user_namespace, LinkNameSpaceType::User) {
            return 1;
        }
        let mut trees: [Option<OwnedFd>; ATTACH_MOST] = std::array::from_fn(|_| None);
        let (from_stage, from_view) = trees.split_at_mut(staged.len());
        if let Some(stage) = stage {
            if join(stage, LinkNameSpaceType::Mount) {
                return 7;
            }
            for (mount, tree) in staged.iter().zip(from_stage.iter_mut()) {
                match copy(&mount.source) {
                    Ok(fd) => *tree = Some(fd),
                    Err(_) => return 8,
                }
            }
        }
        if join(&view.namespace, LinkNameSpaceType::Mount) {
            return 2;
        }
        for ((source, _), tree) in mounts.iter().zip(from_view.iter_mut()) {
            match copy(source) {
                Ok(fd) => *tree = Some(fd),
                Err(_) => return 3,
            }
        }
        if join(sandbox, LinkNameSpaceType::Mount) {
            return 4;
        }
        let targets = staged
            .iter()
            .map(|m| (m.target.as_c_str(), m.read_only))
            .chain(mounts.iter().map(|(_, target)| (target.as_c_str(), false)));
        for ((target, read_only), tree) in targets.zip(trees.iter()) {
            let Some(tree) = tree else {
                return 3;
            };
            if rustix::mount::move_mount(
                tree.as_fd(),
                c"",
                cwd,
                target,
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .is_err()
            {
                return 5;
            }
            if read_only && self::read_only(target).is_err() {
                return 9;
            }
        }
        if let Some(root) = read_only_root
            && self::read_only(root).is_err()
        {
            return 10;
        }
        0
    };
    match crate::exec::launch::in_child(&steps)? {
        0 => Ok(()),
        step if (1..=ATTACH_STEPS.len() as i32).contains(&step) => {
            Err(std::io::Error::other(format!(
                "cannot mount from a view: {} failed",
                ATTACH_STEPS[step as usize - 1]
            )))
        }
        other => Err(std::io::Error::other(format!(
            "cannot mount from a view: its helper exited with {other}"
        ))),
    }
}

/// Makes the mount at `at` private: no mount event reaches it or leaves it,
/// so that the many copies of a view (one per sandbox) cost the kernel no
/// propagation bookkeeping.
fn private(at: &Path) -> Result<(), rustix::io::Errno> {
    rustix::mount::mount_change(at, rustix::mount::MountPropagationFlags::PRIVATE)
}

/// Remounts the mount at `at` read-only, no set-uid, no devices, keeping
/// the flags it has: a user namespace may add flags to a mount from
/// outside it, never drop them. Only system calls for a `CStr` path.
fn read_only<P: rustix::path::Arg + Copy>(at: P) -> Result<(), rustix::io::Errno> {
    use rustix::fs::StatVfsMountFlags as Has;
    let has = rustix::fs::statvfs(at)?.f_flag;
    // As bubblewrap's own binds: no set-uid programs, no device nodes.
    let mut flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    for (had, keep) in [
        (Has::NOEXEC, MountFlags::NOEXEC),
        (Has::NOATIME, MountFlags::NOATIME),
        (Has::NODIRATIME, MountFlags::NODIRATIME),
        (Has::RELATIME, MountFlags::RELATIME),
    ] {
        if has.contains(had) {
            flags |= keep;
        }
    }
    rustix::mount::mount_remount(at, flags, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_the_helper_could_misread_is_refused_before_it_starts() {
        for bad in ["/nix/store/a\n/etc", "nix/store/a"] {
            let e = make(
                Path::new("/nonexistent"),
                Path::new("/nonexistent"),
                &[PathBuf::from(bad)],
            )
            .unwrap_err();
            assert!(e.contains("cannot be named to the helper"), "{e}");
        }
    }
}
