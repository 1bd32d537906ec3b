//! The sandbox's /dev, made by the stage on its scratch tmpfs as
//! bubblewrap's `--dev` would (the device nodes bound from the host's, the
//! links, a devpts of its own, the scratch `shm`), or bound from a
//! template's root where one was built (see `stage::Template`).

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::mount::MountFlags;

use super::stage::c_path;
use crate::jail::staged;

/// The sandbox's /dev on the scratch tmpfs (see [`staged::DEV`]): absolute
/// targets under the scratch tmpfs.
pub(super) struct DevPlan {
    /// Each device node: the host's, and where it is bound.
    nodes: Vec<(CString, CString)>,
    /// `dev` itself.
    dir: CString,
    pts: CString,
    /// The scratch `shm` directory, and `dev/shm`.
    shm: (CString, CString),
}

/// The device nodes a sandbox's /dev holds: bubblewrap's `--dev` set.
const DEVICE_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The links of a sandbox's /dev, as `--dev` makes them: name, target.
const DEVICE_LINKS: [(&str, &str); 6] = [
    ("dev/stdin", "/proc/self/fd/0"),
    ("dev/stdout", "/proc/self/fd/1"),
    ("dev/stderr", "/proc/self/fd/2"),
    ("dev/fd", "/proc/self/fd"),
    ("dev/core", "/proc/kcore"),
    ("dev/ptmx", "pts/ptmx"),
];

impl DevPlan {
    /// The plan of `dev` in `scratch` (the scratch tmpfs, or a template's
    /// root, where it is mounted).
    pub(super) fn new(scratch: &Path) -> io::Result<DevPlan> {
        let dev = scratch.join(staged::DEV);
        Ok(DevPlan {
            nodes: DEVICE_NODES
                .iter()
                .map(|n| Ok((c_path(&Path::new("/dev").join(n))?, c_path(&dev.join(n))?)))
                .collect::<io::Result<_>>()?,
            dir: c_path(&dev)?,
            pts: c_path(&dev.join("pts"))?,
            shm: (
                c_path(&scratch.join(staged::SHM))?,
                c_path(&dev.join("shm"))?,
            ),
        })
    }

    /// In the child: makes `dev` in the scratch tmpfs (`scratch`) as
    /// bubblewrap's `--dev` would, owned by `owner` when given.
    pub(super) fn build(
        &self,
        scratch: &OwnedFd,
        owner: Option<(u32, u32)>,
    ) -> Result<(), rustix::io::Errno> {
        self.make_nodes(scratch, owner)?;
        self.mount_own(scratch, owner)
    }

    /// In the child: binds a template's `dev` (the current root's, see
    /// [`Template`]) as `dev` in the scratch tmpfs (`scratch`), and mounts
    /// what each sandbox has of its own there.
    pub(super) fn bind_template(
        &self,
        scratch: &OwnedFd,
        owner: Option<(u32, u32)>,
    ) -> Result<(), rustix::io::Errno> {
        rustix::fs::mkdirat(scratch, staged::DEV, Mode::from_raw_mode(0o755))?;
        // Recursive: the device nodes are mounts of the template's.
        rustix::mount::mount_bind_recursive(c"/dev", self.dir.as_c_str())?;
        self.mount_own(scratch, owner)
    }

    /// In the child: a new devpts at `dev/pts` (owned by `owner` when
    /// given), the scratch `shm` at `dev/shm`.
    pub(super) fn mount_own(
        &self,
        scratch: &OwnedFd,
        owner: Option<(u32, u32)>,
    ) -> Result<(), rustix::io::Errno> {
        rustix::mount::mount(
            c"devpts",
            self.pts.as_c_str(),
            c"devpts",
            MountFlags::NOSUID | MountFlags::NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=620"),
        )?;
        rustix::mount::mount_bind(self.shm.0.as_c_str(), self.shm.1.as_c_str())?;
        if let Some((uid, gid)) = owner {
            // Only the listing of /dev/pts shows its root's owner (the
            // host's root, where the nest may not map it).
            let _ = rustix::fs::chownat(
                scratch,
                "dev/pts",
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                rustix::fs::AtFlags::empty(),
            );
        }
        Ok(())
    }

    /// In the child: `dev` in `scratch` with the device nodes bound, the
    /// links and the directories `pts` and `shm` are mounted on, owned by
    /// `owner` when given.
    pub(super) fn make_nodes(
        &self,
        scratch: &OwnedFd,
        owner: Option<(u32, u32)>,
    ) -> Result<(), rustix::io::Errno> {
        use rustix::fs::{AtFlags, Gid, Uid};
        let dir =
            |name: &str, mode: u32| rustix::fs::mkdirat(scratch, name, Mode::from_raw_mode(mode));
        dir(staged::DEV, 0o755)?;
        dir("dev/pts", 0o755)?;
        dir("dev/shm", 0o755)?;
        for (source, target) in &self.nodes {
            // A file to bind the node over, as `--dev` makes.
            drop(rustix::fs::open(
                target.as_c_str(),
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o444),
            )?);
            rustix::mount::mount_bind(source.as_c_str(), target.as_c_str())?;
        }
        for (name, target) in DEVICE_LINKS {
            rustix::fs::symlinkat(target, scratch, name)?;
        }
        if let Some((uid, gid)) = owner {
            let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
            rustix::fs::chownat(scratch, staged::DEV, uid, gid, AtFlags::empty())?;
            for (name, _) in DEVICE_LINKS {
                rustix::fs::chownat(scratch, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
            }
        }
        Ok(())
    }
}
