//! The declaration format of `[commands.NAME]` (in the configuration file and
//! in the project's `.nix-sandbox-mcp/commands.toml`), and its validation into
//! a [`Command`]: every problem names the file, the line where it can be
//! found, the key, and the fix. Problems that do not make a command unsafe or
//! unusable (a parameter never used, a shell as the program) are warnings.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, de};

use super::Command;
use super::invocation::Template;
use super::params::{self, Param};
use crate::config::{Millis, OutputBytes, RESERVED_VARS};
use crate::jail::ProjectMount;

/// The project's own declaration file, relative to the project root.
pub const PROJECT_FILE: &str = ".nix-sandbox-mcp/commands.toml";
/// Longest accepted project file.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Longest command name: the tool name, with a `cmd_` prefix when it
/// clashes, must fit MCP's 64 characters.
const MAX_NAME: usize = 60;

/// One `[commands.NAME]` table as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandDecl {
    /// What the command does: the tool's description the agent reads.
    pub description: String,
    /// The program and its arguments, never run through a shell. `{{name}}`
    /// in an argument is replaced by a parameter's value; argv[0] is literal.
    pub argv: Vec<String>,
    /// The environment it runs in: its toolchain, jail and limits.
    pub env: String,
    /// Variables set for the command (not PATH, LD_*, DYLD_* or the ones
    /// the sandbox sets itself).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// Working directory, relative to the project root (the root when absent).
    pub workdir: Option<String>,
    /// Time limit; the environment's when absent.
    pub timeout_ms: Option<Millis>,
    /// Bytes of each output stream kept; the environment's when absent.
    pub output_bytes: Option<OutputBytes>,
    /// How much harm a call can do: safe (read-only), moderate, high (destructive).
    #[serde(default)]
    pub danger: Danger,
    /// Ask the user before each call.
    #[serde(default)]
    pub confirm: bool,
    /// Declared but not offered.
    #[serde(default)]
    pub disabled: bool,
    /// Put `--` before the first argument that holds a parameter.
    #[serde(default)]
    pub separator: bool,
    /// Network access: false (default), true, or { allow = ["host", ...] }.
    #[serde(default)]
    pub network: Network,
    /// The parameters the agent fills in, by name.
    #[serde(default)]
    pub params: BTreeMap<String, ParamDecl>,
}

/// One `[commands.NAME.params.PARAM]` table as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamDecl {
    #[serde(rename = "type")]
    pub kind: ParamKind,
    /// Shown to the agent in the tool's input schema.
    pub description: Option<String>,
    /// The call fails when the value is missing. Optional parameters without
    /// a default leave out the arguments that mention them.
    #[serde(default)]
    pub required: bool,
    /// The value when the call gives none.
    pub default: Option<serde_json::Value>,
    /// A regular expression (Rust `regex` syntax, linear time) the whole
    /// value must match; for string and path. Without one, a value may not be
    /// empty or start with '-'.
    pub pattern: Option<String>,
    /// Smallest value, for integer and number; a negative `min` allows
    /// negative values.
    pub min: Option<f64>,
    /// Largest value, for integer and number.
    pub max: Option<f64>,
    /// The allowed values, for enum.
    pub values: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParamKind {
    String,
    Integer,
    Number,
    Boolean,
    Enum,
    /// A path in the project, resolved (symlinks too) and refused outside it.
    Path,
}

impl ParamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ParamKind::String => "string",
            ParamKind::Integer => "integer",
            ParamKind::Number => "number",
            ParamKind::Boolean => "boolean",
            ParamKind::Enum => "enum",
            ParamKind::Path => "path",
        }
    }
}

/// How much harm one call can do; decides the tool's annotations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Danger {
    /// Reads only.
    Safe,
    /// Changes things, but nothing that cannot be undone.
    #[default]
    Moderate,
    /// May destroy or publish.
    High,
}

impl Danger {
    pub fn as_str(self) -> &'static str {
        match self {
            Danger::Safe => "safe",
            Danger::Moderate => "moderate",
            Danger::High => "high",
        }
    }
}

/// A command's network access. An allowlist is accepted as written and
/// enforced by the network proxy; until a build has one, such a command is
/// refused when called rather than given the whole network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    #[default]
    Off,
    On,
    Allow(Vec<String>),
}

impl Network {
    pub fn is_on(&self) -> bool {
        !matches!(self, Network::Off)
    }
}

const NETWORK_RULE: &str = "false, true, or a table { allow = [\"host\", ...] }";

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Network;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(NETWORK_RULE)
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<Network, E> {
                Ok(if on { Network::On } else { Network::Off })
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Network, A::Error> {
                let mut allow = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "allow" {
                        return Err(de::Error::unknown_field(&key, &["allow"]));
                    }
                    allow = Some(map.next_value::<Vec<String>>()?);
                }
                let allow = allow.ok_or_else(|| de::Error::missing_field("allow"))?;
                if let Some(bad) = allow
                    .iter()
                    .find(|h| h.is_empty() || h.chars().any(|c| c.is_whitespace() || c == '\0'))
                {
                    return Err(de::Error::custom(format!(
                        "{bad:?} is not a host name (expected {NETWORK_RULE})"
                    )));
                }
                Ok(Network::Allow(allow))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Network {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "CommandNetwork".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": NETWORK_RULE,
            "x-expected": NETWORK_RULE,
            "anyOf": [
                {"type": "boolean"},
                {
                    "type": "object",
                    "properties": {"allow": {"type": "array", "items": {"type": "string", "pattern": "^[^\\s]+$"}}},
                    "required": ["allow"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// A command's name as declared: the name of its tool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CommandName(pub String);

const NAME_RULE: &str = "1 to 60 letters, digits, '_' or '-'";

pub fn is_valid_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_NAME
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl<'de> Deserialize<'de> for CommandName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = String::deserialize(d)?;
        if is_valid_name(&v) {
            Ok(CommandName(v))
        } else {
            Err(de::Error::custom(format!(
                "{v:?} is not a valid command name (expected {NAME_RULE})"
            )))
        }
    }
}

impl JsonSchema for CommandName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "CommandName".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,60}$", "description": NAME_RULE, "x-expected": NAME_RULE})
    }
}

/// The project file as written: only `[commands.NAME]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectFile {
    #[serde(default)]
    commands: BTreeMap<CommandName, CommandDecl>,
}

/// A problem in a declaration, for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// The key, such as `commands.test.params.filter.pattern`.
    pub key: String,
    pub message: String,
    pub fix: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(
            f,
            ": key `{}`: {}\n  fix: {}",
            self.key, self.message, self.fix
        )
    }
}

impl std::error::Error for Diagnostic {}

/// A declaration file's text, to find the line of a key.
#[derive(Debug, Clone)]
pub struct Source {
    pub file: PathBuf,
    pub text: String,
}

impl Source {
    /// Reads the file; the text is only used to point at lines, so a file
    /// that cannot be read again gives messages without them.
    pub fn read_for_lines(file: &Path) -> Source {
        Source {
            file: file.to_path_buf(),
            text: std::fs::read_to_string(file).unwrap_or_default(),
        }
    }

    /// A diagnostic at `path` (under `commands`), on the line of the
    /// deepest part of the path found in the file.
    pub fn diagnostic(
        &self,
        path: &[&str],
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Diagnostic {
        let full: Vec<&str> = std::iter::once("commands")
            .chain(path.iter().copied())
            .collect();
        Diagnostic {
            file: self.file.clone(),
            line: line_of_key(&self.text, &full),
            key: full.join("."),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

/// The 1-based line of the deepest key of `path` that the document has.
fn line_of_key(text: &str, path: &[&str]) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut found = None;
    for key in path {
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == *key) else {
            break;
        };
        found = Some(k.span().start);
        match v.get_ref() {
            toml::de::DeValue::Table(t) => table = t,
            _ => break,
        }
    }
    found.map(|offset| line_of(text, offset))
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// Reads the project file at `path` (a regular file, not a symlink, at most
/// 1 MiB); `Ok(None)` when there is none.
pub fn read_project_file(path: &Path) -> Result<Option<String>, Diagnostic> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let problem = |message: String, fix: &str| Diagnostic {
        file: path.to_path_buf(),
        line: None,
        key: "commands".to_string(),
        message,
        fix: fix.to_string(),
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(problem(
                format!("cannot read {}: {e}", dir.display()),
                "make it readable",
            ));
        }
        Ok(m) if !m.is_dir() => {
            return Err(problem(
                format!(
                    "{} is not a directory (a symlink is not followed)",
                    dir.display()
                ),
                "make .nix-sandbox-mcp a real directory in the project",
            ));
        }
        Ok(_) => {}
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(problem(
                "the file is a symlink, which is not followed".to_string(),
                "make it a regular file in the project",
            ));
        }
        Err(e) => return Err(problem(format!("cannot read it: {e}"), "make it readable")),
    };
    let meta = file
        .metadata()
        .map_err(|e| problem(format!("cannot read it: {e}"), "make it readable"))?;
    if !meta.is_file() {
        return Err(problem(
            "it is not a regular file".into(),
            "make it a regular file",
        ));
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| {
            problem(
                format!("cannot read it as UTF-8 text: {e}"),
                "save it as UTF-8",
            )
        })?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(problem(
            format!("it is larger than {MAX_FILE_BYTES} bytes"),
            "declare fewer commands",
        ));
    }
    Ok(Some(text))
}

/// Parses the project file's text: `[commands.NAME]` tables only.
pub fn parse_project_file(
    text: &str,
    file: &Path,
) -> Result<BTreeMap<String, CommandDecl>, Diagnostic> {
    let invalid = |key: String, span: Option<std::ops::Range<usize>>, message: String| {
        let key = if key.is_empty() || key == "." {
            "commands".to_string()
        } else {
            key
        };
        Diagnostic {
            file: file.to_path_buf(),
            line: span.map(|s| line_of(text, s.start)),
            key,
            message,
            fix: "see docs/commands.md for the keys of [commands.NAME] and their values"
                .to_string(),
        }
    };
    let deserializer = toml::de::Deserializer::parse(text)
        .map_err(|e| invalid(String::new(), e.span(), e.message().trim().to_string()))?;
    let raw: ProjectFile = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        invalid(key, inner.span(), inner.message().trim().to_string())
    })?;
    Ok(raw.commands.into_iter().map(|(k, v)| (k.0, v)).collect())
}

/// What a declaration is checked against: the environments that exist and
/// the project, when one is mounted.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub envs: &'a [String],
    pub project: Option<&'a ProjectMount>,
}

/// A validated command and the warnings about it.
#[derive(Debug)]
pub struct Checked {
    pub command: Command,
    pub warnings: Vec<Diagnostic>,
}

/// Programs that run a script given on their command line, and the options
/// that take it: a placeholder in that script is an injection.
const SCRIPT_RUNNERS: &[(&[&str], &[&str])] = &[
    (
        &[
            "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "busybox",
        ],
        &["-c"],
    ),
    (&["python", "python2", "python3", "pypy", "pypy3"], &["-c"]),
    (
        &["node", "nodejs", "bun", "deno"],
        &["-e", "--eval", "-p", "--print"],
    ),
    (&["perl"], &["-e", "-E"]),
    (&["ruby"], &["-e"]),
    (&["php"], &["-r"]),
];

/// The script options of `program` (by base name, `python3.12` as `python3`).
fn script_options(program: &str) -> Option<&'static [&'static str]> {
    let base = program.rsplit('/').next().unwrap_or(program);
    let base = base.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    let base = if base.is_empty() { program } else { base };
    SCRIPT_RUNNERS
        .iter()
        .find(|(names, _)| {
            names
                .iter()
                .any(|n| *n == base || n.trim_end_matches(|c: char| c.is_ascii_digit()) == base)
        })
        .map(|(_, opts)| *opts)
}

/// Whether `arg` passes a script to a program whose script options are `opts`
/// (`-c`, and combined short flags such as `-ec`).
fn is_script_option(arg: &str, opts: &[&str]) -> bool {
    opts.contains(&arg)
        || opts.iter().any(|o| {
            o.len() == 2
                && arg.len() > 2
                && arg.starts_with('-')
                && !arg.starts_with("--")
                && arg.ends_with(&o[1..])
        })
}

/// Variables a command may not set: the program lookup and the dynamic
/// loader must stay as the environment defines them.
fn forbidden_var(name: &str) -> bool {
    name == "PATH"
        || name.starts_with("LD_")
        || name.starts_with("DYLD_")
        || RESERVED_VARS.contains(&name)
}

fn valid_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Validates one declaration.
pub fn validate(
    name: &str,
    decl: &CommandDecl,
    source: &Source,
    ctx: Context,
) -> Result<Checked, Diagnostic> {
    let at = |sub: &[&str]| -> Vec<String> {
        std::iter::once(name.to_string())
            .chain(sub.iter().map(|s| s.to_string()))
            .collect()
    };
    let diag = |sub: &[&str], message: String, fix: &str| {
        let path = at(sub);
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        source.diagnostic(&path, message, fix)
    };
    let mut warnings = Vec::new();

    if !is_valid_name(name) {
        return Err(diag(
            &[],
            format!("{name:?} is not a valid command name"),
            &format!("use {NAME_RULE}"),
        ));
    }
    if decl.description.trim().is_empty() {
        return Err(diag(
            &["description"],
            "the description is empty".into(),
            "say in a sentence what the command does: the agent reads it to decide when to call it",
        ));
    }
    if !ctx.envs.contains(&decl.env) {
        return Err(diag(
            &["env"],
            format!("there is no environment {:?}", decl.env),
            &format!("set env to one of: {}", ctx.envs.join(", ")),
        ));
    }

    let template = Template::parse(&decl.argv, decl.separator)
        .map_err(|e| diag(&["argv"], e.message, &e.fix))?;
    if let Some(opts) = script_options(&decl.argv[0]) {
        let script_at = decl
            .argv
            .iter()
            .position(|a| is_script_option(a, opts))
            .map(|i| i + 1);
        match script_at {
            Some(i) if template.has_placeholder(i) => {
                return Err(diag(
                    &["argv"],
                    format!(
                        "argv[{i}] is a script run by {}, and a parameter substituted into a script can inject code",
                        decl.argv[0]
                    ),
                    "pass the value as its own argument and use it as a positional parameter, e.g. [\"sh\", \"-c\", \"grep -- \\\"$1\\\" notes.txt\", \"sh\", \"{{pattern}}\"]; better, run the program directly",
                ));
            }
            _ => warnings.push(diag(
                &["argv"],
                format!(
                    "argv[0] is {}, which can run a script: the guarantees of declared commands hold only as far as that script treats its arguments as data",
                    decl.argv[0]
                ),
                "run the program directly instead of through a shell or interpreter",
            )),
        }
    }

    let mut params = Vec::new();
    for (pname, pdecl) in &decl.params {
        let param = Param::from_decl(pname, pdecl)
            .map_err(|p| diag(&["params", pname, p.key], p.message, &p.fix))?;
        params.push(param);
    }
    for used in template.params() {
        if !decl.params.contains_key(used) {
            return Err(diag(
                &["argv"],
                format!("{{{{{used}}}}} names no parameter"),
                &format!(
                    "declare it as [commands.{name}.params.{used}] with a type, or fix the spelling"
                ),
            ));
        }
    }
    for p in &params {
        if !template.params().contains(p.name.as_str()) {
            warnings.push(diag(
                &["params", &p.name],
                format!("parameter {} is not used in argv", p.name),
                &format!("add {{{{{}}}}} to argv, or remove the parameter", p.name),
            ));
        }
    }
    if decl.separator && template.separator_index().is_none() {
        warnings.push(diag(
            &["separator"],
            "separator has no effect: no argument holds a parameter".into(),
            "remove it",
        ));
    }

    let mut vars = Vec::new();
    for (k, v) in &decl.vars {
        if !valid_var_name(k) {
            return Err(diag(
                &["vars", k],
                format!("{k:?} is not a variable name"),
                "use letters, digits and '_', not starting with a digit",
            ));
        }
        if forbidden_var(k) {
            return Err(diag(
                &["vars", k],
                format!(
                    "{k} cannot be set for a command: it decides which programs and libraries run, or the sandbox sets it"
                ),
                "remove it; put the programs the command needs in its environment",
            ));
        }
        if v.contains('\0') {
            return Err(diag(
                &["vars", k],
                "the value contains a NUL character".into(),
                "remove it",
            ));
        }
        vars.push((k.clone(), v.clone()));
    }

    let needs_project = decl.workdir.is_some() || params.iter().any(|p| p.kind.is_path());
    let mut usable = true;
    match (ctx.project, &decl.workdir) {
        (Some(project), Some(dir)) => {
            if let Err(m) = params::resolve_in_project(project, dir, true) {
                return Err(diag(
                    &["workdir"],
                    format!("workdir {dir:?}: {m}"),
                    "give a directory inside the project, relative to its root",
                ));
            }
        }
        (None, _) if needs_project => {
            usable = false;
            warnings.push(diag(
                &[],
                "no project is mounted, and the command needs one (workdir or a path parameter); it is not offered".into(),
                "start the server in the project, or set PROJECT_DIR or [project] path",
            ));
        }
        _ => {}
    }

    Ok(Checked {
        command: Command {
            name: name.to_string(),
            description: decl.description.trim().to_string(),
            env: decl.env.clone(),
            template,
            params,
            vars,
            workdir: decl.workdir.clone(),
            timeout: decl.timeout_ms.map(|m| Duration::from_millis(m.0)),
            output_bytes: decl.output_bytes.map(|o| o.0 as usize),
            danger: decl.danger,
            confirm: decl.confirm,
            enabled: !decl.disabled && usable,
            network: decl.network.clone(),
            file: source.file.clone(),
        },
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envs() -> Vec<String> {
        vec!["bash".into(), "python".into()]
    }

    fn check(text: &str) -> Result<Checked, Diagnostic> {
        check_in(text, None)
    }

    fn check_in(text: &str, project: Option<&ProjectMount>) -> Result<Checked, Diagnostic> {
        let file = Path::new("/p/.nix-sandbox-mcp/commands.toml");
        let decls = parse_project_file(text, file)?;
        let source = Source {
            file: file.to_path_buf(),
            text: text.to_string(),
        };
        let (name, decl) = decls.iter().next().expect("one command");
        let envs = envs();
        validate(
            name,
            decl,
            &source,
            Context {
                envs: &envs,
                project,
            },
        )
    }

    fn err(text: &str) -> String {
        check(text).unwrap_err().to_string()
    }

    const GOOD: &str = r#"
[commands.test]
description = "Run the tests"
env = "bash"
argv = ["cargo", "test", "{{filter}}"]
[commands.test.params.filter]
type = "string"
"#;

    #[test]
    fn a_good_declaration_is_accepted_without_warnings() {
        let c = check(GOOD).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.command.name, "test");
        assert_eq!(c.command.danger, Danger::Moderate);
        assert!(c.command.enabled);
        assert_eq!(c.command.network, Network::Off);
    }

    #[test]
    fn errors_name_file_line_key_and_fix() {
        let e = err(&GOOD.replace("{{filter}}", "{{filtr}}"));
        assert!(
            e.starts_with("/p/.nix-sandbox-mcp/commands.toml:5: key `commands.test.argv`"),
            "{e}"
        );
        assert!(
            e.contains("{{filtr}} names no parameter") && e.contains("fix: declare it"),
            "{e}"
        );

        let e = err(&GOOD.replace("env = \"bash\"", "env = \"ruby\""));
        assert!(
            e.contains(":4: key `commands.test.env`") && e.contains("bash, python"),
            "{e}"
        );

        let e = err(&GOOD.replace("type = \"string\"", "type = \"string\"\nmin = 3"));
        assert!(e.contains("key `commands.test.params.filter.min`"), "{e}");
        assert!(e.contains(":8:"), "{e}");
    }

    #[test]
    fn syntax_and_unknown_keys_are_reported_with_their_line() {
        let e = err(
            "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"ls\"]\nshell = true\n",
        );
        assert!(e.contains(":5") && e.contains("shell"), "{e}");
        let e = err("[commands.\"bad name\"]\n");
        assert!(e.contains("not a valid command name"), "{e}");
        let e = err(
            "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"ls\"]\ndanger = \"extreme\"\n",
        );
        assert!(e.contains(":5") && e.contains("danger"), "{e}");
        let e = err("[other]\n");
        assert!(e.contains("other"), "{e}");
    }

    #[test]
    fn argv_zero_must_be_literal_and_argv_not_empty() {
        let e = err(
            "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"{{p}}\"]\n[commands.t.params.p]\ntype = \"string\"\n",
        );
        assert!(e.contains("argv[0]") && e.contains("literal"), "{e}");
        let e = err("[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = []\n");
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn a_parameter_inside_a_shell_script_is_refused() {
        for argv in [
            r#"["sh", "-c", "echo {{p}}"]"#,
            r#"["/bin/bash", "-ec", "grep {{p}} f"]"#,
            r#"["python3.12", "-c", "print('{{p}}')"]"#,
            r#"["node", "-e", "{{p}}"]"#,
        ] {
            let e = err(&format!(
                "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = {argv}\n[commands.t.params.p]\ntype = \"string\"\n"
            ));
            assert!(e.contains("inject"), "{argv}: {e}");
        }
        // As a positional parameter it is data: allowed, with a warning.
        let c = check("[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"sh\", \"-c\", \"echo \\\"$1\\\"\", \"sh\", \"{{p}}\"]\n[commands.t.params.p]\ntype = \"string\"\n").unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].message.contains("can run a script"),
            "{}",
            c.warnings[0]
        );
    }

    #[test]
    fn unused_parameters_are_warned_about() {
        let c = check(&format!(
            "{GOOD}[commands.test.params.extra]\ntype = \"boolean\"\n"
        ))
        .unwrap();
        assert_eq!(c.warnings.len(), 1);
        let w = c.warnings[0].to_string();
        assert!(
            w.contains("commands.test.params.extra") && w.contains("not used"),
            "{w}"
        );
        assert!(w.contains(":8:"), "{w}");
    }

    #[test]
    fn loader_and_path_variables_cannot_be_set() {
        for var in [
            "PATH",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "DYLD_INSERT_LIBRARIES",
            "HOME",
        ] {
            let e = err(&format!("{GOOD}[commands.test.vars]\n{var} = \"/tmp\"\n"));
            assert!(e.contains(&format!("commands.test.vars.{var}")), "{e}");
        }
        let c = check(&format!(
            "{GOOD}[commands.test.vars]\nRUST_BACKTRACE = \"1\"\n"
        ))
        .unwrap();
        assert_eq!(c.command.vars, vec![("RUST_BACKTRACE".into(), "1".into())]);
    }

    #[test]
    fn network_accepts_false_true_and_an_allowlist() {
        let with = |n: &str| {
            check(&GOOD.replace("env = \"bash\"", &format!("env = \"bash\"\nnetwork = {n}")))
        };
        assert_eq!(with("true").unwrap().command.network, Network::On);
        assert_eq!(with("false").unwrap().command.network, Network::Off);
        assert_eq!(
            with("{ allow = [\"crates.io\"] }").unwrap().command.network,
            Network::Allow(vec!["crates.io".into()])
        );
        assert!(with("{ deny = [] }").is_err());
        assert!(with("\"yes\"").is_err());
        assert!(with("{ allow = [\"a b\"] }").is_err());
    }

    #[test]
    fn commands_needing_a_project_are_withheld_without_one() {
        let c = check(&GOOD.replace("argv", "workdir = \"src\"\nargv")).unwrap();
        assert!(!c.command.enabled);
        assert!(
            c.warnings[0].message.contains("no project"),
            "{}",
            c.warnings[0]
        );
    }

    #[test]
    fn workdir_is_checked_after_resolving_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        let project = ProjectMount {
            host_path: root.canonicalize().unwrap(),
            mount_point: "/project".into(),
            writable: false,
        };
        let with = |w: &str| {
            check_in(
                &GOOD.replace("argv", &format!("workdir = {w:?}\nargv")),
                Some(&project),
            )
        };
        assert!(with("src").unwrap().command.enabled);
        for bad in ["up", "up/proj/../..", "../", "missing", "/etc"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("commands.test.workdir"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_project_file_is_read_only_when_it_is_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let decl = dir.path().join(".nix-sandbox-mcp");
        assert_eq!(
            read_project_file(&decl.join("commands.toml")).unwrap(),
            None
        );
        std::fs::create_dir(&decl).unwrap();
        std::fs::write(dir.path().join("elsewhere.toml"), GOOD).unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("elsewhere.toml"),
            decl.join("commands.toml"),
        )
        .unwrap();
        let e = read_project_file(&decl.join("commands.toml")).unwrap_err();
        assert!(e.message.contains("symlink"), "{e}");
        std::fs::remove_file(decl.join("commands.toml")).unwrap();
        std::fs::write(decl.join("commands.toml"), GOOD).unwrap();
        assert_eq!(
            read_project_file(&decl.join("commands.toml"))
                .unwrap()
                .as_deref(),
            Some(GOOD)
        );
    }
}
