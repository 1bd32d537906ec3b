//! The `[commands.NAME]` tables as the configuration file and a project's
//! commands file hold them: their types, their schema and the command-name
//! rule. What a declaration means (checking it, turning it into a tool)
//! is the commands module's.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, de};

use super::{Millis, OutputBytes};
use crate::network::NetworkSetting;

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
    pub network: NetworkSetting,
    /// The parameters the agent fills in, by name.
    #[serde(default)]
    pub params: BTreeMap<String, ParamDecl>,
}

/// One `[project.grants.NAME]` table: what the command NAME of a project's
/// own commands file may take beyond what the project itself may grant
/// (none of it by default: the file is the repository's, not the operator's).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandGrant {
    /// The most network it may use: `true`, or `{ allow = [...] }`;
    /// without it, no more than its environment has.
    #[serde(default)]
    pub network: Option<NetworkSetting>,
    /// The least danger it may declare: `safe` lets the file declare it
    /// read-only (clients may then run it without asking).
    pub danger: Option<Danger>,
    /// The longest time limit it may declare; its environment's without it.
    pub timeout_ms: Option<Millis>,
    /// The most output it may keep; its environment's without it.
    pub output_bytes: Option<OutputBytes>,
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, JsonSchema)]
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

/// A command's name as declared: the name of its tool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CommandName(pub String);

pub const NAME_RULE: &str = "1 to 60 letters, digits, '_' or '-'";
/// [`NAME_RULE`] as a regular expression, for the schema.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9_-]{1,60}$";

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
        json_schema!({"type": "string", "pattern": NAME_PATTERN, "description": NAME_RULE, "x-expected": NAME_RULE})
    }
}
