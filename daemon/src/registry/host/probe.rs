//! The start-up probe of a host environment: a few lines run in the jail
//! that print the interpreter's version and the notable tools or packages
//! present, which become the environment's description.

use crate::environment::{Environment, InterpreterKind};

/// Start-up probe for host presets: prints the version (first line) and the
/// notable tools or packages present (second line).
pub fn probe_code(env: &Environment) -> Option<&'static str> {
    if !matches!(env.origin, crate::environment::Origin::Host { .. }) {
        return None;
    }
    match (env.kind, env.file_name.as_str()) {
        (Some(InterpreterKind::Bash), ".main.sh") => Some(
            "echo \"${BASH_VERSION%%(*}\"\nfor t in git make gcc cc jq rg curl sqlite3 python3 node perl awk sed grep find tar; do command -v \"$t\" >/dev/null 2>&1 && printf '%s ' \"$t\"; done; echo\n",
        ),
        (Some(InterpreterKind::Python), ".main.py") => Some(
            "import sys, importlib.util as u\nprint(sys.version.split()[0])\nprint(' '.join(m for m in ['numpy', 'pandas', 'scipy', 'requests', 'yaml', 'pytest', 'matplotlib'] if u.find_spec(m)))\n",
        ),
        (Some(InterpreterKind::Node), ".main.js") => {
            Some("console.log(process.version.replace(/^v/, ''));\nconsole.log('');\n")
        }
        _ => None,
    }
}

/// Fills in the description and tools from the probe's output.
pub fn describe_from_probe(mut env: Environment, out: &str) -> Environment {
    let mut lines = out.lines();
    let version = lines.next().unwrap_or("").trim().to_string();
    let extras: Vec<String> = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let default_description = env.description == env.name;
    match env.kind {
        Some(InterpreterKind::Bash) => {
            env.tools = std::iter::once("bash".to_string())
                .chain(extras.iter().cloned())
                .collect();
            if default_description {
                // The description stays short: the base tools, then at most six more.
                let shown: Vec<&str> = extras
                    .iter()
                    .map(String::as_str)
                    .filter(|t| {
                        !matches!(
                            *t,
                            "awk"
                                | "sed"
                                | "grep"
                                | "find"
                                | "tar"
                                | "cc"
                                | "python3"
                                | "node"
                                | "perl"
                        )
                    })
                    .take(6)
                    .collect();
                env.description = format!(
                    "Bash {version}, coreutils{}",
                    if shown.is_empty() {
                        String::new()
                    } else {
                        format!(", {}", shown.join(", "))
                    }
                );
            }
        }
        Some(InterpreterKind::Python) => {
            env.tools = vec!["python3".to_string()];
            if default_description {
                env.description = if extras.is_empty() {
                    format!("Python {version} (standard library)")
                } else {
                    format!("Python {version} with {}", extras.join(", "))
                };
            }
        }
        Some(InterpreterKind::Node) => {
            env.tools = vec!["node".to_string()];
            if default_description {
                env.description = format!("Node.js {version}");
            }
        }
        None => {}
    }
    env
}
