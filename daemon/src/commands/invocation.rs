//! From a command and a call's arguments to the exact argv that runs: the
//! argv template (`{{param}}` substituted inside single elements, argv[0]
//! literal, an optional `--`), the resolved invocation handed to exec, and
//! its canonical digest, to which confirmations are bound. No shell is ever
//! involved: each element stays one argument whatever it contains.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rmcp::model::JsonObject;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Command;
use super::params::ValueError;
use crate::jail::{ProjectMount, WORKSPACE};
use crate::network::NetworkSetting;

/// Largest total argv, in bytes (far below the kernel's limit).
const MAX_ARGV_BYTES: usize = 128 * 1024;

/// One argv element: literal text and placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Param(String),
}

/// A declared argv with its placeholders parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    elements: Vec<Vec<Piece>>,
    /// Where `--` goes: before this element (the first with a placeholder).
    separator: Option<usize>,
}

/// A problem in a declared argv.
#[derive(Debug, PartialEq, Eq)]
pub struct TemplateError {
    pub message: String,
    pub fix: String,
}

fn parse_element(i: usize, s: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_string()));
        }
        let after = &rest[open + 2..];
        let name_len = after
            .find("}}")
            .filter(|n| {
                let name = &after[..*n];
                let mut chars = name.chars();
                chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
            .ok_or_else(|| TemplateError {
                message: format!("argv[{i}] {s:?} has '{{{{' that starts no placeholder"),
                fix: "write placeholders as {{name}} with a parameter's name; argv has no other use for '{{'".into(),
            })?;
        pieces.push(Piece::Param(after[..name_len].to_string()));
        rest = &after[name_len + 2..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

impl Template {
    pub fn parse(argv: &[String], separator: bool) -> Result<Template, TemplateError> {
        let Some(program) = argv.first() else {
            return Err(TemplateError {
                message: "argv is empty".into(),
                fix: "give the program and its arguments, e.g. [\"cargo\", \"test\"]".into(),
            });
        };
        if program.is_empty() || program.contains("{{") {
            return Err(TemplateError {
                message: format!("argv[0] {program:?} must be a literal program name"),
                fix: "name the program itself; only later arguments may hold {{parameters}}".into(),
            });
        }
        if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
            return Err(TemplateError {
                message: format!("argv[{i}] contains a NUL character"),
                fix: "remove it".into(),
            });
        }
        let elements = argv
            .iter()
            .enumerate()
            .map(|(i, a)| parse_element(i, a))
            .collect::<Result<Vec<_>, _>>()?;
        let first_param = elements
            .iter()
            .position(|e| e.iter().any(|p| matches!(p, Piece::Param(_))));
        Ok(Template {
            elements,
            separator: if separator { first_param } else { None },
        })
    }

    /// The names the template substitutes.
    pub fn params(&self) -> BTreeSet<&str> {
        self.elements
            .iter()
            .flatten()
            .filter_map(|p| match p {
                Piece::Param(n) => Some(n.as_str()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    pub fn has_placeholder(&self, i: usize) -> bool {
        self.elements
            .get(i)
            .is_some_and(|e| e.iter().any(|p| matches!(p, Piece::Param(_))))
    }

    /// Where `--` goes, when the command asks for one and has parameters.
    pub fn separator_index(&self) -> Option<usize> {
        self.separator
    }

    /// The argv as declared, placeholders as `{{name}}` (with the `--` the
    /// separator adds), for listings.
    pub fn declared(&self) -> Vec<String> {
        let placeholders: Vec<(&str, String)> = self
            .params()
            .into_iter()
            .map(|n| (n, format!("{{{{{n}}}}}")))
            .collect();
        self.render(&placeholders.into_iter().collect())
    }

    /// The argv for these values. An element that mentions a parameter
    /// without a value is left out whole.
    pub fn render(&self, values: &BTreeMap<&str, String>) -> Vec<String> {
        let mut argv = Vec::with_capacity(self.elements.len() + 1);
        for (i, element) in self.elements.iter().enumerate() {
            if self.separator == Some(i) {
                argv.push("--".to_string());
            }
            let mut out = String::new();
            let mut complete = true;
            for piece in element {
                match piece {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Param(n) => match values.get(n.as_str()) {
                        Some(v) => out.push_str(v),
                        None => complete = false,
                    },
                }
            }
            if complete {
                argv.push(out);
            }
        }
        argv
    }
}

/// Exactly what one call of a command runs: handed to exec, shown to the
/// user when confirmation is needed, and hashed to bind a confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedInvocation {
    /// The declared command's name.
    pub command: String,
    /// The environment it runs in.
    pub env: String,
    pub argv: Vec<String>,
    /// Where it starts, inside the sandbox.
    pub workdir: String,
    pub vars: Vec<(String, String)>,
    /// Overrides of the environment's limits.
    pub timeout: Option<Duration>,
    pub output_bytes: Option<usize>,
    pub network: NetworkSetting,
}

impl ResolvedInvocation {
    /// SHA-256 of a canonical encoding of every field: two invocations have
    /// the same digest only when they would run the same thing.
    pub fn digest(&self) -> [u8; 32] {
        // The policy's every rule and bound, as written.
        let network = format!("{:?}", self.network);
        let canonical = json!([
            "nix-sandbox-mcp command invocation v1",
            self.command,
            self.env,
            self.argv,
            self.workdir,
            self.vars,
            self.timeout.map(|t| t.as_millis() as u64),
            self.output_bytes,
            network,
        ]);
        Sha256::digest(canonical.to_string().as_bytes()).into()
    }

    /// The argv as a person reads it: plain elements as they are, others
    /// quoted with escapes, so spaces, quotes and control characters show.
    pub fn display_argv(&self) -> String {
        self.argv
            .iter()
            .map(|a| {
                let plain = !a.is_empty()
                    && a.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
                if plain { a.clone() } else { format!("{a:?}") }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A call's arguments that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidArguments {
    /// The parameter at fault, when one is.
    pub param: Option<String>,
    pub message: String,
}

impl From<ValueError> for InvalidArguments {
    fn from(e: ValueError) -> Self {
        InvalidArguments {
            param: Some(e.param),
            message: e.message,
        }
    }
}

/// Checks a call's arguments against `command`'s parameters and builds the
/// invocation. Null counts as absent.
/// `args` without [`super::params::BACKGROUND`], and whether it asked for
/// a background run.
pub fn split_background(
    args: Option<&JsonObject>,
) -> Result<(Option<JsonObject>, bool), InvalidArguments> {
    let Some(args) = args else {
        return Ok((None, false));
    };
    let mut rest = args.clone();
    let background = match rest.remove(super::params::BACKGROUND) {
        None => false,
        Some(serde_json::Value::Bool(b)) => b,
        Some(other) => {
            return Err(InvalidArguments {
                param: Some(super::params::BACKGROUND.to_string()),
                message: format!("`background` must be true or false, not {other}"),
            });
        }
    };
    Ok((Some(rest), background))
}

pub fn resolve(
    command: &Command,
    args: Option<&JsonObject>,
    project: Option<&ProjectMount>,
) -> Result<ResolvedInvocation, InvalidArguments> {
    let empty = JsonObject::new();
    let args = args.unwrap_or(&empty);
    if let Some(unknown) = args
        .keys()
        .find(|k| !command.params.iter().any(|p| p.name == **k))
    {
        return Err(InvalidArguments {
            param: Some(unknown.clone()),
            message: if command.params.is_empty() {
                format!("unknown parameter `{unknown}`; {} takes none", command.name)
            } else {
                format!(
                    "unknown parameter `{unknown}`; {} takes {}",
                    command.name,
                    command
                        .params
                        .iter()
                        .map(|p| format!("`{}`", p.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
        });
    }
    let mut values = BTreeMap::new();
    for p in &command.params {
        let given = args.get(&p.name).filter(|v| !v.is_null());
        let value: Option<&Value> = given.or(p.default.as_ref());
        match value {
            Some(v) => {
                values.insert(p.name.as_str(), p.check(v, project)?);
            }
            None if p.required => {
                return Err(InvalidArguments {
                    param: Some(p.name.clone()),
                    message: format!("missing parameter `{}`", p.name),
                });
            }
            None => {}
        }
    }
    let argv = command.template.render(&values);
    if argv.iter().map(|a| a.len() + 1).sum::<usize>() > MAX_ARGV_BYTES {
        return Err(InvalidArguments {
            param: None,
            message: format!("the arguments are longer than {MAX_ARGV_BYTES} bytes together"),
        });
    }
    let workdir = match (project, &command.workdir) {
        (Some(p), Some(dir)) => {
            super::params::resolve_in_project(p, dir, true).map_err(|m| InvalidArguments {
                param: None,
                message: format!("the command's working directory {dir:?} {m}"),
            })?
        }
        (Some(p), None) => p.mount_point.clone(),
        (None, Some(_)) => {
            return Err(InvalidArguments {
                param: None,
                message: "the command's working directory needs the project, and none is mounted"
                    .into(),
            });
        }
        (None, None) => WORKSPACE.to_string(),
    };
    Ok(ResolvedInvocation {
        command: command.name.clone(),
        env: command.env.clone(),
        argv,
        workdir,
        vars: command.vars.clone(),
        timeout: command.timeout,
        output_bytes: command.output_bytes,
        network: command.network.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(argv: &[&str], separator: bool) -> Template {
        Template::parse(
            &argv.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            separator,
        )
        .unwrap()
    }

    fn values<'a>(pairs: &[(&'a str, &str)]) -> BTreeMap<&'a str, String> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn the_declared_form_keeps_placeholders_and_the_separator() {
        let tpl = t(&["git", "log", "--max-count={{n}}", "{{path}}"], true);
        assert_eq!(
            tpl.declared(),
            ["git", "log", "--", "--max-count={{n}}", "{{path}}"]
        );
    }

    #[test]
    fn placeholders_substitute_inside_one_element_only() {
        let tpl = t(
            &[
                "git",
                "log",
                "--max-count={{n}}",
                "{{rev}}",
                "x{{a}}y{{b}}z",
            ],
            false,
        );
        assert_eq!(
            tpl.params().into_iter().collect::<Vec<_>>(),
            ["a", "b", "n", "rev"]
        );
        let argv = tpl.render(&values(&[
            ("n", "5"),
            ("rev", "a b; rm -rf /"),
            ("a", "1"),
            ("b", "2"),
        ]));
        assert_eq!(
            argv,
            ["git", "log", "--max-count=5", "a b; rm -rf /", "x1y2z"]
        );
    }

    #[test]
    fn elements_of_absent_optional_parameters_are_left_out() {
        let tpl = t(&["cargo", "test", "--features={{f}}", "{{filter}}"], false);
        assert_eq!(
            tpl.render(&values(&[("filter", "db")])),
            ["cargo", "test", "db"]
        );
        assert_eq!(tpl.render(&values(&[])), ["cargo", "test"]);
    }

    #[test]
    fn the_separator_goes_before_the_first_parameter() {
        let tpl = t(&["grep", "-r", "{{pattern}}", "src"], true);
        assert_eq!(
            tpl.render(&values(&[("pattern", "-v")])),
            ["grep", "-r", "--", "-v", "src"]
        );
        assert_eq!(t(&["ls"], true).separator_index(), None);
    }

    #[test]
    fn malformed_placeholders_and_a_templated_program_are_refused() {
        let err = |argv: &[&str]| {
            Template::parse(
                &argv.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                false,
            )
            .unwrap_err()
        };
        assert!(err(&["{{prog}}"]).message.contains("argv[0]"));
        assert!(err(&["x{{prog}}"]).message.contains("argv[0]"));
        assert!(err(&["ls", "{{ bad }}"]).message.contains("argv[1]"));
        assert!(err(&["ls", "{{unclosed"]).message.contains("argv[1]"));
        assert!(err(&["ls", "{{1x}}"]).message.contains("argv[1]"));
        assert!(err(&["ls", "a\u{0}b"]).message.contains("NUL"));
        assert!(err(&[]).message.contains("empty"));
        assert!(err(&[""]).message.contains("argv[0]"));
    }

    fn inv(argv: &[&str]) -> ResolvedInvocation {
        ResolvedInvocation {
            command: "c".into(),
            env: "bash".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            workdir: "/project".into(),
            vars: vec![],
            timeout: None,
            output_bytes: None,
            network: NetworkSetting::Off,
        }
    }

    #[test]
    fn the_digest_changes_with_every_field_and_is_not_fooled_by_joining() {
        let base = inv(&["echo", "a b"]);
        let d = base.digest();
        assert_eq!(d, inv(&["echo", "a b"]).digest());
        assert_ne!(d, inv(&["echo", "a", "b"]).digest());
        assert_ne!(d, inv(&["echo", "a b", ""]).digest());
        for changed in [
            ResolvedInvocation {
                command: "d".into(),
                ..base.clone()
            },
            ResolvedInvocation {
                env: "python".into(),
                ..base.clone()
            },
            ResolvedInvocation {
                workdir: "/project/src".into(),
                ..base.clone()
            },
            ResolvedInvocation {
                vars: vec![("A".into(), "1".into())],
                ..base.clone()
            },
            ResolvedInvocation {
                timeout: Some(Duration::from_secs(1)),
                ..base.clone()
            },
            ResolvedInvocation {
                output_bytes: Some(512),
                ..base.clone()
            },
            ResolvedInvocation {
                network: NetworkSetting::Proxied(crate::network::Policy::any_public()),
                ..base.clone()
            },
        ] {
            assert_ne!(d, changed.digest(), "{changed:?}");
        }
    }

    #[test]
    fn display_quotes_what_a_reader_needs_quoted() {
        assert_eq!(
            inv(&["git", "push", "origin", "main"]).display_argv(),
            "git push origin main"
        );
        assert_eq!(
            inv(&["echo", "a b", "it's", ""]).display_argv(),
            r#"echo "a b" "it's" """#
        );
        assert_eq!(
            inv(&["echo", "a\nb\u{1b}"]).display_argv(),
            r#"echo "a\nb\u{1b}""#
        );
    }
}
