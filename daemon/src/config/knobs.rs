//! The `NIX_SANDBOX_*` environment variables, read once, here, into typed
//! settings that travel with the [`Config`](super::Config); nothing else
//! reads them. `--help` (ENVIRONMENT) and the README list them for users.
//!
//! | variable | setting | values |
//! |---|---|---|
//! | `NIX_SANDBOX_BUILTIN` | [`Knobs::builtin_dirs`] | `:`-separated directories (the package's wrapper sets it) |
//! | `NIX_SANDBOX_DIR` | [`Knobs::artifact_dirs`] | `:`-separated directories |
//! | `NIX_SANDBOX_ENVS` | [`Knobs::flake_refs`] | `,`-separated flake references |
//! | `NIX_SANDBOX_FLAKE` | [`Knobs::own_flake`] | this package's flake (the wrapper sets it) |
//! | `NIX_SANDBOX_BWRAP` | [`Knobs::bwrap`] | a bubblewrap binary |
//! | `NIX_SANDBOX_MCP_COMMAND` | [`Knobs::client_command`] | an absolute path (the wrapper sets it) |
//! | `NIX_SANDBOX_LIMITS` | [`Knobs::limits`] | `auto`, `rlimits` |
//! | `NIX_SANDBOX_NEST`, `_POOL`, `_STORE_VIEW`, `_WARM_START`, `_OWN_ROOT` | [`Switches`] | `on`, `off` |
//!
//! Two more exist only in builds with the `test-knobs` feature (the test
//! suites'), never in a release: `NIX_SANDBOX_TEST_RESOLVE` (the proxy's
//! answers for names, instead of DNS), `NIX_SANDBOX_TEST_CONFIRM_TTL_MS`
//! (how long a confirmation token lives) and `NIX_SANDBOX_TEST_TRUST` (a PEM
//! file of certificate authorities trusted besides the system's). See
//! [`TestKnobs`].

use std::path::PathBuf;

use super::ConfigError;

pub const BUILTIN_VAR: &str = "NIX_SANDBOX_BUILTIN";
pub const DIR_VAR: &str = "NIX_SANDBOX_DIR";
pub const ENVS_VAR: &str = "NIX_SANDBOX_ENVS";
pub const FLAKE_VAR: &str = "NIX_SANDBOX_FLAKE";
pub const BWRAP_VAR: &str = "NIX_SANDBOX_BWRAP";
pub const MCP_COMMAND_VAR: &str = "NIX_SANDBOX_MCP_COMMAND";
pub const LIMITS_VAR: &str = "NIX_SANDBOX_LIMITS";
pub const NEST_VAR: &str = "NIX_SANDBOX_NEST";
pub const POOL_VAR: &str = "NIX_SANDBOX_POOL";
pub const STORE_VIEW_VAR: &str = "NIX_SANDBOX_STORE_VIEW";
pub const WARM_START_VAR: &str = "NIX_SANDBOX_WARM_START";
pub const OWN_ROOT_VAR: &str = "NIX_SANDBOX_OWN_ROOT";

/// What the process's environment asks of the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Knobs {
    /// Artifact directories baked into the package.
    pub builtin_dirs: Vec<PathBuf>,
    /// Directories of pre-built artifacts (`None`: the default one).
    pub artifact_dirs: Option<Vec<PathBuf>>,
    /// Flake references to build at start-up.
    pub flake_refs: Vec<String>,
    /// This package's flake, when it is the Nix package.
    pub own_flake: Option<PathBuf>,
    /// The bubblewrap to use instead of looking for one.
    pub bwrap: Option<PathBuf>,
    /// The command clients are told to run, instead of this binary.
    pub client_command: Option<PathBuf>,
    pub limits: LimitsChoice,
    pub switches: Switches,
    #[cfg(any(test, feature = "test-knobs"))]
    pub test: TestKnobs,
}

/// How limits are enforced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LimitsChoice {
    /// cgroup v2, else v1, else rlimits.
    #[default]
    Auto,
    /// rlimits only, cgroups never used.
    Rlimits,
}

/// Mechanisms that can be turned off, for troubleshooting and to measure
/// what each saves; each is on unless its variable is `off`. With any off,
/// a sandbox holds the same, or (the nest) says what it lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// Sandboxes start in the nest (staged filesystems, the project's
    /// overlay, pooled network namespaces).
    pub nest: bool,
    /// Sandboxes are set up ahead of their call.
    pub pool: bool,
    /// A closure is mounted through a store view, not bound path by path.
    pub store_view: bool,
    /// Interpreters kept ready are started ahead of their call.
    pub warm_start: bool,
    /// A staged sandbox's bubblewrap runs in a root holding only what it needs.
    pub own_root: bool,
}

impl Default for Switches {
    fn default() -> Switches {
        Switches {
            nest: true,
            pool: true,
            store_view: true,
            warm_start: true,
            own_root: true,
        }
    }
}

impl Switches {
    /// How the server names a switch turned off, in logs and doctor.
    pub fn off(var: &str) -> String {
        format!("{var}=off")
    }
}

/// Knobs the test suites turn and a release build does not have.
#[cfg(any(test, feature = "test-knobs"))]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestKnobs {
    /// `name=address,…`: the proxy's answers for these names (see
    /// `network::Resolver`); every address still passes its filter.
    pub resolve: Option<String>,
    /// How long a confirmation token lives, and the longest a question
    /// to the user waits.
    pub confirm_ttl_ms: Option<u64>,
    /// A PEM file of authorities the server trusts besides the system's.
    pub trust: Option<PathBuf>,
}

#[cfg(any(test, feature = "test-knobs"))]
pub const TEST_RESOLVE_VAR: &str = "NIX_SANDBOX_TEST_RESOLVE";
#[cfg(any(test, feature = "test-knobs"))]
pub const TEST_CONFIRM_TTL_VAR: &str = "NIX_SANDBOX_TEST_CONFIRM_TTL_MS";
#[cfg(any(test, feature = "test-knobs"))]
pub const TEST_TRUST_VAR: &str = "NIX_SANDBOX_TEST_TRUST";

impl Knobs {
    /// The process's own variables.
    pub fn from_env() -> Result<Knobs, ConfigError> {
        Knobs::read(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// The variables `get` gives (an empty value is an unset one).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<Knobs, ConfigError> {
        let get = |name: &str| get(name).filter(|v| !v.is_empty());
        let list = |name: &str, sep: char| -> Vec<String> {
            get(name)
                .unwrap_or_default()
                .split(sep)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        let paths = |name: &str| list(name, ':').into_iter().map(PathBuf::from).collect();
        let invalid = |name: &'static str, value: String, message: &str| ConfigError::Env {
            name,
            value,
            message: message.to_string(),
        };
        let switch = |name: &'static str| match get(name) {
            None => Ok(true),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "on" => Ok(true),
                "off" => Ok(false),
                _ => Err(invalid(name, v, "expected on or off")),
            },
        };
        let limits = match get(LIMITS_VAR) {
            None => LimitsChoice::Auto,
            Some(v) => match v.as_str() {
                "auto" => LimitsChoice::Auto,
                "rlimits" => LimitsChoice::Rlimits,
                _ => return Err(invalid(LIMITS_VAR, v, "expected auto or rlimits")),
            },
        };
        let artifact_dirs: Vec<PathBuf> = paths(DIR_VAR);
        let client_command = match get(MCP_COMMAND_VAR).map(PathBuf::from) {
            Some(p) if !p.is_absolute() => {
                return Err(invalid(
                    MCP_COMMAND_VAR,
                    p.display().to_string(),
                    "expected an absolute path",
                ));
            }
            p => p,
        };
        Ok(Knobs {
            builtin_dirs: paths(BUILTIN_VAR),
            artifact_dirs: (!artifact_dirs.is_empty()).then_some(artifact_dirs),
            flake_refs: list(ENVS_VAR, ','),
            own_flake: get(FLAKE_VAR).map(PathBuf::from),
            bwrap: get(BWRAP_VAR).map(PathBuf::from),
            client_command,
            limits,
            switches: Switches {
                nest: switch(NEST_VAR)?,
                pool: switch(POOL_VAR)?,
                store_view: switch(STORE_VIEW_VAR)?,
                warm_start: switch(WARM_START_VAR)?,
                own_root: switch(OWN_ROOT_VAR)?,
            },
            #[cfg(any(test, feature = "test-knobs"))]
            test: TestKnobs {
                resolve: get(TEST_RESOLVE_VAR),
                trust: get(TEST_TRUST_VAR).map(PathBuf::from),
                confirm_ttl_ms: match get(TEST_CONFIRM_TTL_VAR) {
                    None => None,
                    Some(v) => {
                        Some(v.parse().map_err(|_| {
                            invalid(TEST_CONFIRM_TTL_VAR, v, "expected milliseconds")
                        })?)
                    }
                },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Knobs, ConfigError> {
        Knobs::read(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn nothing_set_is_every_default() {
        assert_eq!(read(&[]).unwrap(), Knobs::default());
        // Set but empty is unset.
        let empty: Vec<(&str, &str)> = [
            BUILTIN_VAR,
            DIR_VAR,
            ENVS_VAR,
            FLAKE_VAR,
            BWRAP_VAR,
            MCP_COMMAND_VAR,
            LIMITS_VAR,
            NEST_VAR,
            POOL_VAR,
        ]
        .iter()
        .map(|v| (*v, ""))
        .collect();
        assert_eq!(read(&empty).unwrap(), Knobs::default());
    }

    #[test]
    fn each_switch_turns_off_alone_and_a_typo_is_refused() {
        for (var, off) in [
            (
                NEST_VAR,
                Switches {
                    nest: false,
                    ..Default::default()
                },
            ),
            (
                POOL_VAR,
                Switches {
                    pool: false,
                    ..Default::default()
                },
            ),
            (
                STORE_VIEW_VAR,
                Switches {
                    store_view: false,
                    ..Default::default()
                },
            ),
            (
                WARM_START_VAR,
                Switches {
                    warm_start: false,
                    ..Default::default()
                },
            ),
            (
                OWN_ROOT_VAR,
                Switches {
                    own_root: false,
                    ..Default::default()
                },
            ),
        ] {
            assert_eq!(read(&[(var, "off")]).unwrap().switches, off, "{var}");
            assert_eq!(read(&[(var, "OFF")]).unwrap().switches, off, "{var}");
            assert_eq!(read(&[(var, "on")]).unwrap().switches, Switches::default());
            let e = read(&[(var, "of")]).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("environment variable {var}=\"of\": expected on or off")
            );
        }
    }

    #[test]
    fn lists_limits_and_paths() {
        let k = read(&[
            (DIR_VAR, "/a:/b: :"),
            (ENVS_VAR, "github:x/y#a, ./local#b"),
            (LIMITS_VAR, "rlimits"),
            (MCP_COMMAND_VAR, "/nix/store/x/bin/nix-sandbox-mcp"),
        ])
        .unwrap();
        assert_eq!(
            k.artifact_dirs,
            Some(vec![PathBuf::from("/a"), PathBuf::from("/b")])
        );
        assert_eq!(k.flake_refs, ["github:x/y#a", "./local#b"]);
        assert_eq!(k.limits, LimitsChoice::Rlimits);
        let e = read(&[(LIMITS_VAR, "cgroups")]).unwrap_err().to_string();
        assert!(e.contains("expected auto or rlimits"), "{e}");
        let e = read(&[(MCP_COMMAND_VAR, "nix-sandbox-mcp")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected an absolute path"), "{e}");
        let e = read(&[(TEST_CONFIRM_TTL_VAR, "soon")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected milliseconds"), "{e}");
    }
}
