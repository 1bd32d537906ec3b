//! Flake references listed in `NIX_SANDBOX_ENVS` (comma-separated), each
//! built by Nix at start-up into a sandbox artifact served under its own name.

use super::flakes::{self, Build, Target};
use super::source::{Context, Loaded, Role, Source};

pub(super) struct FlakeRefs {
    refs: Vec<String>,
}

impl FlakeRefs {
    pub(super) fn new(knobs: &crate::config::Knobs) -> FlakeRefs {
        FlakeRefs {
            refs: knobs.flake_refs.clone(),
        }
    }
}

impl Source for FlakeRefs {
    fn name(&self) -> &'static str {
        crate::config::knobs::ENVS_VAR
    }

    fn describe(&self, _: &Context) -> String {
        if self.refs.is_empty() {
            "no flake references".to_string()
        } else {
            format!("builds {}", self.refs.join(", "))
        }
    }

    fn load(&self, ctx: &Context) -> Loaded {
        let pending = self
            .refs
            .iter()
            .map(|r| {
                let build = Build {
                    label: r.clone(),
                    name: None,
                    target: Target::Reference(r.clone()),
                };
                flakes::pending(build, Role::Extra, ctx.config)
            })
            .collect();
        Loaded {
            pending,
            ..Loaded::default()
        }
    }
}
