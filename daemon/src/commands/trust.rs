//! What a project's own commands file may declare. The file comes with the
//! repository, so whoever wrote the repository wrote it: it may narrow what
//! the operator's configuration allows, never widen it. Each check names
//! the key and the configuration that would allow it.
//!
//! | key          | a project's file may declare                              |
//! |--------------|-----------------------------------------------------------|
//! | `network`    | at most its environment's, or the operator's grant       |
//! | `danger`     | `moderate` or `high`; `safe` only where the grant says so |
//! | `timeout_ms` | at most its environment's, or the grant's                 |
//! | `output_bytes` | at most its environment's, or the grant's               |
//!
//! A grant is `[project.grants.NAME]` in the configuration (see
//! [`CommandGrant`]).

use std::time::Duration;

use super::declaration::{CommandDecl, Danger, Diagnostic, Source};
use crate::config::commands::CommandGrant;
use crate::network::NetworkSetting;

/// The most an environment gives a command of the project's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    pub network: NetworkSetting,
    pub timeout: Duration,
    pub output_bytes: usize,
}

impl Ceiling {
    /// What an environment gives at least: no network, the built-in limits.
    pub fn least() -> Ceiling {
        let limits = crate::limits::Limits::resolve(Default::default());
        Ceiling {
            network: NetworkSetting::Off,
            timeout: limits.timeout,
            output_bytes: limits.output_bytes,
        }
    }

    /// What `env` gives.
    pub fn of(env: &crate::environment::Environment) -> Ceiling {
        Ceiling {
            network: env.network.clone(),
            timeout: env.limits.timeout,
            output_bytes: env.limits.output_bytes,
        }
    }
}

/// Checks that the project file's command `name` asks for nothing beyond
/// `ceiling` (its environment's) and `grant` (the operator's, if any).
pub fn check(
    name: &str,
    decl: &CommandDecl,
    ceiling: &Ceiling,
    grant: Option<&CommandGrant>,
    source: &Source,
) -> Result<(), Diagnostic> {
    let grant = grant.cloned().unwrap_or_default();
    let refuse = |key: &str, message: String, grant_line: String| {
        Err(source.diagnostic(
            &[name, key],
            message,
            format!(
                "remove `{key}` from the project's file, or have the operator grant it in the configuration: [project.grants.{name}] {grant_line}"
            ),
        ))
    };
    if let Some(asked) = decl.network.policy() {
        if !asked.interception.is_empty() {
            return Err(source.diagnostic(
                &[name, "network"],
                "a project's commands file cannot hold credentials or request rules (it could point a credential at any file the server reads)".to_string(),
                "remove `credentials` and `requests` from the project's file; the operator sets them in the configuration's [environments.NAME.network] or [commands.NAME] network".to_string(),
            ));
        }
        let bound = grant.network.as_ref().unwrap_or(&ceiling.network);
        let whose = if grant.network.is_some() {
            "the configuration's grant"
        } else {
            "its environment"
        };
        let over = match bound.policy() {
            None => Some(format!("network, which {whose} does not have")),
            Some(bound) => asked.exceeds(bound).map(|what| {
                format!(
                    "{what}, beyond the network {whose} allows ({})",
                    bound.summary()
                )
            }),
        };
        if let Some(over) = over {
            return refuse(
                "network",
                format!(
                    "a project's commands file cannot give a command more network than the configuration does: it asks for {over}"
                ),
                format!("network = {{ allow = [{}] }}", quoted(&asked.summary())),
            );
        }
    }
    let least = grant.danger.unwrap_or(Danger::Moderate);
    if decl.danger < least {
        return refuse(
            "danger",
            format!(
                "a project's commands file cannot declare a command `{}` (clients may run a read-only command without asking): it is `{}` at least unless the operator says otherwise",
                decl.danger.as_str(),
                least.as_str()
            ),
            format!("danger = \"{}\"", decl.danger.as_str()),
        );
    }
    if let Some(asked) = decl.timeout_ms {
        let most = grant
            .timeout_ms
            .map_or(ceiling.timeout, |m| Duration::from_millis(m.0));
        if Duration::from_millis(asked.0) > most {
            return refuse(
                "timeout_ms",
                format!(
                    "a project's commands file cannot raise a time limit: it asks for {} ms, and the most is {} ms",
                    asked.0,
                    most.as_millis()
                ),
                format!("timeout_ms = {}", asked.0),
            );
        }
    }
    if let Some(asked) = decl.output_bytes {
        let most = grant
            .output_bytes
            .map_or(ceiling.output_bytes, |o| o.0 as usize);
        if asked.0 as usize > most {
            return refuse(
                "output_bytes",
                format!(
                    "a project's commands file cannot keep more output: it asks for {} bytes, and the most is {most}",
                    asked.0
                ),
                format!("output_bytes = {}", asked.0),
            );
        }
    }
    Ok(())
}

/// "a.b, *.c" as TOML strings: "\"a.b\", \"*.c\"".
fn quoted(summary: &str) -> String {
    summary
        .split(", ")
        .map(|e| if e == "any public host" { "*" } else { e })
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::Policy;
    use std::path::Path;

    fn decl(body: &str) -> (CommandDecl, Source) {
        let text =
            format!("[commands.c]\ndescription = \"d\"\nenv = \"bash\"\nargv = [\"make\"]\n{body}");
        let decls =
            super::super::declaration::parse_project_file(&text, Path::new("/p/commands.toml"))
                .unwrap();
        let source = Source {
            file: "/p/commands.toml".into(),
            text,
        };
        (decls["c"].clone(), source)
    }

    fn checked(body: &str, ceiling: &Ceiling, grant: Option<&str>) -> Result<(), String> {
        let (d, source) = decl(body);
        let grant: Option<CommandGrant> = grant.map(|g| toml::from_str(g).unwrap());
        check("c", &d, ceiling, grant.as_ref(), &source).map_err(|e| e.to_string())
    }

    fn networked(hosts: &[&str]) -> Ceiling {
        Ceiling {
            network: NetworkSetting::Proxied(
                Policy::from_entries(hosts, Default::default()).unwrap(),
            ),
            ..Ceiling::least()
        }
    }

    #[test]
    fn a_project_file_cannot_widen_the_network() {
        let none = Ceiling::least();
        let e = checked("network = true", &none, None).unwrap_err();
        assert!(
            e.contains("key `commands.c.network`") && e.contains("[project.grants.c]"),
            "{e}"
        );
        let e = checked("network = { allow = [\"evil.example\"] }", &none, None).unwrap_err();
        assert!(e.contains("does not have"), "{e}");
        let pypi = networked(&["pypi.org", "*.pythonhosted.org"]);
        assert!(checked("network = { allow = [\"pypi.org\"] }", &pypi, None).is_ok());
        let e = checked("network = { allow = [\"evil.example\"] }", &pypi, None).unwrap_err();
        assert!(e.contains("evil.example") && e.contains("pypi.org"), "{e}");
        assert!(checked("network = true", &pypi, None).is_err());
        // The operator's grant is the bound instead.
        let grant = Some("network = { allow = [\"staging.example\"] }");
        assert!(checked("network = { allow = [\"staging.example\"] }", &none, grant).is_ok());
        assert!(checked("network = { allow = [\"pypi.org\"] }", &pypi, grant).is_err());
        assert!(checked("network = false", &none, None).is_ok());
    }

    #[test]
    fn a_project_file_cannot_call_its_command_safe_or_raise_its_limits() {
        let none = Ceiling::least();
        let e = checked("danger = \"safe\"", &none, None).unwrap_err();
        assert!(
            e.contains("key `commands.c.danger`") && e.contains("danger = \"safe\""),
            "{e}"
        );
        assert!(checked("danger = \"safe\"", &none, Some("danger = \"safe\"")).is_ok());
        assert!(checked("danger = \"high\"", &none, None).is_ok());
        assert!(checked("", &none, None).is_ok());
        assert!(checked("danger = \"moderate\"", &none, Some("danger = \"high\"")).is_err());
        let e = checked("timeout_ms = 86400000", &none, None).unwrap_err();
        assert!(
            e.contains("key `commands.c.timeout_ms`") && e.contains("30000 ms"),
            "{e}"
        );
        assert!(checked("timeout_ms = 1000", &none, None).is_ok());
        assert!(checked("timeout_ms = 600000", &none, Some("timeout_ms = 600000")).is_ok());
        let e = checked("output_bytes = 16777216", &none, None).unwrap_err();
        assert!(e.contains("key `commands.c.output_bytes`"), "{e}");
        assert!(checked("output_bytes = 1024", &none, None).is_ok());
    }
}
