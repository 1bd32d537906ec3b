//! Declared commands: the few things a project does every day, declared once
//! by a person (in the configuration's `[commands.NAME]` tables or the
//! project's `.nix-sandbox-mcp/commands.toml`) with typed parameters the
//! agent fills in, each offered as a tool of its own. Owns the declaration
//! format and its validation (`declaration.rs`), the parameters and their
//! checks (`params.rs`), building the argv without a shell and the digest
//! of an invocation (`invocation.rs`), confirmation by question or token
//! (`confirm.rs`) and the sealed state of a question asked in a result
//! (`sealed.rs`), what the project's own file may declare (`trust.rs`),
//! and reloading the project file (`watch.rs`). Knows
//! environments only by name and the project only through its mount; the
//! server runs the invocations and exec runs the argv.

pub mod confirm;
pub mod declaration;
pub mod invocation;
pub mod params;
mod project_file;
pub mod sealed;
pub mod trust;
pub mod watch;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::jail::ProjectMount;
use crate::network::NetworkSetting;
use declaration::{Context, Danger, Diagnostic, Source};
use invocation::Template;
use params::Param;

use crate::sync::Recover;
pub use declaration::{CommandDecl, PROJECT_FILE};
pub use invocation::ResolvedInvocation;

/// Tool names the server itself uses: a command with one of these names is
/// offered as `cmd_NAME`.
pub const RESERVED_TOOL_NAMES: &[&str] = &["run", "job", "confirm"];

/// A validated command.
#[derive(Debug)]
pub struct Command {
    pub name: String,
    pub description: String,
    /// The environment it runs in.
    pub env: String,
    pub template: Template,
    pub params: Vec<Param>,
    pub vars: Vec<(String, String)>,
    /// Working directory relative to the project root, as declared
    /// (resolved again at each call: symlinks can change).
    pub workdir: Option<String>,
    pub timeout: Option<Duration>,
    pub output_bytes: Option<usize>,
    pub danger: Danger,
    pub confirm: bool,
    /// Offered as a tool: not disabled, and everything it needs is there.
    pub enabled: bool,
    pub network: NetworkSetting,
    /// Where it was declared.
    pub file: PathBuf,
}

/// A command as offered: under its tool name.
#[derive(Debug, Clone)]
pub struct Offered {
    pub tool: String,
    pub command: Arc<Command>,
}

/// The commands offered right now.
#[derive(Debug, Default)]
pub struct Catalog {
    pub offered: Vec<Offered>,
}

impl Catalog {
    pub fn by_tool(&self, tool: &str) -> Option<&Offered> {
        self.offered.iter().find(|o| o.tool == tool)
    }

    /// Whether any command needs confirmation (and so the `confirm` tool).
    pub fn any_confirm(&self) -> bool {
        self.offered.iter().any(|o| o.command.confirm)
    }

    pub fn is_empty(&self) -> bool {
        self.offered.is_empty()
    }
}

/// Declarations that cannot be used, all of them.
#[derive(Debug)]
pub struct LoadError(pub Vec<Diagnostic>);

/// Logs the project file's problems: its commands are not offered.
fn withdrawn(problems: &[Diagnostic]) {
    for p in problems {
        tracing::error!("{p}");
    }
    tracing::error!("the commands of the project file are withdrawn until it is fixed");
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "{n} problem{} in declared commands:",
            if n == 1 { "" } else { "s" }
        )?;
        for d in &self.0 {
            write!(f, "\n{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// What the commands are loaded from.
pub struct Setup<'a> {
    /// The configuration's `[commands.NAME]` tables.
    pub declared: &'a BTreeMap<String, CommandDecl>,
    /// The configuration file, to point at lines.
    pub config_file: Option<&'a Path>,
    /// The environments that exist.
    pub envs: Vec<String>,
    /// The most each environment gives a command of the project's file
    /// (an environment without one, still being built, gives the least).
    pub ceilings: BTreeMap<String, trust::Ceiling>,
    /// The operator's grants to the project file's commands, by name.
    pub grants: BTreeMap<String, crate::config::commands::CommandGrant>,
    pub project: Option<&'a ProjectMount>,
    /// A shorter life for confirmation tokens and the wait for an answer
    /// (a test build's `NIX_SANDBOX_TEST_CONFIRM_TTL_MS`; never longer).
    pub confirm_ttl: Option<Duration>,
}

/// The live set of commands: the configuration's, fixed at start-up, and the
/// project file's, reloaded when it changes.
#[derive(Debug)]
pub struct Commands {
    config: Vec<Arc<Command>>,
    /// The project file on the host, when it is read at all.
    project_file: Option<PathBuf>,
    envs: Vec<String>,
    ceilings: BTreeMap<String, trust::Ceiling>,
    grants: BTreeMap<String, crate::config::commands::CommandGrant>,
    project: Option<ProjectMount>,
    current: RwLock<Arc<Catalog>>,
    /// SHA-256 of the project file's text last loaded (`None`: no file).
    loaded_text: Mutex<Option<[u8; 32]>>,
    pub tokens: confirm::Tokens,
    /// How long to wait for the user's answer to a question.
    pub ask_timeout: Duration,
}

impl Commands {
    /// No commands at all.
    pub fn none() -> Commands {
        Commands {
            config: Vec::new(),
            project_file: None,
            envs: Vec::new(),
            ceilings: BTreeMap::new(),
            grants: BTreeMap::new(),
            project: None,
            current: RwLock::new(Arc::new(Catalog::default())),
            loaded_text: Mutex::new(None),
            tokens: confirm::Tokens::new(confirm::TOKEN_TTL),
            ask_timeout: confirm::ASK_TIMEOUT,
        }
    }

    /// Validates the configuration's commands and the project file's; every
    /// problem is reported, warnings are logged.
    pub fn load(setup: Setup) -> Result<Commands, LoadError> {
        Commands::load_with(setup, true)
    }

    /// The same for a project chosen while the server runs: problems of the
    /// configuration's commands are reported, the project file's are logged
    /// and its commands withdrawn until it is fixed (as on a reload).
    pub fn load_for_new_project(setup: Setup) -> Result<Commands, LoadError> {
        Commands::load_with(setup, false)
    }

    fn load_with(setup: Setup, project_file_strict: bool) -> Result<Commands, LoadError> {
        let mut errors = Vec::new();
        let mut config = Vec::new();
        if !setup.declared.is_empty() {
            let source = match setup.config_file {
                Some(f) => Source::read_for_lines(f),
                None => Source {
                    file: PathBuf::from("(configuration)"),
                    text: String::new(),
                },
            };
            let ctx = Context {
                envs: &setup.envs,
                project: setup.project,
            };
            for (name, decl) in setup.declared {
                match declaration::validate(name, decl, &source, ctx) {
                    Ok(checked) => {
                        log_warnings(&checked.warnings);
                        config.push(Arc::new(checked.command));
                    }
                    Err(d) => errors.push(d),
                }
            }
        }
        let project_file = match setup.project {
            Some(p) if p.access == crate::jail::ProjectAccess::ReadWrite => {
                let path = p.host_path.join(PROJECT_FILE);
                if path.exists() {
                    tracing::warn!(
                        "{} is ignored: the project is mounted read-write, so code in the sandbox could rewrite it; declare the commands in the configuration instead",
                        path.display()
                    );
                }
                None
            }
            Some(p) => Some(p.host_path.join(PROJECT_FILE)),
            None => None,
        };
        let (ttl, ask_timeout) = match setup.confirm_ttl {
            Some(d) => (d.min(confirm::TOKEN_TTL), d.min(confirm::ASK_TIMEOUT)),
            None => (confirm::TOKEN_TTL, confirm::ASK_TIMEOUT),
        };
        let commands = Commands {
            config,
            project_file,
            envs: setup.envs,
            ceilings: setup.ceilings,
            grants: setup.grants,
            project: setup.project.cloned(),
            current: RwLock::new(Arc::new(Catalog::default())),
            loaded_text: Mutex::new(None),
            tokens: confirm::Tokens::new(ttl),
            ask_timeout,
        };
        let from_project = match commands.read_project() {
            Ok(c) => c,
            Err(mut e) if project_file_strict => {
                errors.append(&mut e);
                Vec::new()
            }
            Err(problems) => {
                withdrawn(&problems);
                Vec::new()
            }
        };
        match commands.catalog_of(from_project) {
            Ok(catalog) => *commands.current.write().recover() = Arc::new(catalog),
            Err(mut e) if project_file_strict => errors.append(&mut e),
            Err(problems) => {
                withdrawn(&problems);
                let config_only = commands.catalog_of(Vec::new()).unwrap_or_default();
                *commands.current.write().recover() = Arc::new(config_only);
            }
        }
        if errors.is_empty() {
            Ok(commands)
        } else {
            Err(LoadError(errors))
        }
    }

    /// The commands offered now.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.current.read().recover().clone()
    }

    /// The project file on the host, when the server reads one.
    pub fn project_file(&self) -> Option<&Path> {
        self.project_file.as_deref()
    }

    pub fn project(&self) -> Option<&ProjectMount> {
        self.project.as_ref()
    }

    /// Reads the project file again. Returns whether its text changed (and
    /// so the catalog was rebuilt). A file that no longer validates
    /// withdraws every command it declared: the problems are logged.
    pub fn reload(&self) -> bool {
        let catalog = match self.read_project_changed() {
            Err(problems) => {
                withdrawn(&problems);
                self.catalog_of(Vec::new())
            }
            Ok(None) => return false,
            Ok(Some(commands)) => self.catalog_of(commands),
        };
        let catalog = catalog.unwrap_or_else(|problems| {
            for p in &problems {
                tracing::error!("{p}");
            }
            self.catalog_of(Vec::new()).unwrap_or_default()
        });
        *self.current.write().recover() = Arc::new(catalog);
        true
    }

    /// The project file's commands; `Ok(None)` when its text is what was
    /// loaded last.
    fn read_project_changed(&self) -> Result<Option<Vec<Arc<Command>>>, Vec<Diagnostic>> {
        let Some(path) = &self.project_file else {
            return Ok(None);
        };
        let text = declaration::read_project_file(path).map_err(|d| vec![d])?;
        let hash = text.as_ref().map(|t| Sha256::digest(t.as_bytes()).into());
        {
            let mut loaded = self.loaded_text.lock().recover();
            if *loaded == hash {
                return Ok(None);
            }
            *loaded = hash;
        }
        let Some(text) = text else {
            return Ok(Some(Vec::new()));
        };
        let decls = declaration::parse_project_file(&text, path).map_err(|d| vec![d])?;
        let source = Source {
            file: path.clone(),
            text,
        };
        let ctx = Context {
            envs: &self.envs,
            project: self.project.as_ref(),
        };
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for (name, decl) in &decls {
            let trusted = |checked| {
                let least = trust::Ceiling::least();
                let ceiling = self.ceilings.get(&decl.env).unwrap_or(&least);
                trust::check(name, decl, ceiling, self.grants.get(name), &source).map(|()| checked)
            };
            match declaration::validate(name, decl, &source, ctx).and_then(trusted) {
                Ok(checked) => {
                    log_warnings(&checked.warnings);
                    out.push(Arc::new(checked.command));
                }
                Err(d) => errors.push(d),
            }
        }
        if errors.is_empty() {
            Ok(Some(out))
        } else {
            Err(errors)
        }
    }

    fn read_project(&self) -> Result<Vec<Arc<Command>>, Vec<Diagnostic>> {
        self.read_project_changed().map(Option::unwrap_or_default)
    }

    /// The offered commands: the configuration's and then the project's
    /// (a project command cannot replace one of the configuration), under
    /// tool names that clash with nothing.
    fn catalog_of(&self, from_project: Vec<Arc<Command>>) -> Result<Catalog, Vec<Diagnostic>> {
        let mut offered: Vec<Offered> = Vec::new();
        let mut errors = Vec::new();
        for command in self.config.iter().cloned().chain(from_project) {
            if self
                .config
                .iter()
                .any(|c| c.name == command.name && !Arc::ptr_eq(c, &command))
            {
                tracing::warn!(
                    "{}: command {} is also declared in the configuration, which wins; rename one of them",
                    command.file.display(),
                    command.name
                );
                continue;
            }
            if !command.enabled {
                continue;
            }
            let tool = if RESERVED_TOOL_NAMES.contains(&command.name.as_str()) {
                format!("cmd_{}", command.name)
            } else {
                command.name.clone()
            };
            if let Some(other) = offered.iter().find(|o| o.tool == tool) {
                errors.push(Diagnostic {
                    file: command.file.clone(),
                    line: None,
                    key: format!("commands.{}", command.name),
                    message: format!(
                        "its tool name {tool} is taken by command {} ({})",
                        other.command.name,
                        other.command.file.display()
                    ),
                    fix: "rename one of them".to_string(),
                });
                continue;
            }
            offered.push(Offered { tool, command });
        }
        if errors.is_empty() {
            Ok(Catalog { offered })
        } else {
            Err(errors)
        }
    }
}

fn log_warnings(warnings: &[Diagnostic]) {
    for w in warnings {
        tracing::warn!("{w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decls(text: &str) -> BTreeMap<String, CommandDecl> {
        declaration::parse_project_file(text, Path::new("/etc/nsm.toml")).unwrap()
    }

    fn project_with(file: Option<&str>, writable: bool) -> (tempfile::TempDir, ProjectMount) {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = file {
            std::fs::create_dir(dir.path().join(".nix-sandbox-mcp")).unwrap();
            std::fs::write(dir.path().join(PROJECT_FILE), text).unwrap();
        }
        let mount = ProjectMount {
            host_path: dir.path().canonicalize().unwrap(),
            mount_point: "/project".into(),
            access: if writable {
                crate::jail::ProjectAccess::ReadWrite
            } else {
                crate::jail::ProjectAccess::ReadOnly
            },
            overlay: false,
            downgraded: false,
            protected: Vec::new(),
        };
        (dir, mount)
    }

    fn load(config: &str, project: Option<&ProjectMount>) -> Result<Commands, LoadError> {
        Commands::load(Setup {
            declared: &decls(config),
            config_file: None,
            envs: vec!["bash".into()],
            ceilings: BTreeMap::new(),
            grants: BTreeMap::new(),
            project,
            confirm_ttl: None,
        })
    }

    const LS: &str = "[commands.ls]\ndescription = \"List\"\nenv = \"bash\"\nargv = [\"ls\"]\n";

    fn tools(c: &Commands) -> Vec<String> {
        c.catalog().offered.iter().map(|o| o.tool.clone()).collect()
    }

    #[test]
    fn the_configuration_file_declares_commands_with_located_errors() {
        let file = Path::new("/etc/nsm.toml");
        let c = crate::config::parse(&format!("[server]\n{LS}"), file).unwrap();
        assert_eq!(c.commands["ls"].argv, ["ls"]);
        let e = crate::config::parse(&format!("{LS}timeout_ms = 0\n"), file)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/nsm.toml:5") && e.contains("commands.ls.timeout_ms"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let text = format!("[server]\n{}", LS.replace("\"ls\"]", "\"ls\", \"{{x}}\"]"));
        std::fs::write(&path, &text).unwrap();
        let config = crate::config::parse(&text, &path).unwrap();
        let e = Commands::load(Setup {
            declared: &config.commands,
            config_file: Some(&path),
            envs: vec!["bash".into()],
            ceilings: BTreeMap::new(),
            grants: BTreeMap::new(),
            project: None,
            confirm_ttl: None,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("config.toml:5: key `commands.ls.argv`"), "{e}");
    }

    #[test]
    fn reserved_names_get_a_prefix_and_clashes_are_errors() {
        let run = LS.replace("commands.ls", "commands.run");
        let c = load(&format!("{LS}{run}"), None).unwrap();
        assert_eq!(tools(&c), ["ls", "cmd_run"]);
        let clash = LS.replace("commands.ls", "commands.cmd_run");
        let e = load(&format!("{run}{clash}"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tool name cmd_run is taken"), "{e}");
    }

    #[test]
    fn disabled_commands_are_not_offered() {
        let c = load(&LS.replace("argv", "disabled = true\nargv"), None).unwrap();
        assert!(c.catalog().is_empty());
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let bad = "[commands.a]\ndescription = \"\"\nenv = \"bash\"\nargv = [\"ls\"]\n[commands.b]\ndescription = \"x\"\nenv = \"nope\"\nargv = [\"ls\"]\n";
        let e = load(bad, None).unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
    }

    #[test]
    fn the_project_file_adds_commands_and_reloads_when_its_text_changes() {
        let (dir, project) =
            project_with(Some(&LS.replace("commands.ls", "commands.build")), false);
        let c = load(LS, Some(&project)).unwrap();
        assert_eq!(tools(&c), ["ls", "build"]);
        assert!(!c.reload(), "unchanged text is not a change");
        std::fs::write(
            dir.path().join(PROJECT_FILE),
            LS.replace("commands.ls", "commands.lint"),
        )
        .unwrap();
        assert!(c.reload());
        assert_eq!(tools(&c), ["ls", "lint"]);
        // A broken file withdraws its commands; the configuration's stay.
        std::fs::write(dir.path().join(PROJECT_FILE), "[commands.x]\nargv = 5\n").unwrap();
        assert!(c.reload());
        assert_eq!(tools(&c), ["ls"]);
        std::fs::remove_file(dir.path().join(PROJECT_FILE)).unwrap();
        assert!(c.reload());
        assert_eq!(tools(&c), ["ls"]);
    }

    #[test]
    fn the_configuration_wins_over_the_project_file() {
        let (_dir, project) = project_with(Some(&LS.replace("\"List\"", "\"Other\"")), false);
        let c = load(LS, Some(&project)).unwrap();
        assert_eq!(tools(&c), ["ls"]);
        assert_eq!(c.catalog().offered[0].command.description, "List");
    }

    #[test]
    fn a_writable_project_s_file_is_not_read() {
        let (_dir, project) = project_with(Some(LS), true);
        let c = load("", Some(&project)).unwrap();
        assert!(c.catalog().is_empty());
        assert!(c.project_file().is_none());
    }

    #[test]
    fn an_invalid_project_file_stops_start_up_with_its_location() {
        let (_dir, project) = project_with(
            Some("[commands.x]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"ls\", \"{{y}}\"]\n"),
            false,
        );
        let e = load("", Some(&project)).unwrap_err().to_string();
        assert!(
            e.contains(".nix-sandbox-mcp/commands.toml:4: key `commands.x.argv`"),
            "{e}"
        );
    }
}
