//! Configuration: the TOML file, the environment variables that override it, and
//! built-in defaults. Owns parsing and validation (every error names the file, the
//! key and the line); knows nothing about how environments are resolved or run.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, de};

/// Everything the operator configured, validated.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The file this came from, if any.
    pub file: Option<PathBuf>,
    pub server: ServerSettings,
    pub defaults: LimitSettings,
    pub project: ProjectSettings,
    /// `None` when the file has no `[environments]` table: the built-in presets are served.
    pub environments: Option<BTreeMap<String, EnvironmentSettings>>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Runs executing at once; further calls wait in the queue.
    pub max_concurrent_runs: Option<Positive>,
    /// Calls allowed to wait for a slot; beyond this a call fails at once with `busy`.
    pub max_queued_runs: Option<u32>,
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
    /// Background jobs kept at once, running or finished.
    pub max_jobs: Option<Positive>,
    /// Time limit of a background run.
    pub job_timeout_seconds: Option<Positive>,
    /// How long a finished job stays readable.
    pub job_retention_seconds: Option<Positive>,
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
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    pub timeout_ms: Option<Millis>,
    pub memory_mb: Option<Positive>,
    pub pids: Option<Positive>,
    pub cpu_seconds: Option<Positive>,
    pub file_size_mb: Option<Positive>,
    pub open_files: Option<OpenFiles>,
    pub workspace_mb: Option<Positive>,
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
            file_size_mb: over.file_size_mb.or(self.file_size_mb),
            open_files: over.open_files.or(self.open_files),
            workspace_mb: over.workspace_mb.or(self.workspace_mb),
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
}

impl ProjectSettings {
    /// The names in `[project.inherit_env] vars`.
    pub fn inherit_names(&self) -> Vec<String> {
        self.inherit_env.iter().map(|v| v.0.clone()).collect()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProjectMode {
    #[default]
    Readonly,
    Readwrite,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSettings {
    /// A bundled preset: `bash` (alias `shell`), `python` or `node`.
    pub preset: Option<String>,
    /// A host interpreter command; `{file}` stands for the code file (appended when absent).
    pub interpreter: Option<Interpreter>,
    /// A flake output that builds a sandbox artifact or a package set (built by Nix).
    pub flake: Option<String>,
    pub description: Option<String>,
    /// Name of the code file inside `/workspace` (the extension matters to some interpreters).
    pub file_name: Option<FileName>,
    #[serde(default)]
    pub network: bool,
    /// Syscalls this environment may use although the default filter blocks them.
    #[serde(default)]
    pub seccomp_allow: Vec<String>,
    pub timeout_ms: Option<Millis>,
    pub memory_mb: Option<Positive>,
    pub pids: Option<Positive>,
    pub cpu_seconds: Option<Positive>,
    pub file_size_mb: Option<Positive>,
    pub open_files: Option<OpenFiles>,
    pub workspace_mb: Option<Positive>,
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
            file_size_mb: self.file_size_mb,
            open_files: self.open_files,
            workspace_mb: self.workspace_mb,
            output_bytes: self.output_bytes,
            output_limit_mb: self.output_limit_mb,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: ServerSettings,
    #[serde(default)]
    defaults: LimitSettings,
    #[serde(default)]
    project: RawProject,
    environments: Option<BTreeMap<EnvName, EnvironmentSettings>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProject {
    path: Option<PathBuf>,
    mount_point: Option<MountPoint>,
    mode: Option<ProjectMode>,
    #[serde(default)]
    use_flake: bool,
    #[serde(default)]
    inherit_env: RawInheritEnv,
}

#[derive(Deserialize, Default)]
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
    #[error("{}{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default(), key.as_ref().map(|k| format!(": key `{k}`")).unwrap_or_default())]
    Invalid {
        file: PathBuf,
        key: Option<String>,
        line: Option<usize>,
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
    Ok(config)
}

/// Parses and validates one TOML document; `file` is only used in messages.
pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
    let invalid = |key: Option<String>, span: Option<std::ops::Range<usize>>, message: String| {
        ConfigError::Invalid {
            file: file.to_path_buf(),
            key,
            line: span.map(|s| line_of(text, s.start)),
            message,
        }
    };
    let deserializer = toml::de::Deserializer::parse(text)
        .map_err(|e| invalid(None, e.span(), e.message().trim().to_string()))?;
    let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        invalid(
            (key != ".").then_some(key),
            inner.span(),
            inner.message().trim().to_string(),
        )
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
                let line = find_table_line(text, &name.0);
                let err = |message: &str| ConfigError::Invalid {
                    file: file.to_path_buf(),
                    key: Some(key.clone()),
                    line,
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
        },
        environments,
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

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
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

// ---- validated value types -------------------------------------------------

macro_rules! validated {
    ($name:ident($inner:ty), $expecting:literal, |$v:ident| $check:expr) => {
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let $v = <$inner>::deserialize(d)?;
                match $check {
                    Ok(value) => Ok(value),
                    Err(msg) => Err(de::Error::custom(format!(
                        "{msg} (expected {})",
                        $expecting
                    ))),
                }
            }
        }
    };
}

/// A duration in milliseconds, 1 ms to 24 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis(pub u64);
validated!(Millis(u64), "milliseconds between 1 and 86400000", |v| {
    if (1..=86_400_000).contains(&v) {
        Ok(Millis(v))
    } else {
        Err(format!("{v} is out of range"))
    }
});

/// A count or size that must be at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Positive(pub u64);
validated!(Positive(u64), "an integer of at least 1", |v| {
    if v >= 1 {
        Ok(Positive(v))
    } else {
        Err("0 is not allowed".to_string())
    }
});

/// Open-file limit: programs need a few descriptors just to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles(pub u64);
validated!(OpenFiles(u64), "an integer between 16 and 1048576", |v| {
    if (16..=1_048_576).contains(&v) {
        Ok(OpenFiles(v))
    } else {
        Err(format!("{v} is out of range"))
    }
});

/// Bytes of each output stream kept in a result (split between head and tail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBytes(pub u64);
validated!(OutputBytes(u64), "bytes between 256 and 16777216", |v| {
    if (256..=16 * 1024 * 1024).contains(&v) {
        Ok(OutputBytes(v))
    } else {
        Err(format!("{v} is out of range"))
    }
});

/// An environment name as the agent will type it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EnvName(pub String);
validated!(
    EnvName(String),
    "letters, digits, '-', '_' or '.', starting with a letter or digit, at most 64 characters",
    |v| {
        if is_valid_env_name(&v) {
            Ok(EnvName(v))
        } else {
            Err(format!("{v:?} is not a valid environment name"))
        }
    }
);

pub fn is_valid_env_name(v: &str) -> bool {
    let mut chars = v.chars();
    v.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// An environment variable name to pass through from the daemon's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVarName(pub String);
validated!(
    EnvVarName(String),
    "a variable name such as DATABASE_URL",
    |v| {
        let mut chars = v.chars();
        let ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            Err(format!("{v:?} is not a valid variable name"))
        } else if RESERVED_VARS.contains(&v.as_str()) {
            Err(format!(
                "{v} is set by the sandbox itself and cannot be inherited"
            ))
        } else {
            Ok(EnvVarName(v))
        }
    }
);

/// The values, read now from the daemon's environment, of the variables in
/// `names` that are set.
pub fn read_inherited(names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
        .collect()
}

/// Variables the jail sets; inheriting them would break it.
pub const RESERVED_VARS: &[&str] = &["PATH", "HOME", "TMPDIR", "PWD", "USER", "LOGNAME"];

/// A code file name: one path component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileName(pub String);
validated!(FileName(String), "a plain file name such as main.py", |v| {
    if !v.is_empty()
        && v.len() <= 128
        && !v.contains('/')
        && v != "."
        && v != ".."
        && !v.contains('\0')
    {
        Ok(FileName(v))
    } else {
        Err(format!("{v:?} is not a plain file name"))
    }
});

/// An absolute host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbsolutePath(pub PathBuf);
validated!(AbsolutePath(PathBuf), "an absolute path", |v| {
    if v.is_absolute() {
        Ok(AbsolutePath(v))
    } else {
        Err(format!("{} is relative", v.display()))
    }
});

/// Where the project appears inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint(pub String);

impl Default for MountPoint {
    fn default() -> Self {
        MountPoint("/project".to_string())
    }
}

/// Top-level directories the jail itself provides; the project may not hide them.
const RESERVED_MOUNTS: &[&str] = &[
    "/bin", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/nix", "/proc", "/run",
    "/sbin", "/sys", "/tmp", "/usr",
];

impl MountPoint {
    pub fn new(v: &str) -> Result<MountPoint, String> {
        if !v.starts_with('/') {
            return Err(format!("{v:?} must be an absolute path"));
        }
        let parts: Vec<&str> = v.split('/').filter(|p| !p.is_empty()).collect();
        if parts.is_empty() {
            return Err("the project cannot be mounted on /".to_string());
        }
        if parts.iter().any(|p| *p == "." || *p == "..") {
            return Err(format!("{v:?} must not contain . or .."));
        }
        let normal = format!("/{}", parts.join("/"));
        if normal == "/workspace" {
            return Err("/workspace is the sandbox's writable directory; mount the project elsewhere (a path below /workspace is fine)".to_string());
        }
        let top = format!("/{}", parts[0]);
        if RESERVED_MOUNTS.contains(&top.as_str()) {
            return Err(format!(
                "{top} is provided by the sandbox; choose another mount point such as /project"
            ));
        }
        Ok(MountPoint(normal))
    }
}

validated!(
    MountPoint(String),
    "an absolute path such as /project",
    |v| MountPoint::new(&v)
);

/// A host interpreter command line: a string split on whitespace, or an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter(pub Vec<String>);

impl<'de> Deserialize<'de> for Interpreter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Interpreter;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a command such as \"ruby {file}\" or an array such as [\"ruby\", \"{file}\"]",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Interpreter, E> {
                Interpreter::new(s.split_whitespace().map(str::to_string).collect())
                    .map_err(E::custom)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Interpreter, A::Error> {
                let mut argv = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    argv.push(s);
                }
                Interpreter::new(argv).map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Interpreter {
    pub fn new(argv: Vec<String>) -> Result<Interpreter, String> {
        match argv.first() {
            None => Err("the interpreter command is empty".to_string()),
            Some(p) if p.is_empty() || p.contains('{') => {
                Err(format!("{p:?} is not a program name"))
            }
            Some(_) => Ok(Interpreter(argv)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Config, ConfigError> {
        parse(text, Path::new("/etc/test.toml"))
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse_str("").unwrap();
        assert!(c.environments.is_none());
        assert_eq!(c.project.mount_point.0, "/project");
        assert_eq!(c.project.mode, ProjectMode::Readonly);
    }

    #[test]
    fn full_example_parses() {
        let c = parse_str(
            r#"
[server]
max_concurrent_runs = 4
[defaults]
timeout_ms = 5000
output_bytes = 4096
[project]
path = "src"
mount_point = "/code/"
mode = "readwrite"
[project.inherit_env]
vars = ["DATABASE_URL"]
[environments.py]
preset = "python"
description = "Python"
timeout_ms = 100
[environments.rb]
interpreter = "ruby {file}"
file_name = "main.rb"
"#,
        )
        .unwrap();
        assert_eq!(c.defaults.timeout_ms, Some(Millis(5000)));
        assert_eq!(c.project.path, Some(PathBuf::from("src")));
        assert_eq!(c.project.mount_point.0, "/code");
        assert_eq!(c.project.mode, ProjectMode::Readwrite);
        assert_eq!(c.project.inherit_env[0].0, "DATABASE_URL");
        let envs = c.environments.unwrap();
        assert_eq!(envs["py"].limits().timeout_ms, Some(Millis(100)));
        assert_eq!(
            envs["rb"].interpreter.as_ref().unwrap().0,
            vec!["ruby", "{file}"]
        );
    }

    fn err_text(text: &str) -> String {
        parse_str(text).unwrap_err().to_string()
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = err_text("[defaults]\ntimeout_ms = 5\n\n[project]\nmount = \"/x\"\n");
        assert!(e.contains("/etc/test.toml:5"), "{e}");
        assert!(e.contains("unknown field `mount`"), "{e}");
        assert!(e.contains("project"), "{e}");
    }

    #[test]
    fn bad_value_names_key_and_line() {
        let e = err_text("[environments.py]\npreset = \"python\"\ntimeout_ms = 0\n");
        assert!(e.contains(":3"), "{e}");
        assert!(e.contains("environments.py.timeout_ms"), "{e}");
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn wrong_type_is_reported() {
        let e = err_text("[defaults]\ntimeout_ms = \"soon\"\n");
        assert!(e.contains("defaults.timeout_ms"), "{e}");
        assert!(e.contains(":2"), "{e}");
    }

    #[test]
    fn syntax_error_has_line() {
        let e = err_text("[defaults]\ntimeout_ms = = 3\n");
        assert!(e.contains(":2"), "{e}");
    }

    #[test]
    fn environment_needs_exactly_one_source() {
        let e = err_text("[environments.x]\ndescription = \"nothing\"\n");
        assert!(e.contains("environments.x") && e.contains(":1"), "{e}");
        let e = err_text("[environments.x]\npreset = \"bash\"\ninterpreter = \"sh\"\n");
        assert!(e.contains("alternatives"), "{e}");
        parse_str("[environments.x]\nflake = \"github:o/r#a\"\ninterpreter = \"sh\"\n").unwrap();
    }

    #[test]
    fn mount_point_rules() {
        assert!(MountPoint::new("relative").is_err());
        assert!(MountPoint::new("/").is_err());
        assert!(MountPoint::new("/usr/src").is_err());
        assert!(MountPoint::new("/workspace").is_err());
        assert!(MountPoint::new("/a/../b").is_err());
        assert_eq!(MountPoint::new("/workspace/p/").unwrap().0, "/workspace/p");
    }

    #[test]
    fn bad_env_name_and_var_rejected() {
        assert!(
            err_text("[environments.\"a b\"]\npreset = \"bash\"\n")
                .contains("not a valid environment name")
        );
        assert!(
            err_text("[project.inherit_env]\nvars = [\"PATH\"]\n").contains("set by the sandbox")
        );
        assert!(
            err_text("[project.inherit_env]\nvars = [\"1X\"]\n").contains("not a valid variable")
        );
    }

    #[test]
    fn env_overrides_apply() {
        let mut c = Config::default();
        apply_env_overrides(&mut c, |k| match k {
            "PROJECT_DIR" => Some("/srv/p".into()),
            "PROJECT_MOUNT" => Some("/src".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.project.path, Some(PathBuf::from("/srv/p")));
        assert!(c.project.path_is_explicit);
        assert_eq!(c.project.mount_point.0, "/src");
        let e = apply_env_overrides(&mut c, |k| (k == "PROJECT_MOUNT").then(|| "/proc".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("PROJECT_MOUNT"), "{e}");
    }

    #[test]
    fn example_config_parses_and_documents_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.example.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        parse(&text, &path).unwrap();
        let keys = [
            "max_concurrent_runs",
            "max_queued_runs",
            "nix_build_timeout_seconds",
            "max_jobs",
            "job_timeout_seconds",
            "job_retention_seconds",
            "job_output_bytes",
            "max_sessions",
            "session_idle_seconds",
            "session_max_lifetime_seconds",
            "audit_log",
            "audit_log_code",
            "audit_log_output",
            "timeout_ms",
            "memory_mb",
            "pids",
            "cpu_seconds",
            "file_size_mb",
            "open_files",
            "workspace_mb",
            "output_bytes",
            "output_limit_mb",
            "path",
            "mount_point",
            "mode",
            "use_flake",
            "vars",
            "preset",
            "interpreter",
            "flake",
            "description",
            "file_name",
            "network",
            "seccomp_allow",
        ];
        for k in keys {
            assert!(
                text.contains(&format!("{k} ="))
                    || text.contains(&format!("{k}  ="))
                    || text.contains(&format!("{k}    =")),
                "{k} undocumented"
            );
        }
    }

    #[test]
    fn overlay_prefers_upper_layer() {
        let low = LimitSettings {
            timeout_ms: Some(Millis(1)),
            pids: Some(Positive(5)),
            ..Default::default()
        };
        let high = LimitSettings {
            timeout_ms: Some(Millis(2)),
            ..Default::default()
        };
        let m = low.overlay(high);
        assert_eq!(m.timeout_ms, Some(Millis(2)));
        assert_eq!(m.pids, Some(Positive(5)));
    }
}
