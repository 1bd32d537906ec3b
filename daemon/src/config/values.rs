//! Value types of the configuration with rules of their own: each checks its
//! value when the file is read (the error says what was expected) and
//! describes the same rule in the JSON schema the Nix side checks against.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, de};

/// A value type that checks itself when read and describes the same rule,
/// with `$schema`, in the JSON schema.
macro_rules! validated {
    ($name:ident($inner:ty), $expecting:expr, $schema:tt, |$v:ident| $check:expr) => {
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

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                let mut schema = json_schema!($schema);
                // The field's own documentation replaces `description`;
                // `x-expected` keeps the rule's words for error messages.
                schema.insert("description".into(), $expecting.into());
                schema.insert("x-expected".into(), $expecting.into());
                schema
            }
        }
    };
}

/// A duration in milliseconds, 1 ms to 24 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis(pub u64);
validated!(Millis(u64), "milliseconds between 1 and 86400000", {"type": "integer", "minimum": 1, "maximum": 86_400_000}, |v| {
    if (1..=86_400_000).contains(&v) {
        Ok(Millis(v))
    } else {
        Err(format!("{v} is out of range"))
    }
});

/// CPU cores a sandbox may use at once (a quota, not a pinning): 0.01 to
/// 1024, fractions allowed. Kept in thousandths of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpus(pub u32);

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.01..=1024.0).contains(&v) {
            Ok(Cpus((v * 1000.0).round() as u32))
        } else {
            Err(de::Error::custom(format!(
                "{v} is out of range (expected {CPUS_RULE})"
            )))
        }
    }
}

const CPUS_RULE: &str = "a number of CPU cores between 0.01 and 1024, such as 1 or 0.5";

impl JsonSchema for Cpus {
    fn schema_name() -> Cow<'static, str> {
        "Cpus".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "number",
            "minimum": 0.01,
            "maximum": 1024,
            "description": CPUS_RULE,
            "x-expected": CPUS_RULE
        })
    }
}

/// A count or size that must be at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Positive(pub u64);
validated!(Positive(u64), "an integer of at least 1", {"type": "integer", "minimum": 1}, |v| {
    if v >= 1 {
        Ok(Positive(v))
    } else {
        Err("0 is not allowed".to_string())
    }
});

/// Open-file limit: programs need a few descriptors just to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles(pub u64);
validated!(OpenFiles(u64), "an integer between 16 and 1048576", {"type": "integer", "minimum": 16, "maximum": 1_048_576}, |v| {
    if (16..=1_048_576).contains(&v) {
        Ok(OpenFiles(v))
    } else {
        Err(format!("{v} is out of range"))
    }
});

/// Bytes of each output stream kept in a result (split between head and tail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBytes(pub u64);
validated!(OutputBytes(u64), "bytes between 256 and 16777216", {"type": "integer", "minimum": 256, "maximum": 16_777_216}, |v| {
    if (256..=16 * 1024 * 1024).contains(&v) {
        Ok(OutputBytes(v))
    } else {
        Err(format!("{v} is out of range"))
    }
});

/// An environment name as the agent will type it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EnvName(pub String);
/// What an environment name may be, in words.
pub const ENV_NAME_RULE: &str =
    "letters, digits, '-', '_' or '.', starting with a letter or digit, at most 64 characters";

validated!(
    EnvName(String),
    ENV_NAME_RULE,
    {"type": "string", "pattern": ENV_NAME_PATTERN},
    |v| {
        if is_valid_env_name(&v) {
            Ok(EnvName(v))
        } else {
            Err(format!("{v:?} is not a valid environment name"))
        }
    }
);

/// [`is_valid_env_name`] as a pattern, for the schema.
pub const ENV_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

pub fn is_valid_env_name(v: &str) -> bool {
    let mut chars = v.chars();
    v.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A configured project's name (`[projects.NAME]`), as the agent will
/// type it: the rule of environment names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProjectName(pub String);

validated!(
    ProjectName(String),
    ENV_NAME_RULE,
    {"type": "string", "pattern": ENV_NAME_PATTERN},
    |v| {
        if is_valid_env_name(&v) {
            Ok(ProjectName(v))
        } else {
            Err(format!("{v:?} is not a valid project name"))
        }
    }
);

/// An environment variable name to pass through from the daemon's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVarName(pub String);
validated!(
    EnvVarName(String),
    "a variable name such as DATABASE_URL",
    {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "not": {"enum": RESERVED_VARS}},
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

/// A path inside the project: relative, without `..`; a trailing `/` names
/// a directory and everything in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectPath(pub String);
validated!(
    ProjectPath(String),
    "a path inside the project such as .tool/config.json, or a directory such as deploy/",
    {"type": "string", "pattern": "^[^/]", "minLength": 1, "maxLength": 4096},
    |v| {
        let inner = v.trim_end_matches('/');
        if v.starts_with('/') || inner.is_empty() {
            Err(format!("{v:?} is not a path inside the project (write it relative to the project, e.g. deploy/keys)"))
        } else if inner.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            Err(format!("{v:?} must name a path inside the project plainly: no `.`, `..` or empty components"))
        } else {
            Ok(ProjectPath(v))
        }
    }
);

/// A cache directory an environment keeps between calls: in the sandbox's
/// home (`~/.cache/pip`) or in the project (`target`, relative to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePath(pub String);
validated!(
    CachePath(String),
    "a directory in the sandbox's home such as ~/.cache/pip, or in the project such as target",
    {"type": "string", "pattern": "^(~/)?[^/~]", "minLength": 1, "maxLength": 4096},
    |v| {
        let inner = v.strip_prefix("~/").unwrap_or(&v).trim_end_matches('/');
        if inner.is_empty() || inner.starts_with('/') || inner.starts_with('~') {
            Err(format!("{v:?} is not a cache directory: write ~/PATH for one in the sandbox's home (~/.cache/pip) or a path relative to the project (target)"))
        } else if inner.split('/').any(|c| c.is_empty() || c == "." || c == "..") || v.contains('\0') {
            Err(format!("{v:?} must name a directory plainly: no `.`, `..` or empty components"))
        } else {
            Ok(CachePath(v))
        }
    }
);

impl CachePath {
    /// Where it is in the sandbox, given the home and the project's mount point.
    pub fn in_sandbox(&self, home: &str, project: &str) -> String {
        let path = self.0.trim_end_matches('/');
        match path.strip_prefix("~/") {
            Some(rest) => format!("{home}/{rest}"),
            None => format!("{project}/{path}"),
        }
    }
}

/// A code file name: one path component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileName(pub String);
validated!(FileName(String), "a plain file name such as main.py", {"type": "string", "pattern": "^[^/]{1,128}$", "not": {"enum": [".", ".."]}}, |v| {
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
validated!(AbsolutePath(PathBuf), "an absolute path", {"type": "string", "pattern": "^/"}, |v| {
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
    "an absolute path such as /project, not / or /workspace, outside the directories the sandbox provides",
    {
        "type": "string",
        "pattern": "^/[^/]",
        "not": {"anyOf": [
            {"pattern": reserved_mounts_pattern()},
            {"pattern": "^/workspace/*$"},
            {"pattern": "(^|/)[.][.]?(/|$)"}
        ]}
    },
    |v| MountPoint::new(&v)
);

/// [`RESERVED_MOUNTS`] as a pattern, for the schema.
fn reserved_mounts_pattern() -> String {
    let tops: Vec<&str> = RESERVED_MOUNTS.iter().map(|m| &m[1..]).collect();
    format!("^/({})(/.*)?$", tops.join("|"))
}

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

const INTERPRETER_RULE: &str =
    "a command such as \"ruby {file}\" or a list such as [\"ruby\", \"{file}\"]";

impl JsonSchema for Interpreter {
    fn schema_name() -> Cow<'static, str> {
        "Interpreter".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": INTERPRETER_RULE,
            "x-expected": INTERPRETER_RULE,
            "anyOf": [
                {"type": "string", "pattern": "[^ \t\n]"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1}
            ]
        })
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

/// The bundled presets, by canonical name.
pub const PRESET_NAMES: &[&str] = &["bash", "python", "node"];

/// Preset names an operator may write, and the bundled preset each means.
pub const PRESET_ALIASES: &[(&str, &str)] = &[
    ("bash", "bash"),
    ("shell", "bash"),
    ("python", "python"),
    ("python3", "python"),
    ("node", "node"),
    ("nodejs", "node"),
];

/// The schema of `preset`: one of [`PRESET_ALIASES`].
pub(super) fn preset_schema(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = PRESET_ALIASES.iter().map(|(name, _)| *name).collect();
    json_schema!({
        "type": "string",
        "enum": names,
        "description": "a bundled preset"
    })
}
