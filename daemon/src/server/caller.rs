//! Who calls and what they may do. On stdio the one client may do
//! everything; over HTTP each request carries the [`Grants`] its
//! credentials gave (`http/`), and each principal has its [`Quota`]: its
//! share of runs, sessions and jobs, so that one caller cannot starve the
//! others.

use std::collections::BTreeSet;

use rmcp::RoleServer;
use rmcp::service::RequestContext;

use super::result::{ErrorCode, ToolError};
use super::tool;
use crate::exec::Admission;

/// What a request's credentials allow, from its scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    /// `sandbox:run`: the run and job tools.
    pub run: bool,
    /// `sandbox:commands`: the declared commands' tools.
    pub commands: bool,
    /// `sandbox:confirm`: approving a command that needs confirmation.
    pub confirm: bool,
    /// `sandbox:env:NAME`: only these environments (`None`: any).
    pub environments: Option<BTreeSet<String>>,
    /// `sandbox:project:NAME`: only these projects, `default` for the
    /// server's own (`None`: any).
    pub projects: Option<BTreeSet<String>>,
}

/// The project a call runs in when it names none.
pub const DEFAULT_PROJECT: &str = "default";

impl Grants {
    /// Everything: the stdio client.
    pub fn all() -> Grants {
        Grants {
            run: true,
            commands: true,
            confirm: true,
            environments: None,
            projects: None,
        }
    }

    /// From scopes (unknown ones mean nothing).
    pub fn from_scopes<'a>(scopes: impl IntoIterator<Item = &'a str>) -> Grants {
        let mut g = Grants {
            run: false,
            commands: false,
            confirm: false,
            environments: None,
            projects: None,
        };
        for s in scopes {
            match s {
                "sandbox:run" => g.run = true,
                "sandbox:commands" => g.commands = true,
                "sandbox:confirm" => g.confirm = true,
                _ => {
                    if let Some(env) = s.strip_prefix("sandbox:env:") {
                        g.environments
                            .get_or_insert_default()
                            .insert(env.to_string());
                    } else if let Some(p) = s.strip_prefix("sandbox:project:") {
                        g.projects.get_or_insert_default().insert(p.to_string());
                    }
                }
            }
        }
        g
    }

    /// The grants a request carries: those the HTTP layer put on it, or
    /// everything for the stdio client. `remote`: served over HTTP, where a
    /// request without grants (which the HTTP layer never lets through) may
    /// do nothing.
    pub fn of(context: &RequestContext<RoleServer>, remote: bool) -> Grants {
        let given = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Grants>())
            .cloned();
        match (given, remote) {
            (Some(g), _) => g,
            (None, false) => Grants::all(),
            (None, true) => Grants::from_scopes([]),
        }
    }

    pub fn may_use_env(&self, name: &str) -> Result<(), ToolError> {
        match &self.environments {
            Some(allowed) if !allowed.contains(name) => Err(forbidden(
                format!("this caller may not use the environment {name:?}"),
                format!(
                    "Use one it may: {}.",
                    allowed.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `name`: the project the call named, [`DEFAULT_PROJECT`] for none.
    pub fn may_use_project(&self, name: &str) -> Result<(), ToolError> {
        match &self.projects {
            Some(allowed) if !allowed.contains(name) => Err(forbidden(
                format!("this caller may not use the project {name:?}"),
                format!(
                    "Name one it may in `project`: {}.",
                    allowed.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The scope a call of `tool` needs that `grants` lacks, if any.
pub fn missing_scope(tool: &str, grants: &Grants) -> Option<&'static str> {
    let (scope, has) = match tool {
        tool::RUN => ("sandbox:run", grants.run),
        tool::JOB => ("sandbox:run", grants.run || grants.commands),
        tool::CONFIRM => ("sandbox:confirm", grants.confirm),
        _ => ("sandbox:commands", grants.commands),
    };
    (!has).then_some(scope)
}

/// A refusal for want of a grant.
pub fn forbidden(what: impl Into<String>, fix: impl Into<String>) -> ToolError {
    ToolError::new(ErrorCode::Forbidden, what, fix)
}

/// One principal's bounds, shared by all its requests.
#[derive(Debug)]
pub struct Quota {
    /// Its share of the run slots: its calls in flight, and those waiting.
    pub runs: Admission,
    pub max_sessions: usize,
    pub max_jobs: usize,
}

impl Quota {
    pub fn new(max_runs: usize, max_waiting: usize, max_sessions: usize, max_jobs: usize) -> Quota {
        Quota {
            runs: Admission::for_caller(max_runs, max_waiting),
            max_sessions,
            max_jobs,
        }
    }
}
