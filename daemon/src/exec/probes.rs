//! What this host lets sandboxes have, asked of the executor by `doctor`
//! and for the tool description: the protections it cannot give, whether
//! sandboxes start in the nest, and probes of store views and the project
//! overlay.

use super::{Executor, nest};
use crate::config::{Switches, knobs};

impl Executor {
    /// Protections this host cannot give, a few words each, for the tool
    /// description (`doctor` explains each, with its fix).
    pub fn missing_protections(&self) -> Vec<&'static str> {
        let layout = &self.inner.platform.layout;
        let mut missing = Vec::new();
        if !layout.features.disable_userns || !layout.features.add_seccomp_fd {
            missing.push("nested user namespaces not fully blocked (old bubblewrap)");
        }
        if self.inner.enforcer.mechanism() == crate::limits::Mechanism::Rlimits {
            missing.push(
                "no cgroup: memory limited per process and not for shared memory (MAP_SHARED, memfd)",
            );
        }
        if self.inner.nest.is_err() {
            missing.push("no bound on the number of files written");
        }
        missing
    }

    /// Whether sandboxes start in the nest, or why they do not.
    pub fn nest(&self) -> Result<(), &str> {
        self.inner.nest.as_ref().map(|_| ()).map_err(|e| e.as_str())
    }

    /// Whether closures are bound through store views, or why not: makes a
    /// view of one directory (the server's own /etc) and drops it.
    pub fn probe_store_view(&self) -> Result<(), String> {
        let nest = self
            .inner
            .nest
            .as_ref()
            .map_err(|e| format!("no nest ({e})"))?;
        if !self.inner.switches.store_view {
            return Err(Switches::off(knobs::STORE_VIEW_VAR));
        }
        let platform = &self.inner.platform;
        nest.make_view(
            &platform.view_dir,
            std::slice::from_ref(&platform.layout.etc_dir),
        )
        .map(drop)
    }

    /// Whether the nest can show `project` through overlayfs (it stages a
    /// sandbox's view of it, for a program that exits at once), or why not.
    pub fn probe_overlay(&self, project: &std::path::Path) -> Result<(), String> {
        let nest = self
            .inner
            .nest
            .as_ref()
            .map_err(|e| format!("no nest ({e})"))?;
        let spec = nest::StageSpec {
            project: Some(crate::jail::StagedProject {
                host_path: project.to_path_buf(),
                writable: true,
            }),
            ..nest::StageSpec::scratch()
        };
        nest.probe(self.inner.platform.run_as, &spec)
    }
}
