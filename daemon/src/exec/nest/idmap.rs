//! The project as a root server's sandbox sees it: an idmapped copy of the
//! project's mount, read-only, in which the project owner's files show as
//! owned by the uid the sandbox runs as (65534), so that the sandbox can
//! change them as their owner can: through the overlay, whose lower layer
//! this copy is, so that every change lands in the sandbox's upper layer
//! and the host's files are never written. The sandbox gains nothing else:
//! its processes keep their unprivileged uid on the host; only the
//! project's files owned by the project's owner (and group) change how
//! they look, in this one mount.
//!
//! The mapping is a user namespace whose id map says "the owner's id
//! becomes 65534", made once per (owner, sandbox uid) by a short-lived
//! child and kept by descriptor. Each sandbox gets its own copy of the
//! project's mount (`open_tree`), given that mapping (`mount_setattr`,
//! Linux 5.12; overlayfs takes an idmapped lower layer since 5.19), which
//! the stage attaches as the overlay's lower layer (see `stage.rs`).
//! Only a root server can do this: an idmapping of the host's filesystem
//! needs CAP_SYS_ADMIN over it.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use crate::sync::Recover;

/// The user namespaces holding each mapping, by (from uid, from gid, to
/// uid, to gid).
#[derive(Debug, Default)]
pub(super) struct Idmaps {
    by_mapping: Mutex<HashMap<(u32, u32, u32, u32), OwnedFd>>,
}

impl Idmaps {
    /// A copy of the mount at `project`, read-only, in which `from`'s files
    /// show as `to`'s.
    pub(super) fn project(
        &self,
        project: &Path,
        from: (u32, u32),
        to: (u32, u32),
    ) -> io::Result<OwnedFd> {
        let copy = rustix::mount::open_tree(
            rustix::fs::CWD,
            project,
            rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
                | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC
                | rustix::mount::OpenTreeFlags::AT_RECURSIVE,
        )?;
        let mut maps = self.by_mapping.lock().recover();
        let userns = match maps.entry((from.0, from.1, to.0, to.1)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(mapping_namespace(from, to)?),
        };
        let attr = libc::mount_attr {
            attr_set: libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        // SAFETY: mount_setattr reads `attr` (of the size given) and the
        // descriptors, all alive for the call; the empty path with
        // AT_EMPTY_PATH names the detached copy itself.
        let done = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                copy.as_fd().as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(copy)
    }
}

/// A user namespace whose maps make `from`'s ids `to`'s: made by a child
/// that creates it and waits while the daemon writes its maps, then ends.
fn mapping_namespace(from: (u32, u32), to: (u32, u32)) -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (done_r, done_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // SAFETY: the child makes only system calls (no allocation, no lock a
    // thread of the daemon could hold) and ends with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // The parent's ends: the done pipe's end of file comes only once
        // no copy of its write end is left.
        drop(done_w);
        drop(ready_r);
        // SAFETY: a new user namespace for this single-threaded child.
        let made = unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) };
        let _ = rustix::io::write(&ready_w, if made.is_ok() { b"y" } else { b"n" });
        let mut byte = [0u8; 1];
        let _ = rustix::io::read(&done_r, &mut byte);
        // SAFETY: ends the child without running the daemon's exit handlers.
        unsafe { libc::_exit(0) };
    }
    drop(ready_w);
    drop(done_r);
    let result = (|| {
        let mut byte = [0u8; 1];
        rustix::io::read(&ready_r, &mut byte)?;
        if byte[0] != b'y' {
            return Err(io::Error::other(
                "cannot create a user namespace for the project's idmapping",
            ));
        }
        std::fs::write(
            format!("/proc/{child}/uid_map"),
            format!("{} {} 1", from.0, to.0),
        )?;
        std::fs::write(
            format!("/proc/{child}/gid_map"),
            format!("{} {} 1", from.1, to.1),
        )?;
        Ok(rustix::fs::open(
            format!("/proc/{child}/ns/user"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?)
    })();
    drop(done_w);
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
    result
}
