//! Starting bubblewrap for a recipe (`launch.rs`), with the rlimits,
//! the identity switch and exactly the descriptors bubblewrap needs set up
//! between the two (on cgroup v1 the process joins its cgroup there, see
//! `Lease::join_at_exec`); then, off the call's critical path, moving the
//! waiting bubblewrap into its cgroup (elsewhere), handing it its options
//! and seccomp filter, and mounting a store view while it waits. The
//! processes are held by pidfd (see `process.rs`).

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, Signal};

use super::child::ChildPlan;
use super::launch::{Output, launch};
use super::nest::{Nest, Reaped, Reported, ViewAttach, network};
use super::process::{Process, watch_child_of};
use super::recipe::{Recipe, nul_separated};
use super::sandbox::{CodeFile, Go, Prepared};
use super::status::Status;
use crate::jail::{self, Call};
use crate::limits::{Enforcer, Lease, Rlimit};
use crate::platform::Platform;

/// How long bubblewrap may take to create the sandbox's namespaces.
const INIT_LIMIT: Duration = Duration::from_secs(10);

/// A bubblewrap just started, blocked reading its options, in its cgroup
/// only if it joined it itself.
pub(super) struct Spawned {
    process: Process,
    lease: Lease,
    code: Option<CodeFile>,
    block: OwnedFd,
    status: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Write ends: the options, the seccomp filter.
    options: OwnedFd,
    seccomp: OwnedFd,
    options_data: Vec<u8>,
    staged: Option<OwnedFd>,
    /// A pre-started interpreter's pipe: the write end, and the number the
    /// interpreter knows the read end by.
    go: Option<(OwnedFd, i32)>,
    /// A store view: the write end of the pipe bubblewrap waits on, and
    /// what mounts the view meanwhile.
    view: Option<(OwnedFd, ViewAttach)>,
    /// The /proc masks: as `view`, earlier in bubblewrap's set-up.
    masks: Option<(OwnedFd, ViewAttach)>,
    /// In the nest: what its init reaped (the sandbox's init ends up there).
    reaped: Option<Arc<Reaped>>,
    /// The network namespace the stage gave it.
    network: Option<network::Held>,
}

/// Starts bubblewrap for `recipe`, passing `extra` descriptors on to the
/// command at their current numbers. Fast (a clone and exec); must run in
/// the tokio runtime, on a thread that outlives the sandbox (bubblewrap's
/// parent-death signal follows the thread that started it).
pub(super) fn spawn(
    platform: &Platform,
    enforcer: &Enforcer,
    nest: Option<&Nest>,
    recipe: &Recipe,
    extra: Vec<OwnedFd>,
) -> io::Result<Spawned> {
    let mut lease = enforcer.reserve()?;
    let join_cgroup = lease.join_at_exec(&recipe.env.limits)?;
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from);
    let (options_r, options_w) = pipe()?;
    let (seccomp_r, seccomp_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let (block_r, block_w) = pipe()?;
    let go = match recipe.warm {
        Some(_) => {
            let (r, w) = pipe()?;
            // bash opens it again through /dev/fd, as the sandbox's user
            // (another one when the server runs as root). Only processes
            // holding the pipe can reach it there.
            rustix::fs::fchmod(&r, rustix::fs::Mode::from_raw_mode(0o444))?;
            Some((r, w))
        }
        None => None,
    };
    // A store view: the pipe bubblewrap waits on while the view is
    // mounted (see `nest::view`), full before bubblewrap starts.
    let view = match (nest, &recipe.view, &recipe.env.root) {
        (Some(n), Some(v), crate::environment::RootFs::Closure { store_paths, .. }) => {
            match jail::store_dir(store_paths) {
                Some(store) => Some((
                    full_pipe()?,
                    n.view_attach(
                        v.clone(),
                        &[(platform.view_dir.clone(), jail::while_set_up(store))],
                        &[],
                        None,
                    )?,
                )),
                None => None,
            }
        }
        _ => None,
    };
    // The /proc masks from their view, and the staged filesystems with
    // them: the same kind of pipe, read once bubblewrap has mounted /proc.
    let masks = match (nest, &recipe.masks) {
        (Some(n), Some(m)) => Some((full_pipe()?, (n, m))),
        _ => None,
    };
    let hook_vars = match (&recipe.warm, &go) {
        (Some(warm), Some((go_r, _))) => warm.vars(go_r.as_raw_fd()),
        _ => Vec::new(),
    };
    rustix::fs::fcntl_setfl(&status_r, rustix::fs::OFlags::NONBLOCK)?;
    // In a staged /workspace the code is written straight into it when the
    // call comes; elsewhere (a session's agent, no nest) into a host file
    // mounted there.
    let staged_code = match (&recipe.stage, nest) {
        (Some(_), Some(_)) => recipe.code_path.as_deref().and_then(jail::staged_code_path),
        _ => None,
    };
    let code = match (staged_code, &recipe.code_path) {
        (Some(at), _) => Some(CodeFile::Staged(
            std::ffi::CString::new(at).map_err(|_| io::Error::other("NUL in the code path"))?,
            platform.run_as,
        )),
        (None, Some(_)) => Some(CodeFile::Host(platform.code_file()?)),
        (None, None) => None,
    };
    let host_code = match &code {
        Some(CodeFile::Host(file)) => Some(file.path()),
        _ => None,
    };
    let call = Call {
        env: &recipe.env,
        project: recipe.project.as_ref(),
        code_file: host_code.zip(recipe.code_path.as_deref()),
        block_fd: Some(block_r.as_raw_fd()),
        seccomp_fds: vec![seccomp_r.as_raw_fd()],
        status_fd: Some(status_w.as_raw_fd()),
        inherited: &recipe.inherited,
        workdir: recipe.workdir.as_deref(),
        staged: nest.map(|_| platform.stage_dir.as_path()),
        store_view: view.as_ref().map(|((r, _), _)| r.as_raw_fd()),
        proc_masks_sync: masks.as_ref().map(|((r, _), _)| r.as_raw_fd()),
        mounts_from_outside: masks.is_some(),
        protected: &recipe.protected,
        caches: &recipe.caches,
        hook_vars: &hook_vars,
        // Only where the stage gives it: the child that becomes bubblewrap
        // then joins or makes it before anything else, or fails.
        network_given: nest.is_some() && recipe.stage.as_ref().is_some_and(|s| s.network),
    };
    let masks = match masks {
        Some((pipe, (n, m))) => {
            let outside = jail::outside_mounts(&platform.layout, &call);
            let staged: Vec<_> = outside
                .mounts
                .into_iter()
                .map(|m| jail::OutsideMount {
                    target: jail::while_set_up(&m.target),
                    ..m
                })
                .collect();
            let root = jail::while_set_up(Path::new("/"));
            let read_only_root = outside.read_only_root.then_some(root.as_path());
            Some((
                pipe,
                n.view_attach(m.clone(), &mask_mounts(platform), &staged, read_only_root)?,
            ))
        }
        None => None,
    };
    // bubblewrap waits on the read ends; the write ends wait for the mounts.
    let (view_sync, view) = view.map(|((r, w), attach)| (r, (w, attach))).unzip();
    let (masks_sync, masks) = masks.map(|((r, w), attach)| (r, (w, attach))).unzip();
    let (entry, receipt) = match nest {
        Some(n) => {
            let (entry, receipt) = n.entry(recipe.stage.as_ref(), platform.run_as)?;
            (Some(entry), Some(receipt))
        }
        None => (None, None),
    };
    let options_data = nul_separated(jail::bwrap_options(&platform.layout, &call));
    let options_fd = options_r.as_raw_fd();
    let (go_r, go) = match go {
        Some((r, w)) => {
            let number = r.as_raw_fd();
            (Some(r), Some((w, number)))
        }
        None => (None, None),
    };
    let plan = ChildPlan {
        hard: recipe
            .rlimits
            .iter()
            .map(|r| rustix::process::getrlimit(r.resource).maximum)
            .collect(),
        rlimits: recipe.rlimits.clone(),
        inherit: Arc::new(
            [options_r, seccomp_r, status_w, block_r]
                .into_iter()
                .chain(go_r)
                .chain(view_sync)
                .chain(masks_sync)
                .chain(extra)
                .collect(),
        ),
        run_as: platform.run_as,
        nest: entry,
        join_cgroup,
        parent: rustix::process::getpid(),
    };
    let options_arg = options_fd.to_string();
    let args: Vec<&OsStr> = [
        OsStr::new("--args"),
        OsStr::new(&options_arg),
        OsStr::new("--"),
    ]
    .into_iter()
    .chain(recipe.key.command.iter().map(OsStr::new))
    .collect();
    let spawned = launch(&platform.bwrap, &args, &plan, Output::Piped);
    // The child's end of the reports closes with the plan.
    drop(plan);
    let (launched, mut reported) = match receipt {
        None => (spawned?, None),
        Some(receipt) => {
            let reported = receipt.collect(spawned.as_ref().ok().map(|c| c.pid));
            match spawned {
                Ok(launched) => (launched, Some(reported)),
                Err(e) => {
                    kill_and_reap(reported.bubblewrap);
                    let why = match reported.staged {
                        Some(Err(why)) => format!("{why}: {e}"),
                        _ => e.to_string(),
                    };
                    return Err(io::Error::new(e.kind(), why));
                }
            }
        }
    };
    let (stdout, stderr) = launched.output.expect("piped");
    let network = reported
        .as_mut()
        .and_then(|r| r.network.take())
        .zip(nest)
        .map(|(namespace, n)| n.hold_network(namespace));
    // In the nest, bubblewrap is not the process spawned (that one has
    // exited) but the one it started for us.
    let (pid, staged) = match reported {
        None => (Some(launched.pid as i32), None),
        Some(Reported {
            bubblewrap: Some(pid),
            staged: Some(Ok(fd)),
            ..
        }) => (Some(pid), Some(fd)),
        Some(Reported {
            bubblewrap: Some(pid),
            staged: None,
            ..
        }) if recipe.stage.is_none() => (Some(pid), None),
        Some(r) => {
            kill_and_reap(r.bubblewrap);
            return Err(io::Error::other(match r.staged {
                Some(Err(why)) => why,
                _ => "bubblewrap did not start in the nest".to_string(),
            }));
        }
    };
    let pid = pid.unwrap_or_default() as u32;
    let process = match Process::adopt(pid) {
        Ok(p) => p,
        Err(e) => {
            kill_and_reap(Some(pid as i32));
            return Err(e);
        }
    };
    Ok(Spawned {
        process,
        lease,
        code,
        block: block_w,
        status: status_r,
        stdout,
        stderr,
        options: options_w,
        seccomp: seccomp_w,
        options_data,
        staged,
        go,
        view,
        masks,
        reaped: nest.map(|n| n.reaped().clone()),
        network,
    })
}

/// A pipe whose read end bubblewrap gets, already full: the write end has
/// room again once bubblewrap reads it.
fn full_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
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

/// Waits until bubblewrap reads the (full) `sync` pipe, then mounts what
/// `attach` mounts (the /proc masks and the staged filesystems, a store
/// view) into the sandbox's mount namespace, from the stage's (both in
/// `namespaces`); dropping `sync` lets bubblewrap go on.
/// A bubblewrap that ended first is left for the run to report.
fn mount_from_view(
    sync: OwnedFd,
    attach: &ViewAttach,
    namespaces: &HeldNamespaces,
) -> io::Result<()> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let deadline = std::time::Instant::now() + INIT_LIMIT;
    let revents = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::other(
                "bubblewrap did not finish setting the sandbox up in time",
            ));
        }
        let timeout = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        };
        let mut fds = [PollFd::new(&sync, PollFlags::OUT)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => break fds[0].revents(),
            Err(e) => return Err(e.into()),
        }
    };
    if revents.intersects(PollFlags::ERR | PollFlags::HUP) {
        return Ok(());
    }
    attach.run(namespaces.sandbox.as_ref(), namespaces.stage.as_ref())
}

/// Each /proc mask's source in the masks' view and its target while
/// bubblewrap sets the sandbox up (see `Executor`'s `proc_masks`).
fn mask_mounts(platform: &Platform) -> Vec<(std::path::PathBuf, std::path::PathBuf)> {
    let in_view = |p: &std::path::Path| platform.view_dir.join(p.file_name().unwrap_or_default());
    let layout = &platform.layout;
    let files = layout
        .proc_masked_files
        .iter()
        .map(|f| (in_view(&layout.empty_file), f));
    let dirs = layout
        .proc_masked_dirs
        .iter()
        .map(|d| (in_view(&platform.empty_dir), d));
    files
        .chain(dirs)
        .map(|(source, target)| (source, jail::while_set_up(target)))
        .collect()
}

/// Kills and reaps a child the daemon could not take charge of.
fn kill_and_reap(pid: Option<i32>) {
    if let Some(pid) = pid.and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}

impl Spawned {
    /// Moves the waiting bubblewrap into its cgroup with the run's limits
    /// (unless it joined the group itself before exec; see
    /// [`Lease::join_at_exec`]), hands it its options and seccomp filter,
    /// and waits until it has created the sandbox's init; it then builds
    /// the mounts and waits to start the command. Blocking (the cgroup
    /// migration waits for the kernel; see [`Lease::adopt`]).
    pub(super) fn set_up(
        mut self,
        recipe: &Recipe,
        run_as: Option<(u32, u32)>,
    ) -> io::Result<Prepared> {
        self.lease.apply(&recipe.env.limits)?;
        self.lease.adopt(self.process.pid())?;
        // A write fails only when bubblewrap has exited; the run reports why.
        let _ = std::fs::File::from(self.options).write_all(&self.options_data);
        let _ = std::fs::File::from(self.seccomp).write_all(&recipe.program.0);
        let mut status = Status::new(self.status);
        let bubblewrap = self.process.pid() as i32;
        let init = status.wait_for_init(INIT_LIMIT).and_then(|named| {
            // In the nest bubblewrap names it in the nest's pid namespace.
            let (pid, nest) = match &self.reaped {
                Some(reaped) => (
                    super::pidns::child_known_as(bubblewrap, named)?,
                    Some((named, reaped.clone())),
                ),
                None => (named, None),
            };
            watch_child_of(pid, &mut self.process, nest).map(|w| (pid, w))
        });
        // No init: bubblewrap failed to set the sandbox up, which the run reports.
        let mut listener = None;
        let mut namespaces = HeldNamespaces::default();
        let init = match init {
            Some((pid, watched)) => {
                namespaces = hold_mount_namespaces(bubblewrap, pid);
                // In bubblewrap's order: the masks once /proc is mounted,
                // the store view after every other mount.
                if let Some((sync, attach)) = self.masks.take() {
                    mount_from_view(sync, &attach, &namespaces)?;
                }
                if let Some((sync, attach)) = self.view.take() {
                    mount_from_view(sync, &attach, &namespaces)?;
                }
                limit_init(pid, &recipe.init_rlimits, run_as)?;
                if recipe.env.network.policy().is_some() {
                    // The nest's owner has every capability in the
                    // sandboxes' namespaces; without the nest, bubblewrap's
                    // identity owns them.
                    let joiner = if self.reaped.is_some() { None } else { run_as };
                    listener = Some(crate::network::listen_in(
                        pid,
                        joiner,
                        crate::network::PROXY_PORT,
                    )?);
                }
                Some(watched)
            }
            None => None,
        };
        let go = match (&recipe.warm, self.go) {
            (Some(warm), Some((pipe, number))) => {
                if let Some(root) = &self.staged {
                    warm.stage(root, number, run_as)?;
                }
                Some(Go {
                    pipe,
                    message: warm.go(number),
                })
            }
            _ => None,
        };
        Ok(Prepared {
            process: self.process,
            init,
            lease: self.lease,
            code: self.code,
            block: self.block,
            status,
            stdout: self.stdout,
            stderr: self.stderr,
            reservation: None,
            proxy_listener: listener,
            staged: self.staged,
            namespaces,
            network: self.network,
            go,
            released: false,
        })
    }
}

/// Descriptors on the mount namespace bubblewrap runs in (the nest's
/// stage, when it staged) and on the sandbox's own, through which the
/// mounts from outside are made. The last process to
/// leave a mount namespace unmounts all of it before its descriptors close,
/// and so before the sandbox's streams reach their end (0.4 ms a
/// namespace here); held by the daemon, the namespaces are torn down once
/// the call has its result.
fn hold_mount_namespaces(bubblewrap: i32, init: i32) -> HeldNamespaces {
    let open = |pid: i32, ns: &str| {
        rustix::fs::open(
            format!("/proc/{pid}/ns/{ns}"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()
    };
    HeldNamespaces {
        stage: open(bubblewrap, "mnt"),
        sandbox: open(init, "mnt"),
    }
}

/// Namespaces the daemon holds (see [`hold_mount_namespaces`]). Whoever
/// drops the sandbox, the last descriptor of a namespace unmounts all of
/// it, which takes a while: dropped on the runtime, they are closed on a
/// blocking thread.
#[derive(Debug, Default)]
pub(super) struct HeldNamespaces {
    stage: Option<OwnedFd>,
    sandbox: Option<OwnedFd>,
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

/// Sets `rlimits` on the sandbox's init, which has not started the command
/// yet: the command and everything it starts inherit them, counted inside
/// the sandbox's user namespace. A daemon running as root without
/// CAP_SYS_RESOURCE may not change another user's limits, so this thread
/// takes the sandbox's identity for the call (only this thread: the
/// credential system calls act per thread).
fn limit_init(pid: i32, rlimits: &[Rlimit], run_as: Option<(u32, u32)>) -> io::Result<()> {
    let Some(pid) = Pid::from_raw(pid) else {
        return Ok(());
    };
    let apply = || -> io::Result<()> {
        for r in rlimits {
            let limit = rustix::process::Rlimit {
                current: Some(r.value),
                maximum: Some(r.value),
            };
            rustix::process::prlimit(Some(pid), r.resource, limit)?;
        }
        Ok(())
    };
    match (apply(), run_as) {
        (Ok(()), _) => Ok(()),
        (Err(e), Some((uid, gid))) if e.raw_os_error() == Some(libc::EPERM) => {
            as_sandbox_user(uid, gid, apply)
        }
        (Err(e), _) => Err(io::Error::other(format!(
            "cannot limit the sandbox's processes: {e}"
        ))),
    }
}

/// Runs `f` on this thread as `uid`/`gid` (keeping root as the saved
/// identity to return to). Aborts the process if the identity cannot be
/// restored: a daemon thread must never go on as another user.
fn as_sandbox_user(uid: u32, gid: u32, f: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
    let root = (Uid::ROOT, Gid::ROOT);
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    set_thread_res_gid(gid, gid, root.1)?;
    if let Err(e) = set_thread_res_uid(uid, uid, root.0) {
        let _ = set_thread_res_gid(root.1, root.1, root.1);
        return Err(e.into());
    }
    let result = f();
    if set_thread_res_uid(root.0, root.0, root.0).is_err()
        || set_thread_res_gid(root.1, root.1, root.1).is_err()
    {
        tracing::error!("cannot return to root after limiting a sandbox; stopping");
        std::process::abort();
    }
    result
}
