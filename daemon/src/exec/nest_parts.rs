//! What the executor holds in the nest, set up once at its start: the nest
//! itself (or why sandboxes start without it), what staged sandboxes'
//! bubblewrap needs of the host's root, the view the /proc masks are
//! mounted from, and the store views of closures, made as they are first
//! needed. Each is optional: without it, sandboxes are set up another way,
//! and the log says why.

use std::sync::Arc;

use super::{Executor, nest};
use crate::config::{Switches, knobs};
use crate::environment::{Environment, RootFs};
use crate::platform::Platform;
use crate::sync::Recover;

/// The nest and what lives in it, as the executor starts.
pub(super) struct NestParts {
    /// Every sandbox starts in the nest, when the host allows one; else why not.
    pub(super) nest: Result<nest::Nest, String>,
    /// What staged sandboxes' bubblewrap needs of the host's root, when it
    /// runs in a root of its own (see `nest::root`); else why not.
    pub(super) host_root: Result<nest::root::HostRoot, String>,
    /// The view the /proc masks are mounted from, when there is a nest.
    pub(super) masks: Option<Arc<nest::view::View>>,
}

impl NestParts {
    pub(super) fn start(platform: &Platform, switches: Switches) -> NestParts {
        let nest = if !switches.nest {
            Err(Switches::off(knobs::NEST_VAR))
        } else {
            nest::Nest::start(&platform.stage_dir).and_then(|n| {
                n.probe(platform.run_as, &nest::StageSpec::scratch())
                    .map(|()| n)
            })
        };
        if let Err(e) = &nest {
            tracing::warn!("sandboxes start without the nest: {e}");
        }
        let host_root = match &nest {
            Ok(n) => host_root(n, platform, switches),
            Err(_) => Err("no nest".to_string()),
        };
        if let (Ok(_), Err(e)) = (&nest, &host_root) {
            tracing::warn!("sandboxes see all of the host's mounts: {e}");
        }
        let masks = match &nest {
            Ok(n) => proc_masks(n, platform),
            Err(_) => None,
        };
        NestParts {
            nest,
            host_root,
            masks,
        }
    }
}

impl Executor {
    /// The store view of `env`'s closure, made the first time it is asked
    /// for (blocking: a helper and a mount per store path); none without
    /// the nest, with views turned off, or when the view cannot be made.
    pub(super) fn view_for(&self, env: &Environment) -> Option<Arc<nest::view::View>> {
        let RootFs::Closure { store_paths, .. } = &env.root else {
            return None;
        };
        let nest = self.inner.nest.as_ref().ok()?;
        if !self.inner.switches.store_view {
            return None;
        }
        crate::jail::store_dir(store_paths)?;
        let mut views = self.inner.views.lock().recover();
        // A view that could not be mounted into a sandbox is given up.
        if let Some(Some(v)) = views.get(store_paths)
            && v.failed.load(std::sync::atomic::Ordering::SeqCst)
        {
            tracing::warn!(
                "the closure of {} is bound path by path from now on: its store view could not be mounted into a sandbox",
                env.name
            );
            views.insert(store_paths.clone(), None);
        }
        views
            .entry(store_paths.clone())
            .or_insert_with(
                || match nest.make_view(&self.inner.platform.view_dir, store_paths) {
                    Ok(v) => Some(Arc::new(v)),
                    Err(e) => {
                        tracing::warn!("the closure of {} is bound path by path: {e}", env.name);
                        None
                    }
                },
            )
            .clone()
    }
}

/// What bubblewrap needs of the host's root, once a sandbox rooted that
/// way has run it; else why sandboxes see the host's whole root.
fn host_root(
    nest: &nest::Nest,
    platform: &Platform,
    switches: Switches,
) -> Result<nest::root::HostRoot, String> {
    if !switches.own_root {
        return Err(Switches::off(knobs::OWN_ROOT_VAR));
    }
    let root = nest::root::HostRoot::for_bubblewrap(&platform.bwrap).ok_or_else(|| {
        format!(
            "{} is not a program whose needs are known",
            platform.bwrap.display()
        )
    })?;
    let entries = root.entries(&[], &platform.stage_dir);
    nest.probe_host_root(platform.run_as, entries, &platform.bwrap)?;
    Ok(root)
}

/// The view the /proc masks are mounted from: the empty file (over each
/// masked file) and the empty directory (over each masked directory).
/// `None` when there is nothing to mask or the view cannot be made; then
/// bubblewrap mounts each mask itself.
fn proc_masks(nest: &nest::Nest, platform: &Platform) -> Option<Arc<nest::view::View>> {
    let layout = &platform.layout;
    if layout.proc_masked_files.len() + layout.proc_masked_dirs.len() > nest::view::ATTACH_MOST {
        return None;
    }
    let sources = [layout.empty_file.clone(), platform.empty_dir.clone()];
    match nest.make_view(&platform.view_dir, &sources) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            tracing::warn!("bubblewrap mounts each /proc mask itself: {e}");
            None
        }
    }
}
