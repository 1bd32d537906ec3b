//! Directories of pre-built sandbox artifacts (`NIX_SANDBOX_DIR`, default
//! `~/.config/nix-sandbox-mcp/sandboxes`): every subdirectory (or link to a
//! store path) holding a manifest is an environment.

use std::path::PathBuf;

use super::artifact;
use super::source::{Context, Loaded, Offer, Role, Source};

pub(super) struct ArtifactDirs {
    dirs: Vec<PathBuf>,
}

impl ArtifactDirs {
    pub(super) fn new(knobs: &crate::config::Knobs) -> ArtifactDirs {
        let dirs = match &knobs.artifact_dirs {
            Some(set) => set.clone(),
            None => crate::config::default_config_path()
                .and_then(|p| p.parent().map(|d| d.join("sandboxes")))
                .into_iter()
                .collect(),
        };
        ArtifactDirs { dirs }
    }
}

impl Source for ArtifactDirs {
    fn name(&self) -> &'static str {
        crate::config::knobs::DIR_VAR
    }

    fn describe(&self, _: &Context) -> String {
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .map(|d| {
                let state = if d.is_dir() { "" } else { " (absent)" };
                format!("{}{state}", d.display())
            })
            .collect();
        format!("artifacts in {}", dirs.join(", "))
    }

    fn load(&self, ctx: &Context) -> Loaded {
        let mut loaded = Loaded::default();
        for dir in &self.dirs {
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    loaded.warnings.push(format!(
                        "cannot read sandbox directory {}: {e}",
                        dir.display()
                    ));
                    continue;
                }
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths
                .into_iter()
                .filter(|p| p.join(artifact::MANIFEST).is_file())
            {
                match artifact::load(&p, ctx.config.defaults) {
                    Ok(env) => loaded.offers.push(Offer::new(env, Role::Extra)),
                    Err(e) => loaded
                        .warnings
                        .push(format!("sandbox artifact {} skipped: {e}", p.display())),
                }
            }
        }
        loaded
    }
}
