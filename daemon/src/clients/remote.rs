//! The same, for a server the client reaches over Streamable HTTP
//! (`serve --http`): its URL and a bearer token, which the text names
//! through a variable or a prompt wherever the client offers one, never
//! written into it. Each form follows the client's documentation, cited at
//! its renderer.

use std::collections::BTreeMap;

use serde_json::json;

use super::{Client, shell_quote};

/// The variable that holds the token, unless told otherwise.
pub const DEFAULT_TOKEN_VAR: &str = "NIX_SANDBOX_MCP_TOKEN";

/// A server over HTTP, as a client is to reach it.
#[derive(Debug, Clone)]
pub struct Remote {
    pub name: String,
    /// The endpoint, such as `https://sandbox.example.com/mcp`.
    pub url: String,
    /// The environment variable that holds the token.
    pub token_var: String,
}

impl Client {
    /// Where the text goes, in one sentence.
    pub fn remote_destination(self, r: &Remote) -> String {
        let var = &r.token_var;
        match self {
            Client::ClaudeCode => format!(
                "Run this where {var} holds the token (the shell puts it into Claude Code's configuration); add `--scope user` or `--scope project` before the name to choose where it is kept."
            ),
            Client::ClaudeDesktop => "Claude Desktop takes a remote server only in Settings → Connectors, and authenticates to it only with OAuth: serve with [http.oauth], and add the URL there.".to_string(),
            Client::Cursor => format!(
                "Merge into `.cursor/mcp.json` or `~/.cursor/mcp.json`; Cursor reads the token from {var} in its environment."
            ),
            Client::Vscode => "Merge into `.vscode/mcp.json` or the user `mcp.json`; VS Code asks for the token once and keeps it in its secret storage.".to_string(),
            Client::Codex => format!(
                "Add to `~/.codex/config.toml`; Codex sends the token it finds in {var}."
            ),
            Client::Zed => "Merge into Zed's `settings.json`, replacing YOUR_TOKEN with the token (Zed does not expand variables in headers; keep the file private).".to_string(),
        }
    }

    /// The configuration text, ending in a newline; `None` for a client
    /// whose file cannot name a remote server (see [`Self::remote_destination`]).
    pub fn render_remote(self, r: &Remote) -> Option<String> {
        Some(match self {
            Client::ClaudeCode => claude_code(r),
            Client::ClaudeDesktop => return None,
            Client::Cursor => cursor(r),
            Client::Vscode => vscode(r),
            Client::Codex => codex(r),
            Client::Zed => zed(r),
        })
    }
}

/// Claude Code: `claude mcp add --transport http NAME URL --header "…"`,
/// the header after the URL (it takes several values)
/// (https://code.claude.com/docs/en/mcp, "Option 1: Add a remote HTTP server").
fn claude_code(r: &Remote) -> String {
    format!(
        "claude mcp add --transport http {} {} --header \"Authorization: Bearer ${}\"\n",
        shell_quote(&r.name),
        shell_quote(&r.url),
        r.token_var
    )
}

/// Cursor's `mcp.json`: `url` and `headers`, `${env:NAME}` resolved in
/// them (https://cursor.com/docs/mcp).
fn cursor(r: &Remote) -> String {
    let server = json!({"url": r.url, "headers": {"Authorization": format!("Bearer ${{env:{}}}", r.token_var)}});
    pretty(&json!({"mcpServers": {r.name.as_str(): server}}))
}

/// VS Code's `mcp.json`: `"type": "http"`, `url`, `headers`, the token from
/// a `promptString` input with `password: true`, asked once and kept in
/// its secret storage
/// (https://code.visualstudio.com/docs/copilot/reference/mcp-configuration).
fn vscode(r: &Remote) -> String {
    let input = format!("{}-token", r.name);
    let server = json!({"type": "http", "url": r.url, "headers": {"Authorization": format!("Bearer ${{input:{input}}}")}});
    pretty(&json!({
        "inputs": [{"type": "promptString", "id": input, "description": format!("Bearer token of {}", r.url), "password": true}],
        "servers": {r.name.as_str(): server},
    }))
}

/// Codex CLI's `config.toml`: `url` and `bearer_token_env_var`
/// (https://developers.openai.com/codex/mcp; openai/codex
/// codex-rs/config/src/mcp_types.rs).
fn codex(r: &Remote) -> String {
    let server = BTreeMap::from([
        ("url", r.url.as_str()),
        ("bearer_token_env_var", r.token_var.as_str()),
    ]);
    let file = BTreeMap::from([("mcp_servers", BTreeMap::from([(r.name.as_str(), server)]))]);
    toml::to_string(&file).unwrap_or_default()
}

/// Zed's `settings.json`: a context server with `url` and `headers`
/// (https://zed.dev/docs/ai/mcp; zed crates/settings_content, the Http
/// context server settings).
fn zed(r: &Remote) -> String {
    let server = json!({"url": r.url, "headers": {"Authorization": "Bearer YOUR_TOKEN"}});
    pretty(&json!({"context_servers": {r.name.as_str(): server}}))
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

/// Every client's configuration as a Markdown section, as
/// [`super::markdown`] does for stdio.
pub fn markdown(r: &Remote) -> String {
    Client::ALL
        .iter()
        .map(|c| match c.render_remote(r) {
            Some(text) => format!(
                "**{}**. {}\n\n```{}\n{}```\n",
                c.title(),
                c.remote_destination(r),
                c.language(),
                text
            ),
            None => format!("**{}**. {}\n", c.title(), c.remote_destination(r)),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Remote {
        Remote {
            name: "sandbox".into(),
            url: "https://sandbox.example.com:8443/mcp".into(),
            token_var: DEFAULT_TOKEN_VAR.into(),
        }
    }

    fn json_of(c: Client) -> serde_json::Value {
        serde_json::from_str(&c.render_remote(&remote()).unwrap()).unwrap()
    }

    #[test]
    fn each_form_names_the_url_and_the_token_never_written_in_but_zeds() {
        let url = "https://sandbox.example.com:8443/mcp";
        let cursor = &json_of(Client::Cursor)["mcpServers"]["sandbox"];
        assert_eq!(cursor["url"], url);
        assert_eq!(
            cursor["headers"]["Authorization"],
            "Bearer ${env:NIX_SANDBOX_MCP_TOKEN}"
        );
        let vscode = json_of(Client::Vscode);
        assert_eq!(vscode["servers"]["sandbox"]["type"], "http");
        assert_eq!(
            vscode["servers"]["sandbox"]["headers"]["Authorization"],
            "Bearer ${input:sandbox-token}"
        );
        assert_eq!(vscode["inputs"][0]["id"], "sandbox-token");
        assert_eq!(vscode["inputs"][0]["password"], true);
        let zed = &json_of(Client::Zed)["context_servers"]["sandbox"];
        assert_eq!(
            (
                zed["url"].as_str(),
                zed["headers"]["Authorization"].as_str()
            ),
            (Some(url), Some("Bearer YOUR_TOKEN"))
        );
        let codex: toml::Table =
            toml::from_str(&Client::Codex.render_remote(&remote()).unwrap()).unwrap();
        let codex = codex["mcp_servers"]["sandbox"].as_table().unwrap();
        assert_eq!(codex["url"].as_str(), Some(url));
        assert_eq!(
            codex["bearer_token_env_var"].as_str(),
            Some("NIX_SANDBOX_MCP_TOKEN")
        );
        assert!(Client::ClaudeDesktop.render_remote(&remote()).is_none());
        assert!(
            Client::ClaudeDesktop
                .remote_destination(&remote())
                .contains("Connectors")
        );
    }

    #[test]
    fn the_claude_code_line_expands_the_token_from_the_environment() {
        let line = Client::ClaudeCode.render_remote(&remote()).unwrap();
        assert_eq!(
            line,
            "claude mcp add --transport http sandbox https://sandbox.example.com:8443/mcp --header \"Authorization: Bearer $NIX_SANDBOX_MCP_TOKEN\"\n"
        );
        let words =
            crate::clients::tests::shell_words(&line, &[("NIX_SANDBOX_MCP_TOKEN", "nsm_secret")]);
        assert_eq!(
            words[3..],
            [
                "--transport",
                "http",
                "sandbox",
                "https://sandbox.example.com:8443/mcp",
                "--header",
                "Authorization: Bearer nsm_secret"
            ]
        );
    }
}
