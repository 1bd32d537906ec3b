//! What one sandbox is wired to, besides its plan: the pipes bubblewrap
//! reads its options and seccomp filter from, reports its status on and
//! waits on before the command; a pre-started interpreter's pipe; the
//! pipes setting up waits on while the nest mounts from outside; the code
//! file; and, later, the mount namespaces held past the sandbox. Opened by
//! `spawn` from the plan, kept by `sandbox`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::jail::{self, Code, Op, Pipe, Plan};
use crate::platform::Platform;

/// A pipe: (read end, write end).
pub(super) type PipeEnds = (OwnedFd, OwnedFd);

/// The descriptors of one sandbox being started. bubblewrap inherits the
/// `*_r` ends of what it reads and the write end of its status; the server
/// keeps the others.
#[derive(Debug)]
pub(super) struct Wiring {
    pub(super) options: PipeEnds,
    pub(super) seccomp: PipeEnds,
    /// Read end non-blocking (the server polls it).
    pub(super) status: PipeEnds,
    pub(super) block: PipeEnds,
    /// A pre-started interpreter's (see `warm`), readable by everyone.
    pub(super) go: Option<PipeEnds>,
    /// [`Pipe::ProcMasks`], full: bubblewrap blocks reading it.
    pub(super) masks_sync: Option<PipeEnds>,
    /// [`Pipe::StoreView`], full.
    pub(super) view_sync: Option<PipeEnds>,
    pub(super) code: Option<CodeFile>,
}

/// Where a sandbox's code goes.
#[derive(Debug)]
pub(super) enum CodeFile {
    /// A file of the host's, mounted as the code file (kept until the
    /// sandbox ends).
    Host(tempfile::NamedTempFile),
    /// A file made in the staged /workspace when the call comes: its path
    /// relative to the staged tmpfs, and who owns it when not the daemon's
    /// uid (as the scratch directories). Nothing on the host's disk,
    /// nothing mounted.
    Staged(CString, Option<(u32, u32)>),
}

/// What lets a pre-started interpreter go on to the code file (see `warm`).
#[derive(Debug)]
pub(super) struct Go {
    pub(super) pipe: OwnedFd,
    pub(super) message: Vec<u8>,
}

impl Wiring {
    /// Opens what `plan` needs: the pipes every sandbox has, one per
    /// [`Pipe`] it waits on, the go pipe when `warm`, and its code file.
    pub(super) fn open(platform: &Platform, plan: &Plan, warm: bool) -> io::Result<Wiring> {
        let waits_on = |pipe: Pipe| {
            plan.ops.iter().any(|op| match op {
                Op::Sync { pipe: p, .. } => *p == pipe,
                Op::StoreView { .. } => pipe == Pipe::StoreView,
                _ => false,
            })
        };
        let status = pipe()?;
        rustix::fs::fcntl_setfl(&status.0, rustix::fs::OFlags::NONBLOCK)?;
        let go = match warm {
            true => {
                let (r, w) = pipe()?;
                // bash opens it again through /dev/fd, as the sandbox's user
                // (another one when the server runs as root). Only processes
                // holding the pipe can reach it there.
                rustix::fs::fchmod(&r, rustix::fs::Mode::from_raw_mode(0o444))?;
                Some((r, w))
            }
            false => None,
        };
        let code = match &plan.code {
            Code::None => None,
            Code::Staged { in_stage } => Some(CodeFile::Staged(
                CString::new(in_stage.as_str())
                    .map_err(|_| io::Error::other("NUL in the code path"))?,
                platform.run_as,
            )),
            Code::Bound { .. } => Some(CodeFile::Host(platform.code_file()?)),
        };
        Ok(Wiring {
            options: pipe()?,
            seccomp: pipe()?,
            status,
            block: pipe()?,
            go,
            masks_sync: waits_on(Pipe::ProcMasks).then(full_pipe).transpose()?,
            view_sync: waits_on(Pipe::StoreView).then(full_pipe).transpose()?,
            code,
        })
    }

    /// The descriptors and file as the jail's renderer takes them.
    pub(super) fn for_jail(&self) -> jail::Wiring<'_> {
        jail::Wiring {
            code_file: match &self.code {
                Some(CodeFile::Host(file)) => Some(file.path()),
                _ => None,
            },
            block: Some(self.block.0.as_raw_fd()),
            seccomp: vec![self.seccomp.0.as_raw_fd()],
            status: Some(self.status.1.as_raw_fd()),
            proc_masks: self.masks_sync.as_ref().map(|(r, _)| r.as_raw_fd()),
            store_view: self.view_sync.as_ref().map(|(r, _)| r.as_raw_fd()),
            go: self.go.as_ref().map(|(r, _)| r.as_raw_fd()),
        }
    }
}

fn pipe() -> io::Result<PipeEnds> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from)
}

/// A pipe whose read end bubblewrap gets, already full: the write end has
/// room again once bubblewrap reads it.
fn full_pipe() -> io::Result<PipeEnds> {
    let (r, w) = pipe()?;
    let size = rustix::pipe::fcntl_setpipe_size(&w, PIPE_PAGE)?;
    rustix::fs::fcntl_setfl(&w, rustix::fs::OFlags::NONBLOCK)?;
    let filler = [0u8; PIPE_PAGE];
    let mut left = size;
    while left > 0 {
        match rustix::io::write(&w, &filler[..left.min(PIPE_PAGE)]) {
            Ok(n) => left -= n,
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok((r, w))
}

/// The smallest pipe the kernel makes.
const PIPE_PAGE: usize = 4096;

/// Descriptors on the mount namespace bubblewrap runs in (the nest's
/// stage, when it staged) and on the sandbox's own, through which the
/// mounts from outside are made. The last process to leave a mount
/// namespace unmounts all of it before its descriptors close, and so
/// before the sandbox's streams reach their end (0.4 ms a namespace here);
/// held by the daemon, the namespaces are torn down once the call has its
/// result. Whoever drops the sandbox, dropped on the runtime, they are
/// closed on a blocking thread.
#[derive(Debug, Default)]
pub(super) struct HeldNamespaces {
    pub(super) stage: Option<OwnedFd>,
    pub(super) sandbox: Option<OwnedFd>,
}

impl HeldNamespaces {
    /// Holds the mount namespaces of `bubblewrap` and of the sandbox's `init`.
    pub(super) fn hold(bubblewrap: i32, init: i32) -> HeldNamespaces {
        let open = |pid: i32| {
            rustix::fs::open(
                format!("/proc/{pid}/ns/mnt"),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()
        };
        HeldNamespaces {
            stage: open(bubblewrap),
            sandbox: open(init),
        }
    }
}

impl Drop for HeldNamespaces {
    fn drop(&mut self) {
        let held = [self.stage.take(), self.sandbox.take()];
        if held.iter().any(Option::is_some)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn_blocking(move || drop(held));
        }
    }
}
