//! The artifacts baked into the Nix package (`NIX_SANDBOX_BUILTIN`, set by
//! its wrapper): the presets, and the config entries mkServer built. A baked
//! artifact named after a preset is that preset; any other is the config
//! entry of its name.

use std::path::PathBuf;

use super::source::{Context, Loaded, Offer, Role, Source};
use super::{PRESET_NAMES, artifact};

pub(super) const NAME: &str = "package";

pub(super) struct Builtin {
    dirs: Vec<PathBuf>,
}

impl Builtin {
    pub(super) fn new(knobs: &crate::config::Knobs) -> Builtin {
        Builtin {
            dirs: knobs.builtin_dirs.clone(),
        }
    }
}

impl Source for Builtin {
    fn name(&self) -> &'static str {
        NAME
    }

    fn describe(&self, _: &Context) -> String {
        if self.dirs.is_empty() {
            "no artifacts baked in (not the Nix package)".to_string()
        } else {
            format!("{} artifact(s) baked into the package", self.dirs.len())
        }
    }

    fn load(&self, ctx: &Context) -> Loaded {
        let mut loaded = Loaded::default();
        for dir in &self.dirs {
            match artifact::load(dir, ctx.config.defaults) {
                Ok(env) => {
                    let role = if PRESET_NAMES.contains(&env.name.as_str()) {
                        Role::Preset
                    } else {
                        Role::Entry
                    };
                    loaded.offers.push(Offer::new(env, role));
                }
                Err(e) => loaded
                    .warnings
                    .push(format!("sandbox artifact {} skipped: {e}", dir.display())),
            }
        }
        loaded
    }
}
