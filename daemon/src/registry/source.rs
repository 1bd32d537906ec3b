//! What an environment source is: a place environments come from (the
//! package's baked-in artifacts, artifact directories, flake references
//! built by Nix, the config's flake entries, the project's devShell, the
//! host's interpreters). Each source says what it is, offers what it has now
//! and hands over builds still running; the registry decides what to serve.

use std::path::Path;

use futures::future::BoxFuture;

use crate::config::Config;
use crate::environment::Environment;

/// A place environments come from. Adding one is a file implementing this
/// plus a line in [`super::sources`].
pub trait Source: Send + Sync {
    /// How `doctor` and `envs` name it, e.g. `NIX_SANDBOX_DIR`.
    fn name(&self) -> &'static str;
    /// What it is set up to provide here, in one line, for `doctor`.
    fn describe(&self, ctx: &Context) -> String;
    /// Its environments: those ready now and builds still running.
    fn load(&self, ctx: &Context) -> Loaded;
}

/// What every source may consult.
pub struct Context<'a> {
    pub config: &'a Config,
    /// The project directory on the host, when one is mounted.
    pub project: Option<&'a Path>,
    /// What the sources before this one offered.
    pub earlier: &'a [Offer],
}

/// An environment a source offers, and how the registry may use it.
#[derive(Debug, Clone)]
pub struct Offer {
    pub env: Environment,
    pub role: Role,
    /// The [`Source::name`] of the source that offered it (set by the registry).
    pub from: &'static str,
}

impl Offer {
    pub fn new(env: Environment, role: Role) -> Offer {
        Offer {
            env,
            role,
            from: "",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One of the bundled presets (baked into the package, or the host's
    /// interpreter): served when the config lists no environments.
    Preset,
    /// Built for the config entry of the same name (`flake = …`, or baked
    /// into the package by mkServer): served only through that entry.
    Entry,
    /// Offered on its own account (an artifact directory, a flake reference,
    /// the project's devShell): served unless a config entry takes its name.
    Extra,
}
// Config entries find offers by name whatever their role: `preset = "python"`
// takes the latest offer named python, be it baked, in an artifact
// directory, or the host's.

/// A source's result.
#[derive(Default)]
pub struct Loaded {
    pub offers: Vec<Offer>,
    pub warnings: Vec<String>,
    pub pending: Vec<Pending>,
}

/// An environment still being built (by Nix).
pub struct Pending {
    pub about: Building,
    pub build: BoxFuture<'static, Result<Offer, String>>,
    /// What an earlier start built for the same fingerprint (see
    /// `build_cache.rs`): offered at once, and `build` never runs.
    pub cached: Option<Offer>,
}

/// What is known of a build before it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Building {
    /// How the build is named in messages.
    pub label: String,
    /// The name its environment will have, when known before it is built.
    pub name: Option<String>,
}
