//! Typed parameters of a declared command: their validation at load, the
//! JSON Schema the agent sees, and the strict check of each value a call
//! gives (type, NUL, finiteness, range, pattern, a leading '-', paths that
//! leave the project), turning it into the text that goes into argv.

use std::path::{Component, Path, PathBuf};

use regex::{Regex, RegexBuilder};
use serde_json::{Value, json};

use super::declaration::{ParamDecl, ParamKind};
use crate::jail::ProjectMount;

/// Longest value of any parameter, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// Longest pattern, and the most memory its compiled form may take: every
/// pattern runs in linear time (the `regex` crate has no backtracking), and
/// these bound its size.
const MAX_PATTERN_BYTES: usize = 1024;
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A validated parameter.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub description: Option<String>,
    pub kind: Kind,
    pub required: bool,
    /// Checked against the parameter's own rules at load.
    pub default: Option<Value>,
}

#[derive(Debug, Clone)]
pub enum Kind {
    String { pattern: Option<Pattern> },
    Integer { min: Option<i64>, max: Option<i64> },
    Number { min: Option<f64>, max: Option<f64> },
    Boolean,
    Enum { values: Vec<String> },
    Path { pattern: Option<Pattern> },
}

impl Kind {
    /// The type as declared (`type = "..."`).
    pub fn name(&self) -> &'static str {
        match self {
            Kind::String { .. } => "string",
            Kind::Integer { .. } => "integer",
            Kind::Number { .. } => "number",
            Kind::Boolean => "boolean",
            Kind::Enum { .. } => "enum",
            Kind::Path { .. } => "path",
        }
    }

    pub fn is_path(&self) -> bool {
        matches!(self, Kind::Path { .. })
    }
}

/// An author's pattern, matched against the whole value.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub source: String,
    regex: Regex,
}

impl Pattern {
    fn compile(source: &str) -> Result<Pattern, String> {
        if source.len() > MAX_PATTERN_BYTES {
            return Err(format!(
                "the pattern is longer than {MAX_PATTERN_BYTES} bytes"
            ));
        }
        let regex = RegexBuilder::new(&format!("^(?:{source})$"))
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Pattern {
            source: source.to_string(),
            regex,
        })
    }

    fn anchored(&self) -> String {
        format!("^(?:{})$", self.source)
    }
}

/// A problem in a parameter's declaration: the sub-key, what is wrong, the fix.
#[derive(Debug)]
pub struct DeclProblem {
    pub key: &'static str,
    pub message: String,
    pub fix: String,
}

/// A value a call gave that cannot be used; `message` names the parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    pub param: String,
    pub message: String,
}

fn valid_param_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Param {
    pub fn from_decl(name: &str, d: &ParamDecl) -> Result<Param, DeclProblem> {
        let problem = |key, message: String, fix: &str| DeclProblem {
            key,
            message,
            fix: fix.to_string(),
        };
        if !valid_param_name(name) {
            return Err(problem(
                "",
                format!("{name:?} is not a valid parameter name"),
                "use letters, digits and '_', starting with a letter or '_' (it becomes {{name}} in argv)",
            ));
        }
        if name == BACKGROUND {
            return Err(problem(
                "",
                format!(
                    "{name:?} is reserved: every command's tool takes `background` (run as a job)"
                ),
                "give the parameter another name",
            ));
        }
        let only_for = |key: &'static str, set: bool, kinds: &[ParamKind]| {
            if set && !kinds.contains(&d.kind) {
                Err(problem(
                    key,
                    format!("`{key}` does not apply to a {} parameter", d.kind.as_str()),
                    &format!(
                        "remove it (it applies to {})",
                        kinds
                            .iter()
                            .map(|k| k.as_str())
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                ))
            } else {
                Ok(())
            }
        };
        only_for(
            "pattern",
            d.pattern.is_some(),
            &[ParamKind::String, ParamKind::Path],
        )?;
        only_for(
            "min",
            d.min.is_some(),
            &[ParamKind::Integer, ParamKind::Number],
        )?;
        only_for(
            "max",
            d.max.is_some(),
            &[ParamKind::Integer, ParamKind::Number],
        )?;
        only_for("values", d.values.is_some(), &[ParamKind::Enum])?;
        let pattern = match &d.pattern {
            Some(p) => Some(Pattern::compile(p).map_err(|e| {
                problem(
                    "pattern",
                    format!("invalid pattern: {e}"),
                    "write a Rust regex (https://docs.rs/regex): no look-around or backreferences",
                )
            })?),
            None => None,
        };
        if let (Some(min), Some(max)) = (d.min, d.max)
            && min > max
        {
            return Err(problem(
                "min",
                format!("min {min} is greater than max {max}"),
                "swap them",
            ));
        }
        let integral = |key: &'static str, v: Option<f64>| match v {
            Some(x) if x.fract() != 0.0 || x.abs() > 9.007_199_254_740_992e15 => Err(problem(
                key,
                format!("{x} is not an integer"),
                "give a whole number",
            )),
            _ => Ok(v.map(|x| x as i64)),
        };
        let kind = match d.kind {
            ParamKind::String => Kind::String { pattern },
            ParamKind::Path => Kind::Path { pattern },
            ParamKind::Integer => Kind::Integer {
                min: integral("min", d.min)?,
                max: integral("max", d.max)?,
            },
            ParamKind::Number => Kind::Number {
                min: d.min,
                max: d.max,
            },
            ParamKind::Boolean => Kind::Boolean,
            ParamKind::Enum => {
                let values = d.values.clone().unwrap_or_default();
                if values.is_empty() {
                    return Err(problem(
                        "values",
                        "an enum parameter needs its values".into(),
                        "add values = [\"a\", \"b\"]",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.contains('\0') || v.len() > MAX_VALUE_BYTES {
                        return Err(problem(
                            "values",
                            format!("value {v:?} contains NUL or is too long"),
                            "remove it",
                        ));
                    }
                    if values[..i].contains(v) {
                        return Err(problem(
                            "values",
                            format!("{v:?} is listed twice"),
                            "list each value once",
                        ));
                    }
                }
                Kind::Enum { values }
            }
        };
        if d.required && d.default.is_some() {
            return Err(problem(
                "required",
                "a parameter with a default is never missing".into(),
                "remove `required` or `default`",
            ));
        }
        let param = Param {
            name: name.to_string(),
            description: d
                .description
                .as_ref()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
            kind,
            required: d.required,
            default: None,
        };
        let default = match &d.default {
            Some(v) => {
                // Path defaults are resolved per call: the project may change.
                param.check_syntax(v).map_err(|e| {
                    problem(
                        "default",
                        format!("the default: {}", e.message),
                        "give a value the parameter accepts",
                    )
                })?;
                Some(v.clone())
            }
            None => None,
        };
        Ok(Param { default, ..param })
    }

    /// The parameter's JSON Schema, for the tool's input schema.
    pub fn schema(&self) -> Value {
        let mut s = match &self.kind {
            Kind::String { pattern } => {
                let mut s = json!({"type": "string"});
                if let Some(p) = pattern {
                    s["pattern"] = json!(p.anchored());
                }
                s
            }
            Kind::Path { pattern } => {
                let mut s = json!({"type": "string"});
                if let Some(p) = pattern {
                    s["pattern"] = json!(p.anchored());
                }
                s
            }
            Kind::Integer { min, max } => {
                let mut s = json!({"type": "integer"});
                if let Some(m) = min {
                    s["minimum"] = json!(m);
                }
                if let Some(m) = max {
                    s["maximum"] = json!(m);
                }
                s
            }
            Kind::Number { min, max } => {
                let mut s = json!({"type": "number"});
                if let Some(m) = min {
                    s["minimum"] = json!(m);
                }
                if let Some(m) = max {
                    s["maximum"] = json!(m);
                }
                s
            }
            Kind::Boolean => json!({"type": "boolean"}),
            Kind::Enum { values } => json!({"type": "string", "enum": values}),
        };
        let description = match (&self.description, &self.kind) {
            (Some(d), _) => Some(d.clone()),
            (None, Kind::Path { .. }) => Some("Path in the project".to_string()),
            (None, _) => None,
        };
        if let Some(d) = description {
            s["description"] = json!(d);
        }
        if let Some(d) = &self.default {
            s["default"] = d.clone();
        }
        s
    }

    fn error(&self, message: impl Into<String>) -> ValueError {
        ValueError {
            param: self.name.clone(),
            message: format!("`{}` {}", self.name, message.into()),
        }
    }

    /// Checks `v` and returns its text for argv. Paths are resolved in the
    /// project and given as their path inside the sandbox.
    pub fn check(&self, v: &Value, project: Option<&ProjectMount>) -> Result<String, ValueError> {
        let text = self.check_syntax(v)?;
        if let Kind::Path { .. } = self.kind {
            let project =
                project.ok_or_else(|| self.error("needs the project, and none is mounted"))?;
            return resolve_in_project(project, &text, false).map_err(|m| self.error(m));
        }
        Ok(text)
    }

    /// Every check that does not look at the file system.
    fn check_syntax(&self, v: &Value) -> Result<String, ValueError> {
        let wrong =
            |expected: &str| self.error(format!("must be {expected}, not {}", json_type(v)));
        let no_leading_dash =
            |text: &str, pattern: &Option<Pattern>| -> Result<(), ValueError> {
                match pattern {
                    Some(p) if !p.regex.is_match(text) => {
                        Err(self.error(format!("does not match the pattern {}", p.anchored())))
                    }
                    Some(_) => Ok(()),
                    None if text.is_empty() => Err(self.error("is empty")),
                    None if text.starts_with('-') => Err(self
                        .error("must not start with '-' (a program would read it as an option)")),
                    None => Ok(()),
                }
            };
        let text = |s: &str| -> Result<(), ValueError> {
            if s.contains('\0') {
                return Err(self.error("contains a NUL character"));
            }
            if s.len() > MAX_VALUE_BYTES {
                return Err(self.error(format!("is longer than {MAX_VALUE_BYTES} bytes")));
            }
            Ok(())
        };
        match &self.kind {
            Kind::String { pattern } | Kind::Path { pattern } => {
                let Value::String(s) = v else {
                    return Err(wrong(if self.kind.is_path() {
                        "a path (a string)"
                    } else {
                        "a string"
                    }));
                };
                text(s)?;
                no_leading_dash(s, pattern)?;
                Ok(s.clone())
            }
            Kind::Enum { values } => {
                let Value::String(s) = v else {
                    return Err(wrong("a string"));
                };
                if values.contains(s) {
                    Ok(s.clone())
                } else {
                    Err(self.error(format!("must be one of: {}", values.join(", "))))
                }
            }
            Kind::Boolean => match v {
                Value::Bool(b) => Ok(b.to_string()),
                _ => Err(wrong("true or false")),
            },
            Kind::Integer { min, max } => {
                let Value::Number(n) = v else {
                    return Err(wrong("an integer"));
                };
                let Some(i) = n.as_i64() else {
                    return Err(self.error(format!("must be an integer, not {n}")));
                };
                range(i as f64, min.map(|m| m as f64), max.map(|m| m as f64))
                    .map_err(|m| self.error(m))?;
                Ok(i.to_string())
            }
            Kind::Number { min, max } => {
                let Value::Number(n) = v else {
                    return Err(wrong("a number"));
                };
                let x = n
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| self.error("must be a finite number"))?;
                range(x, *min, *max).map_err(|m| self.error(m))?;
                // Rust prints every finite f64 without an exponent.
                Ok(if x == 0.0 {
                    "0".to_string()
                } else {
                    x.to_string()
                })
            }
        }
    }
}

/// A number's range check. Without a negative `min`, negative values are
/// refused: their leading '-' would be read as an option.
fn range(x: f64, min: Option<f64>, max: Option<f64>) -> Result<(), String> {
    if let Some(m) = min
        && x < m
    {
        return Err(format!("must be at least {m}"));
    }
    if let Some(m) = max
        && x > m
    {
        return Err(format!("must be at most {m}"));
    }
    if x < 0.0 && !min.is_some_and(|m| m < 0.0) {
        return Err("must not be negative (a program would read the '-' as an option)".to_string());
    }
    Ok(())
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Resolves `raw` (relative to the project root, or absolute under its mount
/// point) on the host, following every symlink, and returns the same place
/// as the sandbox sees it, or why it is refused. Parts that do not exist yet
/// are allowed after the last existing one (an output file), but not `..`
/// there. With `want_dir` it must be an existing directory.
pub fn resolve_in_project(
    project: &ProjectMount,
    raw: &str,
    want_dir: bool,
) -> Result<String, String> {
    if raw.contains('\0') {
        return Err("contains a NUL character".into());
    }
    let mount = project.mount_point.trim_end_matches('/');
    let relative = if raw.starts_with('/') {
        if raw == mount {
            ""
        } else if let Some(rest) = raw.strip_prefix(mount).and_then(|r| r.strip_prefix('/')) {
            rest
        } else {
            return Err(format!(
                "is outside the project (an absolute path must be under {mount})"
            ));
        }
    } else {
        raw
    };
    let root = std::fs::canonicalize(&project.host_path)
        .map_err(|e| format!("the project cannot be read: {e}"))?;
    let mut resolved = root.clone();
    let mut missing: Vec<Component> = Vec::new();
    for part in Path::new(relative).components() {
        match part {
            Component::CurDir | Component::RootDir => continue,
            Component::Prefix(_) => return Err("is not a path".into()),
            Component::ParentDir if !missing.is_empty() => {
                return Err("has '..' after a part that does not exist".into());
            }
            _ if !missing.is_empty() => missing.push(part),
            _ => match std::fs::canonicalize(resolved.join(part)) {
                Ok(p) => resolved = p,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(part),
                Err(e) => return Err(format!("cannot be resolved: {e}")),
            },
        }
    }
    if !resolved.starts_with(&root) {
        return Err("resolves outside the project (through '..' or a symlink)".into());
    }
    let full: PathBuf = missing.iter().fold(resolved, |p, c| p.join(c));
    if want_dir && (!missing.is_empty() || !full.is_dir()) {
        return Err("is not a directory in the project".into());
    }
    let inside = full
        .strip_prefix(&root)
        .map_err(|_| "resolves outside the project".to_string())?;
    let inside = inside.to_str().ok_or("is not valid UTF-8 once resolved")?;
    Ok(if inside.is_empty() {
        mount.to_string()
    } else {
        format!("{mount}/{inside}")
    })
}

/// The argument every command's tool takes besides its parameters: run
/// as a background job (a task, for a client that declares the extension).
pub const BACKGROUND: &str = "background";

/// The input schema of a command's tool: one property per parameter, and
/// [`BACKGROUND`].
pub fn input_schema(params: &[Param]) -> serde_json::Map<String, Value> {
    let mut properties: serde_json::Map<String, Value> = params
        .iter()
        .map(|p| (p.name.clone(), p.schema()))
        .collect();
    properties.insert(
        BACKGROUND.into(),
        json!({"type": "boolean", "description": "Return a job id at once"}),
    );
    let required: Vec<&str> = params
        .iter()
        .filter(|p| p.required)
        .map(|p| p.name.as_str())
        .collect();
    let mut s = serde_json::Map::new();
    s.insert("type".into(), json!("object"));
    s.insert("properties".into(), Value::Object(properties));
    if !required.is_empty() {
        s.insert("required".into(), json!(required));
    }
    s.insert("additionalProperties".into(), json!(false));
    s
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
