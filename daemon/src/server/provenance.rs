//! What produced a result, in every tool result: the environment's identity
//! (its name, where it comes from — the interpreter's resolved path on the
//! host, or the Nix artifact's store path — and its description with
//! versions) and the server's name and version, in `structuredContent.ran`
//! and in `_meta` (`nix-sandbox-mcp/ran`). Under 2026-07-28 every result's
//! `_meta` also names the server (`io.modelcontextprotocol/serverInfo`).

use rmcp::model::{CallToolResult, MetaObject};
use serde_json::{Value, json};

use crate::environment::{Environment, Origin};
use crate::registry::Registry;

/// The `_meta` key of what produced a tool result.
pub const RAN_META: &str = "nix-sandbox-mcp/ran";
/// The `_meta` key the 2026-07-28 revision gives the server's identity.
pub const SERVER_INFO_META: &str = "io.modelcontextprotocol/serverInfo";

/// The server's name and version, as `serverInfo` gives them.
pub fn server_info() -> Value {
    json!({"name": "nix-sandbox-mcp", "version": env!("CARGO_PKG_VERSION")})
}

/// What produced a result in `env` (or, before an environment was chosen,
/// only the server).
fn ran(env: Option<&Environment>) -> Value {
    let mut v = json!({"server": format!("nix-sandbox-mcp {}", env!("CARGO_PKG_VERSION"))});
    if let Some(env) = env {
        let (source, path) = match &env.origin {
            Origin::Host { program } => ("host", program),
            Origin::Artifact { path } => ("nix", path),
        };
        v["environment"] = json!(env.name);
        v["source"] = json!(source);
        v["path"] = json!(path.display().to_string());
        v["description"] = json!(env.description);
    }
    v
}

/// Stamps `result` with what produced it: the environment its structured
/// content names (looked up in `registry`), the server; and, for a
/// stateless request, the server's identity in `_meta`.
pub fn stamp(result: &mut CallToolResult, registry: &Registry, stateless: bool) {
    let env = result
        .structured_content
        .as_ref()
        .and_then(|c| c.get("env"))
        .and_then(Value::as_str)
        .and_then(|name| registry.get(name))
        .map(|e| e.as_ref());
    let ran = ran(env);
    if let Some(Value::Object(content)) = result.structured_content.as_mut() {
        content.insert("ran".into(), ran.clone());
    }
    let meta = result.meta.get_or_insert_with(MetaObject::new);
    meta.0.insert(RAN_META.into(), ran);
    if stateless {
        meta.0.insert(SERVER_INFO_META.into(), server_info());
    }
}

/// `meta` with the server's identity, for a stateless request's list result.
pub fn with_server_info(meta: Option<MetaObject>, stateless: bool) -> Option<MetaObject> {
    if !stateless {
        return meta;
    }
    let mut meta = meta.unwrap_or_default();
    meta.0.insert(SERVER_INFO_META.into(), server_info());
    Some(meta)
}
