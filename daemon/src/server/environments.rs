//! The environments the server offers over time: the start checks' result,
//! each Nix build as it ends, the project's own environments again when
//! the project changes, and the tools and prepared sandboxes that go with
//! them.

// What the server's module imports, and its items.
use super::*;
use crate::sync::Recover;

impl SandboxServer {
    /// Replaces the environments offered (a Nix build ended): new tools,
    /// sandboxes kept ready for the new environments, and the client told.
    pub fn publish(&self, registry: Registry) {
        self.replace_registry(registry);
        self.tell_tools_changed();
    }

    /// The same without telling the client: for the start checks' result,
    /// which tools/list waits for, so that no client saw the list before.
    pub(super) fn replace_registry(&self, registry: Registry) {
        let registry = Arc::new(registry);
        let earlier = std::mem::replace(
            &mut *self.shared.registry.write().recover(),
            registry.clone(),
        );
        registry.log_new_warnings(Some(&earlier));
        self.offer(&registry, Some(&earlier));
    }

    /// Waits until what tools/list and calls depend on is settled: the
    /// environments' start checks (at most [`CHECKS_WAIT`]), and the client's
    /// roots when the project follows them.
    pub(super) async fn ready(&self, peer: &Peer<RoleServer>) {
        let mut checked = self.checked.subscribe();
        let _ = tokio::time::timeout(CHECKS_WAIT, checked.wait_for(|done| *done)).await;
        self.roots_read(peer).await;
    }

    /// Tells the client that the tools changed (see [`tell_tools_changed`]).
    pub(super) fn tell_tools_changed(&self) {
        let listeners = self.listeners.lock().recover().clone();
        let peers = {
            let mut peers = self.peers.lock().recover();
            peers.retain(|p| !p.is_transport_closed());
            peers.clone()
        };
        tell_tools_changed(peers, listeners);
    }

    /// Offers each environment as its Nix build ends, in the background
    /// (replacing builds followed before, which are stopped). With
    /// `check_first`, what `gathered` holds is first started once in the jail
    /// and offered; tools/list and calls wait for that (see [`Self::ready`]).
    pub fn follow_builds(&self, mut gathered: Gathered, builds: Builds, check_first: bool) {
        if check_first {
            self.checked.send_replace(false);
        }
        let server = self.clone();
        let task = tokio::spawn(async move {
            use futures::StreamExt;
            let config = server.shared.config.clone();
            let prober = crate::app::ExecProber(server.shared.executor.clone());
            // Checked, the environments gathered so far; `why_none` says
            // why none is left, when none is (and no build may add one).
            let load = |gathered: Gathered, why_none: &'static str| {
                let (config, prober) = (&config, &prober);
                async move {
                    let registry = crate::registry::load(config, gathered, Some(prober)).await;
                    if registry.offers_nothing() && registry.building.is_empty() {
                        tracing::error!(
                            "no environment is available: {why_none} (see the warnings above)"
                        );
                    }
                    registry
                }
            };
            if check_first {
                let registry = load(gathered.clone(), "none starts in the sandbox").await;
                server.replace_registry(registry);
                server.checked.send_replace(true);
            }
            let mut ended = std::pin::pin!(builds.run());
            while let Some((about, result)) = ended.next().await {
                if let Ok(offer) = &result {
                    tracing::info!("{} is built: environment {}", about.label, offer.env.name);
                }
                gathered.finished(&about, result);
                let registry = load(gathered.clone(), "every Nix build failed").await;
                server.publish(registry);
            }
        });
        if let Some(earlier) = self.building.lock().recover().replace(task) {
            // Dropping its builds kills their `nix build`s.
            earlier.abort();
        }
    }

    /// Stops following builds; their `nix build`s are killed.
    pub fn stop_builds(&self) {
        if let Some(task) = self.building.lock().recover().take() {
            task.abort();
        }
    }

    /// Gathers the environments again for the project now (the `project`
    /// environment of `[project] use_flake` is the project's devShell):
    /// checked and offered, builds followed, in the background.
    pub(super) fn rebuild_for_project(&self) {
        let state = self.shared.project_state();
        let config = self.shared.config.clone();
        let project = state.mount.as_ref().map(|m| m.host_path.as_path());
        let (gathered, builds) =
            crate::registry::gather_now(&config, project, &crate::registry::sources(&config.knobs));
        self.follow_builds(gathered, builds, true);
    }

    /// Watches the project file of the project now, until the project changes.
    pub(super) fn watch_project_file(&self) {
        let state = self.shared.project_state();
        let server = self.clone();
        crate::commands::watch::spawn(
            state.commands.clone(),
            move || server.tell_tools_changed(),
            state.watching.clone(),
        );
    }

    /// Makes the tools for `registry`, and keeps sandboxes ready for each of
    /// its environments that `earlier` did not have (one that changed under
    /// the same name, which a build cannot do, keeps its first recipe's).
    pub(super) fn offer(&self, registry: &Registry, earlier: Option<&Registry>) {
        self.make_tools(registry);
        let shared = &self.shared;
        let state = shared.project_state();
        let project = state.mount.as_ref();
        for env in registry.iter() {
            if earlier.is_some_and(|r| r.get(&env.name).is_some()) {
                continue;
            }
            if let Err(e) = shared
                .executor
                .keep_ready_for(env, project, &shared.inherited)
            {
                tracing::warn!("sandboxes for {} start on demand: {e}", env.name);
            }
        }
        // An environment no longer offered (its start check failed) keeps none.
        for gone in earlier
            .into_iter()
            .flat_map(|r| r.iter())
            .filter(|e| registry.get(&e.name).is_none())
        {
            shared
                .executor
                .stop_keeping_ready_for(gone, project, &shared.inherited);
        }
    }

    /// Makes `run` and `job` for `registry` and the project now.
    pub(super) fn make_tools(&self, registry: &Registry) {
        let shared = &self.shared;
        let state = shared.project_state();
        let project = state.mount.as_ref();
        let envs: Vec<_> = registry.iter().cloned().collect();
        let output_bytes = envs
            .iter()
            .map(|e| e.limits.output_bytes)
            .max()
            .unwrap_or(16 * 1024);
        self.output_bytes.store(output_bytes, Ordering::Relaxed);
        let run = tool::run_tool(
            &envs,
            registry,
            project,
            state.unmounted.as_deref(),
            &state.other_roots,
            output_bytes,
            &shared.executor.missing_protections(),
        );
        *self.tools.write().recover() = vec![
            tool::with_projects(run, &shared.projects),
            tool::job_tool(shared.jobs.limits()),
        ];
    }
}
