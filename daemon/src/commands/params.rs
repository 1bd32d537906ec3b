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

/// The input schema of a command's tool: one property per parameter.
pub fn input_schema(params: &[Param]) -> serde_json::Map<String, Value> {
    let properties: serde_json::Map<String, Value> = params
        .iter()
        .map(|p| (p.name.clone(), p.schema()))
        .collect();
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
mod tests {
    use super::*;

    fn param(toml_text: &str) -> Result<Param, DeclProblem> {
        let d: ParamDecl = toml::from_str(toml_text).unwrap();
        Param::from_decl("p", &d)
    }

    fn ok(p: &Param, v: Value) -> String {
        p.check(&v, None)
            .unwrap_or_else(|e| panic!("{v}: {}", e.message))
    }

    fn refused(p: &Param, v: Value) -> String {
        let e = p.check(&v, None).expect_err(&v.to_string());
        assert_eq!(e.param, "p");
        assert!(e.message.starts_with("`p` "), "{}", e.message);
        e.message
    }

    #[test]
    fn strings_refuse_nul_empty_and_a_leading_dash_by_default() {
        let p = param("type = \"string\"").unwrap();
        assert_eq!(ok(&p, json!("main")), "main");
        assert_eq!(ok(&p, json!("a b; rm -rf / $(id)")), "a b; rm -rf / $(id)");
        assert!(refused(&p, json!("--upload-pack=touch /tmp/x")).contains("'-'"));
        assert!(refused(&p, json!("-rf")).contains("'-'"));
        assert!(refused(&p, json!("a\u{0}b")).contains("NUL"));
        assert!(refused(&p, json!("")).contains("empty"));
        assert!(refused(&p, json!(5)).contains("must be a string, not a number"));
        assert!(refused(&p, json!("x".repeat(MAX_VALUE_BYTES + 1))).contains("longer"));
    }

    #[test]
    fn an_explicit_pattern_replaces_the_default_and_matches_the_whole_value() {
        let p = param("type = \"string\"\npattern = \"-[a-z]+\"").unwrap();
        assert_eq!(ok(&p, json!("-v")), "-v");
        assert!(refused(&p, json!("-v; x")).contains("pattern ^(?:-[a-z]+)$"));
        let p = param("type = \"string\"\npattern = \"[a-z]+\"").unwrap();
        assert!(refused(&p, json!("abc\nrm")).contains("pattern"));
        assert!(refused(&p, json!("nul\u{0}")).contains("NUL"));
    }

    #[test]
    fn patterns_are_compiled_with_bounds_and_without_backtracking_features() {
        assert!(
            param("type = \"string\"\npattern = \"(a\"")
                .unwrap_err()
                .message
                .contains("invalid pattern")
        );
        assert!(param("type = \"string\"\npattern = \"(?=a)\"").is_err());
        assert!(param("type = \"string\"\npattern = \"(a)\\\\1\"").is_err());
        let huge = format!("type = \"string\"\npattern = \"{}\"", "a{1000}{1000}");
        assert!(param(&huge).is_err());
        // Catastrophic for a backtracking engine; linear here.
        let p = param("type = \"string\"\npattern = \"(a+)+b\"").unwrap();
        let started = std::time::Instant::now();
        refused(&p, json!("a".repeat(4000)));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn integers_and_numbers_are_strict_finite_and_in_range() {
        let p = param("type = \"integer\"\nmin = 1\nmax = 100").unwrap();
        assert_eq!(ok(&p, json!(42)), "42");
        assert!(refused(&p, json!(0)).contains("at least 1"));
        assert!(refused(&p, json!(101)).contains("at most 100"));
        assert!(refused(&p, json!(1.5)).contains("integer"));
        assert!(refused(&p, json!("5")).contains("must be an integer, not a string"));
        let p = param("type = \"integer\"").unwrap();
        assert!(refused(&p, json!(-1)).contains("negative"));
        let p = param("type = \"integer\"\nmin = -5").unwrap();
        assert_eq!(ok(&p, json!(-5)), "-5");
        let p = param("type = \"number\"\nmax = 2.5").unwrap();
        assert_eq!(ok(&p, json!(0.25)), "0.25");
        assert_eq!(ok(&p, json!(1e-7)), "0.0000001");
        assert!(refused(&p, json!(3)).contains("at most 2.5"));
        assert!(refused(&p, json!(-0.5)).contains("negative"));
        let p = param("type = \"number\"").unwrap();
        assert_eq!(ok(&p, json!(1e21)), "1000000000000000000000");
        assert!(param("type = \"integer\"\nmin = 1.5").is_err());
        assert!(param("type = \"integer\"\nmin = 5\nmax = 1").is_err());
    }

    #[test]
    fn booleans_are_json_booleans_only() {
        let p = param("type = \"boolean\"").unwrap();
        assert_eq!(ok(&p, json!(true)), "true");
        assert_eq!(ok(&p, json!(false)), "false");
        for v in [json!("true"), json!(1), json!(0), json!("yes")] {
            assert!(refused(&p, v).contains("true or false"));
        }
    }

    #[test]
    fn enums_take_only_their_values() {
        let p = param("type = \"enum\"\nvalues = [\"debug\", \"--release\"]").unwrap();
        assert_eq!(ok(&p, json!("--release")), "--release");
        assert!(refused(&p, json!("--other")).contains("one of: debug, --release"));
        assert!(param("type = \"enum\"").is_err());
        assert!(param("type = \"enum\"\nvalues = [\"a\", \"a\"]").is_err());
    }

    #[test]
    fn declarations_refuse_keys_that_do_not_apply_and_bad_defaults() {
        let e = param("type = \"boolean\"\npattern = \"x\"").unwrap_err();
        assert_eq!(e.key, "pattern");
        assert_eq!(param("type = \"string\"\nmin = 1").unwrap_err().key, "min");
        assert_eq!(
            param("type = \"string\"\nvalues = [\"a\"]")
                .unwrap_err()
                .key,
            "values"
        );
        assert_eq!(
            param("type = \"string\"\ndefault = \"-x\"")
                .unwrap_err()
                .key,
            "default"
        );
        assert_eq!(
            param("type = \"integer\"\ndefault = \"3\"")
                .unwrap_err()
                .key,
            "default"
        );
        assert_eq!(
            param("type = \"string\"\ndefault = \"x\"\nrequired = true")
                .unwrap_err()
                .key,
            "required"
        );
        assert!(
            Param::from_decl("bad-name", &toml::from_str("type = \"string\"").unwrap()).is_err()
        );
    }

    #[test]
    fn the_schema_says_type_range_values_and_default() {
        let p =
            param("type = \"integer\"\nmin = 1\nmax = 9\ndefault = 3\ndescription = \"How many\"")
                .unwrap();
        assert_eq!(
            p.schema(),
            json!({"type": "integer", "minimum": 1, "maximum": 9, "default": 3, "description": "How many"})
        );
        let e = param("type = \"enum\"\nvalues = [\"a\"]").unwrap();
        assert_eq!(e.schema(), json!({"type": "string", "enum": ["a"]}));
        let s = input_schema(&[
            Param {
                required: true,
                ..param("type = \"string\"").unwrap()
            },
            Param {
                name: "q".into(),
                ..param("type = \"boolean\"").unwrap()
            },
        ]);
        assert_eq!(
            Value::Object(s),
            json!({"type": "object", "properties": {"p": {"type": "string"}, "q": {"type": "boolean"}}, "required": ["p"], "additionalProperties": false})
        );
    }

    fn project() -> (tempfile::TempDir, ProjectMount) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::write(root.join("src/main.rs"), "").unwrap();
        std::fs::write(dir.path().join("secret"), "").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("secret-link")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
        std::os::unix::fs::symlink("src/main.rs", root.join("inner-link")).unwrap();
        let mount = ProjectMount {
            host_path: root.canonicalize().unwrap(),
            mount_point: "/project".into(),
            writable: false,
        };
        (dir, mount)
    }

    #[test]
    fn paths_resolve_inside_the_project_and_are_given_as_the_sandbox_sees_them() {
        let (_dir, project) = project();
        let p = param("type = \"path\"").unwrap();
        let check = |v: &str| p.check(&json!(v), Some(&project)).map_err(|e| e.message);
        assert_eq!(check("src/main.rs").unwrap(), "/project/src/main.rs");
        assert_eq!(
            check("/project/src/../src/main.rs").unwrap(),
            "/project/src/main.rs"
        );
        assert_eq!(check("inner-link").unwrap(), "/project/src/main.rs");
        assert_eq!(
            check("src/new/out.txt").unwrap(),
            "/project/src/new/out.txt"
        );
        assert_eq!(check(".").unwrap(), "/project");
        assert_eq!(check("/project").unwrap(), "/project");
        for bad in [
            "../secret",
            "src/../../secret",
            "secret-link",
            "etc-link/passwd",
            "/etc/passwd",
            "/projectx/a",
            "src/missing/../../../secret",
            "-rf",
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e.starts_with("`p` "), "{bad}: {e}");
        }
        assert!(
            p.check(&json!("src"), None)
                .unwrap_err()
                .message
                .contains("project")
        );
    }

    #[test]
    fn a_directory_must_exist_for_a_working_directory() {
        let (_dir, project) = project();
        assert_eq!(
            resolve_in_project(&project, "src/deep", true).unwrap(),
            "/project/src/deep"
        );
        assert!(resolve_in_project(&project, "src/main.rs", true).is_err());
        assert!(resolve_in_project(&project, "src/none", true).is_err());
        assert!(resolve_in_project(&project, "etc-link", true).is_err());
    }
}
