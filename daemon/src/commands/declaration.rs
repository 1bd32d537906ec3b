//! The declaration format of `[commands.NAME]` (in the configuration file and
//! in the project's `.nix-sandbox-mcp/commands.toml`), and its validation into
//! a [`Command`]: every problem names the file, the line where it can be
//! found, the key, and the fix. Problems that do not make a command unsafe or
//! unusable (a parameter never used, a shell as the program) are warnings.

use std::time::Duration;

use super::Command;
use super::invocation::Template;
use super::params::{self, Param};
pub use super::project_file::{Diagnostic, Source, parse_project_file, read_project_file};
use crate::config::RESERVED_VARS;
pub use crate::config::commands::{
    CommandDecl, CommandName, Danger, NAME_PATTERN, NAME_RULE, ParamDecl, ParamKind, is_valid_name,
};
use crate::jail::ProjectMount;

/// The project's own declaration file, relative to the project root.
pub const PROJECT_FILE: &str = ".nix-sandbox-mcp/commands.toml";

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
#[path = "declaration_tests.rs"]
mod tests;
