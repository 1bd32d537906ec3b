//! MCP client configuration: for each client, the ready-to-paste text that
//! makes it start this server over stdio, in the client's own format, and
//! where that text goes; `remote.rs` the same for a server reached over
//! HTTP. Each form follows the client's documentation, cited at its
//! renderer. Pure: a [`Launch`] (or a [`remote::Remote`]) in, text out.

pub mod remote;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

/// The clients `client-config` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    ClaudeCode,
    ClaudeDesktop,
    Cursor,
    Vscode,
    Codex,
    Zed,
}

/// How a client is to start the server.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The server's name in the client's configuration.
    pub name: String,
    /// The binary, as an absolute path.
    pub command: PathBuf,
    /// Its arguments, `--stdio` last.
    pub args: Vec<String>,
    /// Variables to set, such as `PROJECT_DIR`.
    pub env: BTreeMap<String, String>,
}

impl Launch {
    pub fn new(
        name: &str,
        command: PathBuf,
        config: Option<PathBuf>,
        project_dir: Option<PathBuf>,
    ) -> Launch {
        let mut args = Vec::new();
        if let Some(c) = config {
            args.extend(["--config".to_string(), c.display().to_string()]);
        }
        args.push("--stdio".to_string());
        let env = project_dir
            .map(|d| ("PROJECT_DIR".to_string(), d.display().to_string()))
            .into_iter()
            .collect();
        Launch {
            name: name.to_string(),
            command,
            args,
            env,
        }
    }

    fn command(&self) -> String {
        self.command.display().to_string()
    }
}

/// What a server name may be: safe in every client's format and on a
/// command line.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Client {
    pub const ALL: [Client; 6] = [
        Client::ClaudeCode,
        Client::ClaudeDesktop,
        Client::Cursor,
        Client::Vscode,
        Client::Codex,
        Client::Zed,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Client::ClaudeCode => "Claude Code",
            Client::ClaudeDesktop => "Claude Desktop",
            Client::Cursor => "Cursor",
            Client::Vscode => "VS Code",
            Client::Codex => "Codex CLI",
            Client::Zed => "Zed",
        }
    }

    /// Where the text goes, in one sentence.
    pub fn destination(self) -> &'static str {
        match self {
            Client::ClaudeCode => {
                "Run this in the project's directory (Claude Code starts the server there); add `--scope user` before the name to have it in every project, or `--scope project` to share it in the project's `.mcp.json`."
            }
            Client::ClaudeDesktop => {
                "Merge into `claude_desktop_config.json` (Settings → Developer → Edit Config). Claude Desktop has no project directory: pass `--project-dir DIR` to `client-config`."
            }
            Client::Cursor => {
                "Merge into `.cursor/mcp.json` in the project, or `~/.cursor/mcp.json` for every project."
            }
            Client::Vscode => {
                "Merge into `.vscode/mcp.json` in the workspace (the project is the workspace folder), or the user `mcp.json` (MCP: Open User Configuration)."
            }
            Client::Codex => {
                "Add to `~/.codex/config.toml`, or `.codex/config.toml` in a trusted project."
            }
            Client::Zed => "Merge into Zed's `settings.json` (zed: open settings).",
        }
    }

    /// The language of the text, for a Markdown code fence.
    pub fn language(self) -> &'static str {
        match self {
            Client::ClaudeCode => "sh",
            Client::Codex => "toml",
            _ => "json",
        }
    }

    /// The configuration text, ending in a newline.
    pub fn render(self, l: &Launch) -> String {
        match self {
            Client::ClaudeCode => claude_code(l),
            Client::ClaudeDesktop | Client::Cursor => mcp_servers_json(l),
            Client::Vscode => vscode(l),
            Client::Codex => codex(l),
            Client::Zed => zed(l),
        }
    }
}

/// Claude Code, `claude mcp add [options] NAME -- COMMAND [ARGS...]`, options
/// (`--env KEY=value`, `--scope`) before the name
/// (https://code.claude.com/docs/en/mcp, "Option 3: Add a local stdio server").
fn claude_code(l: &Launch) -> String {
    let mut words = vec!["claude".to_string(), "mcp".into(), "add".into()];
    for (k, v) in &l.env {
        words.push("--env".into());
        words.push(shell_quote(&format!("{k}={v}")));
    }
    words.push(shell_quote(&l.name));
    words.push("--".into());
    words.push(shell_quote(&l.command()));
    words.extend(l.args.iter().map(|a| shell_quote(a)));
    words.join(" ") + "\n"
}

/// One stdio server as the JSON and TOML forms write it, keys in the
/// documentation's order.
#[derive(Serialize)]
struct Server<'a> {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    command: String,
    args: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<String, String>,
}

impl<'a> Server<'a> {
    fn of(l: &'a Launch) -> Server<'a> {
        Server {
            kind: None,
            command: l.command(),
            args: &l.args,
            env: l.env.clone(),
        }
    }
}

/// `{TOP: {NAME: server}}`, as JSON.
fn json_file(top: &str, l: &Launch, server: Server) -> String {
    let file = BTreeMap::from([(top, BTreeMap::from([(l.name.as_str(), server)]))]);
    serde_json::to_string_pretty(&file).unwrap_or_default() + "\n"
}

/// Claude Desktop's `claude_desktop_config.json`
/// (https://modelcontextprotocol.io/quickstart/user) and Cursor's
/// `mcp.json` (https://cursor.com/docs/mcp): `{"mcpServers": {NAME:
/// {"command", "args", "env"}}}`.
fn mcp_servers_json(l: &Launch) -> String {
    json_file("mcpServers", l, Server::of(l))
}

/// VS Code's `mcp.json`: top-level `servers`, each stdio server with
/// `"type": "stdio"`, `command`, `args`, `env`; `${workspaceFolder}` is
/// substituted in values
/// (https://code.visualstudio.com/docs/copilot/reference/mcp-configuration).
/// Without a project directory the workspace folder is the project.
fn vscode(l: &Launch) -> String {
    let mut server = Server {
        kind: Some("stdio"),
        ..Server::of(l)
    };
    server
        .env
        .entry("PROJECT_DIR".to_string())
        .or_insert_with(|| "${workspaceFolder}".to_string());
    json_file("servers", l, server)
}

/// Codex CLI's `config.toml`: a `[mcp_servers.NAME]` table with `command`,
/// `args` and `env` (https://developers.openai.com/codex/mcp; openai/codex
/// docs/config.md, "mcp_servers").
fn codex(l: &Launch) -> String {
    let file = BTreeMap::from([(
        "mcp_servers",
        BTreeMap::from([(l.name.as_str(), Server::of(l))]),
    )]);
    toml::to_string(&file).unwrap_or_default()
}

/// Zed's `settings.json`: `context_servers`, each custom server with
/// `command`, `args`, `env` (https://zed.dev/docs/ai/mcp, "As Custom
/// Servers").
fn zed(l: &Launch) -> String {
    json_file("context_servers", l, Server::of(l))
}

/// `s` as one word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Every client's configuration as a Markdown section: a heading, where it
/// goes, and the text in a fenced block. The README's "Connect a client"
/// section is this, for [`README_COMMAND`].
pub fn markdown(l: &Launch) -> String {
    Client::ALL
        .iter()
        .map(|c| {
            format!(
                "**{}**. {}\n\n```{}\n{}```\n",
                c.title(),
                c.destination(),
                c.language(),
                c.render(l)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The binary's path in the README's examples (where `cargo install` puts it
/// for a user `me`); `client-config` prints the real one.
pub const README_COMMAND: &str = "/home/me/.cargo/bin/nix-sandbox-mcp";

/// The server name used when none is given.
pub const DEFAULT_NAME: &str = "sandbox";

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// The words a POSIX shell makes of `line`, with `vars` set.
    pub(crate) fn shell_words(line: &str, vars: &[(&str, &str)]) -> Vec<String> {
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("set -- {}; printf '%s\\n' \"$@\"", line.trim()))
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }

    fn launch(project: Option<&str>, config: Option<&str>) -> Launch {
        Launch::new(
            "sandbox",
            PathBuf::from("/opt/nsm dir/bin/nix-sandbox-mcp"),
            config.map(PathBuf::from),
            project.map(PathBuf::from),
        )
    }

    fn json_of(c: Client, l: &Launch) -> serde_json::Value {
        serde_json::from_str(&c.render(l)).unwrap()
    }

    #[test]
    fn the_json_forms_have_each_clients_keys() {
        let l = launch(Some("/src/app"), Some("/etc/nsm.toml"));
        let args = json!(["--config", "/etc/nsm.toml", "--stdio"]);
        for (client, top) in [
            (Client::ClaudeDesktop, "mcpServers"),
            (Client::Cursor, "mcpServers"),
            (Client::Zed, "context_servers"),
            (Client::Vscode, "servers"),
        ] {
            let v = json_of(client, &l);
            let root = v.as_object().unwrap();
            assert_eq!(root.keys().collect::<Vec<_>>(), [top], "{client:?}");
            let server = &v[top]["sandbox"];
            assert_eq!(server["command"], "/opt/nsm dir/bin/nix-sandbox-mcp");
            assert_eq!(server["args"], args);
            assert_eq!(server["env"], json!({"PROJECT_DIR": "/src/app"}));
        }
        assert_eq!(
            json_of(Client::Vscode, &l)["servers"]["sandbox"]["type"],
            "stdio"
        );
        assert!(
            json_of(Client::Cursor, &l)["mcpServers"]["sandbox"]
                .get("type")
                .is_none()
        );
    }

    #[test]
    fn without_a_project_only_vscode_names_one_its_workspace() {
        let l = launch(None, None);
        assert!(
            json_of(Client::Cursor, &l)["mcpServers"]["sandbox"]
                .get("env")
                .is_none()
        );
        assert_eq!(
            json_of(Client::Vscode, &l)["servers"]["sandbox"]["env"],
            json!({"PROJECT_DIR": "${workspaceFolder}"})
        );
        assert_eq!(
            json_of(Client::Zed, &l)["context_servers"]["sandbox"]["args"],
            json!(["--stdio"])
        );
    }

    #[test]
    fn the_codex_form_is_an_mcp_servers_table() {
        let l = launch(Some("/src/it's"), None);
        let text = Client::Codex.render(&l);
        assert!(text.starts_with("[mcp_servers.sandbox]\n"), "{text}");
        let v: toml::Table = toml::from_str(&text).unwrap();
        let server = v["mcp_servers"]["sandbox"].as_table().unwrap();
        assert_eq!(
            server["command"].as_str(),
            Some("/opt/nsm dir/bin/nix-sandbox-mcp")
        );
        assert_eq!(server["args"].as_array().unwrap().len(), 1);
        assert_eq!(server["env"]["PROJECT_DIR"].as_str(), Some("/src/it's"));
    }

    #[test]
    fn the_claude_code_line_is_one_shell_command_with_options_before_the_name() {
        let l = launch(Some("/src/it's"), Some("/etc/nsm.toml"));
        assert_eq!(
            Client::ClaudeCode.render(&l),
            "claude mcp add --env 'PROJECT_DIR=/src/it'\\''s' sandbox -- '/opt/nsm dir/bin/nix-sandbox-mcp' --config /etc/nsm.toml --stdio\n"
        );
        // Read back by a shell, the words are the launch's.
        let words = shell_words(&Client::ClaudeCode.render(&l), &[]);
        assert_eq!(words[4], "PROJECT_DIR=/src/it's");
        assert_eq!(words[7], "/opt/nsm dir/bin/nix-sandbox-mcp");
    }

    #[test]
    fn names_are_checked() {
        assert!(is_valid_name("sandbox") && is_valid_name("nix-sandbox_2"));
        assert!(!is_valid_name("") && !is_valid_name("a b") && !is_valid_name("a.b"));
    }

    /// The README's "Connect a client" section is generated: this checks
    /// it. `NSM_UPDATE_README=1 cargo test` rewrites it after a change.
    #[test]
    fn the_readme_shows_exactly_what_client_config_prints() {
        const BEGIN: &str =
            "<!-- client-config: generated by `cargo test` (NSM_UPDATE_README=1 rewrites it) -->\n";
        const END: &str = "<!-- client-config: end -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let start = readme
            .find(BEGIN)
            .expect("README lacks the client-config begin marker")
            + BEGIN.len();
        let end = readme[start..]
            .find(END)
            .expect("README lacks the client-config end marker")
            + start;
        let expected = format!(
            "\n{}\n",
            markdown(&Launch::new(
                DEFAULT_NAME,
                PathBuf::from(README_COMMAND),
                None,
                None
            ))
        );
        if std::env::var_os("NSM_UPDATE_README").is_some() {
            let updated = format!("{}{expected}{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        assert!(
            readme[start..end] == expected,
            "README.md's client section is out of date: run `NSM_UPDATE_README=1 cargo test` and commit it"
        );
    }
}
