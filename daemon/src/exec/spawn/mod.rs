//! Starting bubblewrap for a recipe, in steps, each in its own place:
//!
//! 1. reserve the cgroup (`limits`);
//! 2. open the wiring the plan needs (`exec/wiring.rs`);
//! 3. plan what the nest mounts from outside while bubblewrap waits on a
//!    pipe: the /proc masks and staged filesystems, a store view
//!    (`outside.rs`);
//! 4. render the plan to bubblewrap's options (`jail::options`);
//! 5. start the child with the rlimits, the identity switch and exactly
//!    the descriptors bubblewrap needs, entering the nest (`child.rs`,
//!    `launch.rs`; on cgroup v1 the process joins its cgroup there, see
//!    `Lease::join_at_exec`);
//! 6. adopt what the nest reports: bubblewrap's pid, the staged tmpfs,
//!    the network namespace (`report.rs`).
//!
//! Then, off the call's critical path, [`Spawned::set_up`] (`set_up.rs`)
//! moves the waiting bubblewrap into its cgroup (elsewhere), hands it its
//! options and seccomp filter, mounts from outside while it waits, and
//! limits its init. The processes are held by pidfd (see `process.rs`).

mod outside;
mod report;
mod set_up;

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use super::child::ChildPlan;
use super::launch::{Output, launch};
use super::nest::{Nest, Reaped, ViewAttach, network};
use super::process::Process;
use super::recipe::{Recipe, nul_separated};
use super::wiring::{CodeFile, Wiring};
use crate::limits::{Enforcer, Lease};
use crate::platform::Platform;

/// How long bubblewrap may take to create the sandbox's namespaces.
const INIT_LIMIT: Duration = Duration::from_secs(10);

/// A bubblewrap just started, blocked reading its options, in its cgroup
/// only if it joined it itself.
pub(super) struct Spawned {
    process: Process,
    lease: Lease,
    code: Option<CodeFile>,
    /// Write end of `--block-fd`.
    block: OwnedFd,
    /// Read end of `--json-status-fd`.
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
    /// The /proc masks and staged filesystems: the write end of the pipe
    /// bubblewrap waits on, and what mounts them meanwhile.
    masks: Option<(OwnedFd, ViewAttach)>,
    /// A store view: the same, later in bubblewrap's set-up.
    view: Option<(OwnedFd, ViewAttach)>,
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
    let plan = &recipe.plan;
    let mut lease = enforcer.reserve()?;
    let join_cgroup = lease.join_at_exec(&recipe.env.limits)?;
    let wiring = Wiring::open(platform, plan, recipe.warm.is_some())?;
    let from_outside = outside::plan(platform, nest, recipe, &wiring)?;
    let options_data = nul_separated(crate::jail::options(
        plan,
        platform.layout.features,
        &wiring.for_jail(),
    ));
    let (entry, receipt) = match (nest, &recipe.stage) {
        (Some(n), stage) => {
            let (entry, receipt) = n.entry(stage.as_ref(), platform.run_as)?;
            (Some(entry), Some(receipt))
        }
        (None, Some(_)) => return Err(io::Error::other("a staged sandbox needs the nest")),
        (None, None) => (None, None),
    };
    let Wiring {
        options,
        seccomp,
        status,
        block,
        go,
        masks_sync,
        view_sync,
        code,
    } = wiring;
    let go = go.map(|(r, w)| {
        let number = r.as_raw_fd();
        (r, (w, number))
    });
    let (go_r, go) = go.unzip();
    // bubblewrap reads the read ends; the write ends wait for the mounts.
    let (masks_r, masks_w) = masks_sync.unzip();
    let (view_r, view_w) = view_sync.unzip();
    let options_fd = options.0.as_raw_fd().to_string();
    let child = ChildPlan {
        hard: recipe
            .rlimits
            .iter()
            .map(|r| rustix::process::getrlimit(r.resource).maximum)
            .collect(),
        rlimits: recipe.rlimits.clone(),
        inherit: Arc::new(
            [options.0, seccomp.0, status.1, block.0]
                .into_iter()
                .chain(go_r)
                .chain(view_r)
                .chain(masks_r)
                .chain(extra)
                .collect(),
        ),
        run_as: platform.run_as,
        nest: entry,
        join_cgroup,
        parent: rustix::process::getpid(),
    };
    let args: Vec<&OsStr> = [
        OsStr::new("--args"),
        OsStr::new(&options_fd),
        OsStr::new("--"),
    ]
    .into_iter()
    .chain(plan.command.iter().map(OsStr::new))
    .collect();
    let launched = launch(&platform.bwrap, &args, &child, Output::Piped);
    // The child's end of the reports closes with the plan.
    drop(child);
    let adopted = report::adopt(launched, receipt, nest, recipe.stage.is_some())?;
    let (masks, view) = from_outside.with_pipes(masks_w, view_w);
    Ok(Spawned {
        process: adopted.process,
        lease,
        code,
        block: block.1,
        status: status.0,
        stdout: adopted.stdout,
        stderr: adopted.stderr,
        options: options.1,
        seccomp: seccomp.1,
        options_data,
        staged: adopted.staged,
        go,
        masks,
        view,
        reaped: nest.map(|n| n.reaped().clone()),
        network: adopted.network,
    })
}
