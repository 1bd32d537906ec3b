//! Configuration: the TOML file, the environment variables that override it, and
//! built-in defaults. Owns parsing and validation (an error names the file, the
//! key, the line and column of the first problem in the file, and the nearest
//! valid name for a misspelt one) and the schema that is the one definition of the file's keys
//! (`schema.rs`, which the Nix side reads); knows nothing about how environments
//! are resolved or run. Value types with their own rules are in `values.rs`.

pub mod commands;
pub mod http;
pub mod knobs;
mod schema;
#[cfg(test)]
mod tests;
mod values;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

pub use knobs::{Knobs, LimitsChoice, Switches};
pub use schema::json_schema;
pub use values::*;

/// Everything the operator configured, validated.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The file this came from, if any.
    pub file: Option<PathBuf>,
    pub server: ServerSettings,
    pub defaults: LimitSettings,
    pub project: ProjectSettings,
    /// `[projects.NAME]`: other projects a call may name (`project`), by
    /// name: their absolute paths. The project's other settings (mode,
    /// mount point, protected paths) are `[project]`'s.
    pub projects: BTreeMap<String, PathBuf>,
    /// `None` when the file has no `[environments]` table: the built-in presets are served.
    pub environments: Option<BTreeMap<String, EnvironmentSettings>>,
    /// `[commands.NAME]`: declared commands, validated by `commands` once
    /// the environments are known.
    pub commands: BTreeMap<String, commands::CommandDecl>,
    /// `[http]`: serving over Streamable HTTP.
    pub http: http::HttpSettings,
    /// The `NIX_SANDBOX_*` variables (see [`knobs`]).
    pub knobs: Knobs,
}

#[derive(Debug, Clone, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Runs executing at once; further calls wait in the queue.
    pub max_concurrent_runs: Option<Positive>,
    /// Calls allowed to wait for a slot; beyond this a call fails at once with `busy`.
    pub max_queued_runs: Option<u32>,
    /// The most memory, in MiB, that the memory limits of all sandboxes alive
    /// at once (runs, jobs, sessions, those prepared ahead) may add up to.
    pub memory_budget_mb: Option<Positive>,
    /// JSON Lines audit log; off when absent.
    pub audit_log: Option<AbsolutePath>,
    /// Also record the code of each run in the audit log.
    #[serde(default)]
    pub audit_log_code: bool,
    /// Also record the captured output of each run in the audit log.
    #[serde(default)]
    pub audit_log_output: bool,
    /// Time allowed for each environment Nix builds at start-up.
    pub nix_build_timeout_seconds: Option<Positive>,
    /// Background jobs running at once (a finished or killed job does not count).
    pub max_jobs: Option<Positive>,
    /// Time limit of a background run.
    pub job_timeout_seconds: Option<Positive>,
    /// How long a finished job stays readable.
    pub job_retention_seconds: Option<Positive>,
    /// Finished jobs kept readable at most; the oldest are forgotten first.
    pub job_retention_count: Option<Positive>,
    /// Bytes of each output stream a job keeps (the latest).
    pub job_output_bytes: Option<Positive>,
    /// Sessions (run with `session`) open at once.
    pub max_sessions: Option<Positive>,
    /// A session unused this long is closed.
    pub session_idle_seconds: Option<Positive>,
    /// A session is closed this long after it started, used or not.
    pub session_max_lifetime_seconds: Option<Positive>,
}

/// Resource limits and output caps; every field optional so that layers
/// (built-in, `[defaults]`, manifest, `[environments.X]`) can be merged.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    pub timeout_ms: Option<Millis>,
    pub memory_mb: Option<Positive>,
    pub pids: Option<Positive>,
    pub cpu_seconds: Option<Positive>,
    pub cpus: Option<Cpus>,
    pub file_size_mb: Option<Positive>,
    pub open_files: Option<OpenFiles>,
    pub workspace_mb: Option<Positive>,
    /// Files and directories the writable filesystems may hold together.
    pub workspace_files: Option<Positive>,
    pub output_bytes: Option<OutputBytes>,
    pub output_limit_mb: Option<Positive>,
}

impl LimitSettings {
    /// Fields set in `over` replace those in `self`.
    pub fn overlay(self, over: LimitSettings) -> LimitSettings {
        LimitSettings {
            timeout_ms: over.timeout_ms.or(self.timeout_ms),
            memory_mb: over.memory_mb.or(self.memory_mb),
            pids: over.pids.or(self.pids),
            cpu_seconds: over.cpu_seconds.or(self.cpu_seconds),
            cpus: over.cpus.or(self.cpus),
            file_size_mb: over.file_size_mb.or(self.file_size_mb),
            open_files: over.open_files.or(self.open_files),
            workspace_mb: over.workspace_mb.or(self.workspace_mb),
            workspace_files: over.workspace_files.or(self.workspace_files),
            output_bytes: over.output_bytes.or(self.output_bytes),
            output_limit_mb: over.output_limit_mb.or(self.output_limit_mb),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ProjectSettings {
    /// Host directory mounted into every sandbox, relative to the current
    /// directory; `None` means the current directory.
    pub path: Option<PathBuf>,
    /// True when the path came from the config file or `PROJECT_DIR`, not the default.
    pub path_is_explicit: bool,
    pub mount_point: MountPoint,
    pub mode: ProjectMode,
    pub use_flake: bool,
    pub inherit_env: Vec<EnvVarName>,
    /// Paths protected besides the built-in list (see `changes::PROTECTED`).
    pub protected: Vec<ProjectPath>,
    /// What commands of the project's own file may take (see
    /// [`commands::CommandGrant`]), by command name.
    pub grants: BTreeMap<String, commands::CommandGrant>,
}

impl ProjectSettings {
    /// The names in `[project.inherit_env] vars`.
    pub fn inherit_names(&self) -> Vec<String> {
        self.inherit_env.iter().map(|v| v.0.clone()).collect()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
/// `overlay`: writable through a copy-on-write overlay, the host's files are
/// never written (read-only where the host cannot make the overlay);
/// `readonly`; `readwrite`: the host's files themselves, changes are real.
pub enum ProjectMode {
    #[default]
    Overlay,
    Readonly,
    Readwrite,
}

#[derive(Debug, Clone, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSettings {
    /// A bundled preset: `bash` (alias `shell`), `python` or `node`.
    #[serde(default)]
    #[schemars(schema_with = "preset_schema")]
    pub preset: Option<String>,
    /// A host interpreter command; `{file}` stands for the code file (appended when absent).
    pub interpreter: Option<Interpreter>,
    /// A flake output that builds a sandbox artifact or a package set (built by Nix).
    pub flake: Option<String>,
    pub description: Option<String>,
    /// Name of the code file inside `/workspace` (the extension matters to some interpreters).
    pub file_name: Option<FileName>,
    /// `false`, `true` (any public host, through the proxy), or
    /// `{ allow = [...] }`; unset keeps the preset's or artifact's.
    pub network: Option<crate::network::NetworkSetting>,
    /// Syscalls this environment may use although the default filter blocks them.
    #[serde(default)]
    pub seccomp_allow: Vec<String>,
    /// Directories kept between this environment's calls and sessions in
    /// one project (never shared between projects): `~/.cache/pip` in the
    /// sandbox's home, `target` in the project.
    #[serde(default)]
    pub caches: Vec<CachePath>,
    /// The most this environment's caches of one project may hold
    /// together, in MiB (oldest files are removed beyond it). Default 1024.
    pub cache_mb: Option<Positive>,
    pub timeout_ms: Option<Millis>,
    pub memory_mb: Option<Positive>,
    pub pids: Option<Positive>,
    pub cpu_seconds: Option<Positive>,
    pub cpus: Option<Cpus>,
    pub file_size_mb: Option<Positive>,
    pub open_files: Option<OpenFiles>,
    pub workspace_mb: Option<Positive>,
    pub workspace_files: Option<Positive>,
    pub output_bytes: Option<OutputBytes>,
    pub output_limit_mb: Option<Positive>,
}

impl EnvironmentSettings {
    /// The limits this entry sets (unset ones fall through to lower layers).
    pub fn limits(&self) -> LimitSettings {
        LimitSettings {
            timeout_ms: self.timeout_ms,
            memory_mb: self.memory_mb,
            pids: self.pids,
            cpu_seconds: self.cpu_seconds,
            cpus: self.cpus,
            file_size_mb: self.file_size_mb,
            open_files: self.open_files,
            workspace_mb: self.workspace_mb,
            workspace_files: self.workspace_files,
            output_bytes: self.output_bytes,
            output_limit_mb: self.output_limit_mb,
        }
    }
}

/// The file as written: the tables and keys of config.toml.
#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: ServerSettings,
    #[serde(default)]
    defaults: LimitSettings,
    #[serde(default)]
    project: RawProject,
    /// Other projects a call may name in its `project` argument (never a
    /// path: only these names), each mounted at the project's mount point
    /// with `[project]`'s mode and protected paths.
    #[serde(default)]
    projects: BTreeMap<ProjectName, RawNamedProject>,
    environments: Option<BTreeMap<EnvName, EnvironmentSettings>>,
    #[serde(default)]
    commands: BTreeMap<commands::CommandName, commands::CommandDecl>,
    /// Serving over Streamable HTTP (`serve --http`).
    #[serde(default)]
    http: http::HttpSettings,
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawProject {
    path: Option<PathBuf>,
    mount_point: Option<MountPoint>,
    mode: Option<ProjectMode>,
    #[serde(default)]
    use_flake: bool,
    #[serde(default)]
    inherit_env: RawInheritEnv,
    /// Paths (relative to the project; a trailing `/` for a directory) that
    /// a `readwrite` project keeps read-only and whose change in an
    /// `overlay` project is flagged, besides the built-in list of agent
    /// instruction and configuration files.
    #[serde(default)]
    protected: Vec<ProjectPath>,
    /// What a command of the project's `.nix-sandbox-mcp/commands.toml`
    /// may take: network, `danger = "safe"`, a longer time limit or more
    /// output than its environment's. Without a grant the file cannot
    /// widen what the configuration allows.
    #[serde(default)]
    grants: BTreeMap<commands::CommandName, commands::CommandGrant>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawNamedProject {
    /// The project's directory: an absolute path (a relative one would
    /// depend on where the server starts).
    path: AbsolutePath,
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawInheritEnv {
    #[serde(default)]
    vars: Vec<EnvVarName>,
}

/// A configuration problem, phrased for the person who wrote the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}{}{}: {message}", file.display(), at.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default(), key.as_ref().map(|k| format!(": key `{k}`")).unwrap_or_default())]
    Invalid {
        file: PathBuf,
        key: Option<String>,
        /// Line and column (both from 1) of the problem.
        at: Option<(usize, usize)>,
        message: String,
    },
    #[error("environment variable {name}={value:?}: {message}")]
    Env {
        name: &'static str,
        value: String,
        message: String,
    },
}

/// Where the configuration comes from, in order of precedence.
pub fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("nix-sandbox-mcp").join("config.toml"))
}

/// Loads `explicit` if given, else the XDG config file when it exists, else
/// defaults; then applies the environment-variable overrides.
pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
    let file = match explicit {
        Some(p) => Some(p.to_path_buf()),
        None => default_config_path().filter(|p| p.is_file()),
    };
    let mut config = match &file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            parse(&text, path)?
        }
        None => Config::default(),
    };
    apply_env_overrides(&mut config, |name| std::env::var(name).ok())?;
    config.knobs = Knobs::from_env()?;
    Ok(config)
}

/// Parses and validates one TOML document; `file` is only used in messages.
/// Of several problems, the one that comes first in the file is reported.
pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
    let invalid = |key: Option<String>, span: Option<std::ops::Range<usize>>, message: String| {
        ConfigError::Invalid {
            file: file.to_path_buf(),
            key,
            at: span.map(|s| line_and_column(text, s.start)),
            message,
        }
    };
    let document = toml::de::DeTable::parse(text)
        .map_err(|e| invalid(None, e.span(), e.message().trim().to_string()))?;
    let raw = deserialize(document.clone()).map_err(|whole| {
        // Serde stops at the first problem in the order it visits keys,
        // which is not the file's order (tables are sorted by key); the
        // first failing key in the file is the one to fix first.
        // A key checked alone lacks its table's other keys: a missing
        // required one is the isolation's doing, not the key's.
        let first = leaves(document.get_ref())
            .into_iter()
            .filter_map(|leaf| deserialize(leaf.alone(document.span())).err())
            .find(|(_, e)| !e.message().starts_with("missing field"));
        let (key, error) = first.unwrap_or(whole);
        let mut message = error.message().trim().to_string();
        if let Some(suggestion) = did_you_mean(&message) {
            message += &format!("; did you mean `{suggestion}`?");
        }
        invalid((key != ".").then_some(key), error.span(), message)
    })?;
    let environments = match raw.environments {
        Some(map) => {
            let mut out = BTreeMap::new();
            for (name, env) in map {
                let key = format!("environments.{}", name.0);
                let sources = [
                    env.preset.is_some(),
                    env.interpreter.is_some(),
                    env.flake.is_some(),
                ];
                let at = find_table_line(text, &name.0).map(|line| (line, 1));
                let err = |message: &str| ConfigError::Invalid {
                    file: file.to_path_buf(),
                    key: Some(key.clone()),
                    at,
                    message: message.to_string(),
                };
                match sources.iter().filter(|s| **s).count() {
                    0 => {
                        return Err(err(
                            "set one of `preset`, `interpreter` or `flake` to say what the environment runs",
                        ));
                    }
                    1 => {}
                    _ if env.flake.is_some()
                        && env.interpreter.is_some()
                        && env.preset.is_none() => {}
                    _ => {
                        return Err(err(
                            "`preset`, `interpreter` and `flake` are alternatives; set only one (`interpreter` may accompany `flake`)",
                        ));
                    }
                }
                out.insert(name.0, env);
            }
            Some(out)
        }
        None => None,
    };
    Ok(Config {
        file: Some(file.to_path_buf()),
        server: raw.server,
        defaults: raw.defaults,
        project: ProjectSettings {
            path_is_explicit: raw.project.path.is_some(),
            // A relative path is relative to the directory the server starts in
            // (as "." for the current directory), not to the config file.
            path: raw.project.path,
            mount_point: raw.project.mount_point.unwrap_or_default(),
            mode: raw.project.mode.unwrap_or_default(),
            use_flake: raw.project.use_flake,
            inherit_env: raw.project.inherit_env.vars,
            protected: raw.project.protected,
            grants: raw
                .project
                .grants
                .into_iter()
                .map(|(k, v)| (k.0, v))
                .collect(),
        },
        projects: raw
            .projects
            .into_iter()
            .map(|(k, v)| (k.0, v.path.0))
            .collect(),
        environments,
        commands: raw.commands.into_iter().map(|(k, v)| (k.0, v)).collect(),
        http: {
            raw.http
                .check()
                .map_err(|(key, message)| ConfigError::Invalid {
                    file: file.to_path_buf(),
                    at: text
                        .lines()
                        .position(|l| l.trim_start().starts_with("[http"))
                        .map(|i| (i + 1, 1)),
                    key: Some(key),
                    message,
                })?;
            raw.http
        },
        knobs: Knobs::default(),
    })
}

/// `PROJECT_DIR` and `PROJECT_MOUNT` override the file (names kept compatible
/// with the reference implementation).
pub fn apply_env_overrides(
    config: &mut Config,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if let Some(dir) = get("PROJECT_DIR").filter(|v| !v.is_empty()) {
        config.project.path = Some(PathBuf::from(dir));
        config.project.path_is_explicit = true;
    }
    if let Some(mount) = get("PROJECT_MOUNT").filter(|v| !v.is_empty()) {
        config.project.mount_point =
            MountPoint::new(&mount).map_err(|message| ConfigError::Env {
                name: "PROJECT_MOUNT",
                value: mount.clone(),
                message,
            })?;
    }
    Ok(())
}

/// The file's tables and keys as read, with where each is in the text.
type Document<'a> = toml::de::DeTable<'a>;
type Spanned<T> = toml::Spanned<T>;

/// Reads the configuration's tables; on failure, the key's path and the error.
fn deserialize(document: Spanned<Document>) -> Result<RawConfig, (String, toml::de::Error)> {
    use serde::de::IntoDeserializer;
    serde_path_to_error::deserialize(document.into_deserializer()).map_err(|e| {
        let key = e.path().to_string();
        (key, e.into_inner())
    })
}

/// One value of the document and the keys that lead to it.
struct Leaf<'d, 'a> {
    keys: Vec<&'d Spanned<toml::de::DeString<'a>>>,
    value: &'d Spanned<toml::de::DeValue<'a>>,
}

impl<'a> Leaf<'_, 'a> {
    /// A document holding only this value, where it was.
    fn alone(&self, whole: std::ops::Range<usize>) -> Spanned<Document<'a>> {
        let mut value = self.value.clone();
        for key in self.keys[1..].iter().rev() {
            let mut table = Document::new();
            table.insert((*key).clone(), value);
            value = Spanned::new(key.span(), toml::de::DeValue::Table(table));
        }
        let mut root = Document::new();
        root.insert(self.keys[0].clone(), value);
        Spanned::new(whole, root)
    }
}

/// Every value that is not a table with keys of its own (an empty table is
/// one), in the order of the file.
fn leaves<'d, 'a>(document: &'d Document<'a>) -> Vec<Leaf<'d, 'a>> {
    fn walk<'d, 'a>(
        table: &'d Document<'a>,
        keys: &[&'d Spanned<toml::de::DeString<'a>>],
        out: &mut Vec<Leaf<'d, 'a>>,
    ) {
        for (key, value) in table.iter() {
            let mut path = keys.to_vec();
            path.push(key);
            match value.get_ref() {
                toml::de::DeValue::Table(inner) if !inner.is_empty() => walk(inner, &path, out),
                _ => out.push(Leaf { keys: path, value }),
            }
        }
    }
    let mut out = Vec::new();
    walk(document, &[], &mut out);
    out.sort_by_key(|leaf| leaf.keys.last().map(|k| k.span().start));
    out
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" (or "unknown
/// variant"), the expected name nearest to `x`, when it is near enough to
/// be a slip: within a third of its length in edits (at least two), or
/// the only name that starts with `x`.
fn did_you_mean(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))?;
    let (wrong, expected) = rest.split_once('`')?;
    let valid: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let (distance, nearest) = valid.iter().map(|v| (edit_distance(wrong, v), *v)).min()?;
    let prefix_of: Vec<&&str> = valid.iter().filter(|v| v.starts_with(wrong)).collect();
    if distance <= (wrong.chars().count() / 3).max(2) {
        Some(nearest.to_string())
    } else if wrong.len() >= 3 && prefix_of.len() == 1 {
        Some(prefix_of[0].to_string())
    } else {
        None
    }
}

/// Levenshtein distance, counting a swap of neighbours as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// Line and column (from 1, the column in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    // toml's spans start on character boundaries.
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

/// The line of `[environments.NAME]`, for errors found after deserializing.
fn find_table_line(text: &str, name: &str) -> Option<usize> {
    let wanted = [
        format!("[environments.{name}]"),
        format!("[environments.\"{name}\"]"),
    ];
    text.lines()
        .position(|l| wanted.iter().any(|w| l.trim() == w))
        .map(|i| i + 1)
}
