//! The project's own development shell (`[project] use_flake = true`): the
//! packages and variables of the project flake's devShell, built by Nix at
//! start-up into the environment `project`.

use std::path::PathBuf;

use super::PROJECT_ENV;
use super::flakes::{self, Build, Target};
use super::source::{Context, Loaded, Role, Source};

pub(super) struct DevShell {
    /// This package's flake (`NIX_SANDBOX_FLAKE`), which knows how to build it.
    own_flake: Option<PathBuf>,
}

impl DevShell {
    pub(super) fn new(knobs: &crate::config::Knobs) -> DevShell {
        DevShell {
            own_flake: knobs.own_flake.clone(),
        }
    }

    /// What to build, or why it cannot be; `None` when not asked for or baked in.
    fn plan(&self, ctx: &Context) -> Option<Result<Build, String>> {
        if !ctx.config.project.use_flake
            || ctx
                .earlier
                .iter()
                .any(|o| o.from == super::builtin::NAME && o.env.name == PROJECT_ENV)
        {
            return None;
        }
        Some(match (&self.own_flake, ctx.project) {
            (_, None) => Err("[project] use_flake: no project is mounted".to_string()),
            (_, Some(p)) if !p.join("flake.nix").is_file() => Err(format!(
                "[project] use_flake: {} has no flake.nix",
                p.display()
            )),
            (None, _) => Err("[project] use_flake needs the Nix package of nix-sandbox-mcp (nix run …#nix-sandbox-mcp), which knows how to build a devShell environment".to_string()),
            (Some(f), Some(p)) => Ok(Build {
                label: format!("the project's devShell ({})", p.display()),
                name: Some(PROJECT_ENV.to_string()),
                target: Target::Expression(flakes::project_expression(f, p)),
            }),
        })
    }
}

impl Source for DevShell {
    fn name(&self) -> &'static str {
        "project devShell"
    }

    fn describe(&self, ctx: &Context) -> String {
        match self.plan(ctx) {
            None => {
                "not used ([project] use_flake is off, or the package has it built in)".to_string()
            }
            Some(Ok(b)) => format!("builds {}", b.label),
            Some(Err(e)) => e,
        }
    }

    fn load(&self, ctx: &Context) -> Loaded {
        let mut loaded = Loaded::default();
        match self.plan(ctx) {
            None => {}
            Some(Ok(build)) => loaded
                .pending
                .push(flakes::pending(build, Role::Extra, ctx.config)),
            Some(Err(e)) => loaded.warnings.push(e),
        }
        loaded
    }
}
