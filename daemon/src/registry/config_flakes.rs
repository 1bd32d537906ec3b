//! The config's `flake = "…"` entries that the package did not bake in,
//! built by Nix at start-up with this package's flake library (which also
//! wraps a plain package into an artifact), each served under its entry's name.

use std::path::PathBuf;

use super::flakes::{self, Build, Target};
use super::source::{Context, Loaded, Role, Source};

pub(super) struct ConfigFlakes {
    /// This package's flake (`NIX_SANDBOX_FLAKE`), when it is the Nix package.
    own_flake: Option<PathBuf>,
}

impl ConfigFlakes {
    pub(super) fn new(knobs: &crate::config::Knobs) -> ConfigFlakes {
        ConfigFlakes {
            own_flake: knobs.own_flake.clone(),
        }
    }

    /// Entries with a `flake` whose artifact is not baked into the package.
    fn to_build<'a>(
        &self,
        ctx: &'a Context,
    ) -> Vec<(&'a String, &'a String, Option<&'a [String]>)> {
        ctx.config
            .environments
            .iter()
            .flatten()
            .filter_map(|(name, entry)| Some((name, entry.flake.as_ref()?, entry)))
            .filter(|(name, _, _)| {
                !ctx.earlier
                    .iter()
                    .any(|o| o.from == super::builtin::NAME && &o.env.name == *name)
            })
            .map(|(name, flake, entry)| {
                (
                    name,
                    flake,
                    entry.interpreter.as_ref().map(|i| i.0.as_slice()),
                )
            })
            .collect()
    }
}

impl Source for ConfigFlakes {
    fn name(&self) -> &'static str {
        "config flake entries"
    }

    fn describe(&self, ctx: &Context) -> String {
        let names: Vec<&str> = self
            .to_build(ctx)
            .iter()
            .map(|(n, _, _)| n.as_str())
            .collect();
        if names.is_empty() {
            "nothing to build".to_string()
        } else {
            format!("builds environments {}", names.join(", "))
        }
    }

    fn load(&self, ctx: &Context) -> Loaded {
        let pending = self
            .to_build(ctx)
            .into_iter()
            .map(|(name, reference, interpreter)| {
                let target = match &self.own_flake {
                    Some(f) => Target::Expression(flakes::flake_entry_expression(
                        f,
                        name,
                        reference,
                        interpreter,
                    )),
                    // Without this package's flake only a ready artifact can be built.
                    None => Target::Reference(reference.clone()),
                };
                let build = Build {
                    label: format!("environments.{name} ({reference})"),
                    name: Some(name.clone()),
                    target,
                };
                flakes::pending(build, Role::Entry, ctx.config)
            })
            .collect();
        Loaded {
            pending,
            ..Loaded::default()
        }
    }
}
