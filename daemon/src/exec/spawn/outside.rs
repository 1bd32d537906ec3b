//! What the nest mounts into a sandbox from outside while its bubblewrap
//! sets it up, all derived from the plan: at the /proc masks' pipe, the
//! masks (from their view) with the plan's [`OutsideMounts`] (its /etc and
//! staged filesystems) and, where the plan says so, the root made
//! read-only; at the store view's pipe, the closure's view over the store.
//! bubblewrap blocks reading each pipe (full, see `wiring`) until the
//! mounts are made.
//!
//! [`OutsideMounts`]: crate::jail::OutsideMounts

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::INIT_LIMIT;
use crate::exec::nest::{Nest, ViewAttach};
use crate::exec::recipe::Recipe;
use crate::exec::wiring::{CodeFile, HeldNamespaces, Wiring};
use crate::jail::{self, Op, Source};
use crate::platform::Platform;

/// The mounts from outside, each waiting for its pipe's write end.
pub(super) struct FromOutside {
    masks: Option<ViewAttach>,
    view: Option<ViewAttach>,
}

impl FromOutside {
    /// Each attach with the write end of the pipe it waits on.
    #[allow(clippy::type_complexity)]
    pub(super) fn with_pipes(
        self,
        masks: Option<OwnedFd>,
        view: Option<OwnedFd>,
    ) -> (Option<(OwnedFd, ViewAttach)>, Option<(OwnedFd, ViewAttach)>) {
        (masks.zip(self.masks), view.zip(self.view))
    }
}

/// What the nest mounts from outside for `recipe`'s plan, wired as `wiring`.
pub(super) fn plan(
    platform: &Platform,
    nest: Option<&Nest>,
    recipe: &Recipe,
    wiring: &Wiring,
) -> io::Result<FromOutside> {
    let plan = &recipe.plan;
    let root = jail::while_set_up(Path::new("/"));
    let needs_nest = || io::Error::other("mounting from outside needs the nest");
    let masks = match (&wiring.masks_sync, &recipe.masks) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(io::Error::other(
                "the plan waits for the /proc masks, and there is no view of them",
            ));
        }
        (Some(_), Some(view)) => {
            let code_file = match &wiring.code {
                Some(CodeFile::Host(file)) => Some(file.path()),
                _ => None,
            };
            let staged = plan
                .outside
                .mounts
                .iter()
                .map(|m| {
                    let source = match &m.source {
                        Source::Host(p) => p.as_path(),
                        Source::CodeFile => code_file.ok_or_else(|| {
                            io::Error::other("the plan mounts a code file there is none of")
                        })?,
                    };
                    Ok((
                        source.to_path_buf(),
                        jail::while_set_up(&m.target),
                        m.read_only,
                    ))
                })
                .collect::<io::Result<Vec<_>>>()?;
            let read_only_root = plan.outside.read_only_root.then_some(root.as_path());
            Some(nest.ok_or_else(needs_nest)?.view_attach(
                view.clone(),
                &mask_mounts(platform),
                &staged,
                read_only_root,
            )?)
        }
    };
    let store = plan.ops.iter().find_map(|op| match op {
        Op::StoreView { store, .. } => Some(store),
        _ => None,
    });
    let view = match (store, &recipe.view) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(io::Error::other(
                "the plan mounts a store view, and there is none",
            ));
        }
        // Every other mount is made: the root is made read-only with it
        // (see `Op::StoreView`).
        (Some(store), Some(view)) => Some(nest.ok_or_else(needs_nest)?.view_attach(
            view.clone(),
            &[(platform.view_dir.clone(), jail::while_set_up(store))],
            &[],
            Some(&root),
        )?),
    };
    Ok(FromOutside { masks, view })
}

/// Each /proc mask's source in the masks' view and its target while
/// bubblewrap sets the sandbox up (see `Executor`'s `proc_masks`).
fn mask_mounts(platform: &Platform) -> Vec<(PathBuf, PathBuf)> {
    let in_view = |p: &Path| platform.view_dir.join(p.file_name().unwrap_or_default());
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

/// Waits until bubblewrap reads the (full) `sync` pipe, then mounts what
/// `attach` mounts into the sandbox's mount namespace, from the stage's
/// (both in `namespaces`); dropping `sync` lets bubblewrap go on.
/// A bubblewrap that ended first is left for the run to report.
pub(super) fn mount_when_waited_for(
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
