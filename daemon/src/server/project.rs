//! The project's changes in results and as MCP resources. After a run in an
//! overlay project, the changes are scanned (off the runtime's threads) and
//! the result carries a summary, the patch itself when it is short, and a
//! resource link to the whole patch; a session's calls report the session's
//! changes so far, when they differ from the previous call's. In a
//! read-write project, protected files a run created are named (existing
//! ones were read-only).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::model::{
    ContentBlock, ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
};
use serde_json::{Value, json};

use super::SandboxServer;
use crate::changes::{self, Note, PatchStore, URI_PREFIX};
use crate::jail::{ProjectAccess, ProjectMount};

/// Patches kept for reading, and their total size.
const KEPT_PATCHES: usize = 32;
const KEPT_BYTES: usize = 64 << 20;
const PATCH_MIME: &str = "text/x-diff";

/// The patches and what each session last reported.
#[derive(Debug)]
pub struct Ledger {
    pub patches: PatchStore,
    reported: Mutex<HashMap<String, u64>>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger {
            patches: PatchStore::new(KEPT_PATCHES, KEPT_BYTES),
            reported: Mutex::default(),
        }
    }
}

/// Before a run in a read-write project: its protected paths that do not
/// exist yet (a run that creates one is named in its result).
pub(super) fn absent_protected(project: Option<&ProjectMount>) -> Vec<String> {
    match project {
        Some(p) if p.access == ProjectAccess::ReadWrite => p
            .protected
            .iter()
            .filter(|rel| {
                p.host_path
                    .join(rel.trim_end_matches('/'))
                    .symlink_metadata()
                    .is_err()
            })
            .cloned()
            .collect(),
        _ => Vec::new(),
    }
}

impl SandboxServer {
    /// What a finished run did to `project` (the one it ran with). `session`
    /// is the session's name, and whether this call started it afresh.
    pub(super) async fn project_note(
        &self,
        project: Option<&ProjectMount>,
        upper: Option<Arc<OwnedFd>>,
        absent_before: Vec<String>,
        title: String,
        session: Option<(&str, bool)>,
    ) -> Option<Note> {
        let project = project?;
        let created_protected: Vec<String> = absent_before
            .into_iter()
            .filter(|rel| {
                project
                    .host_path
                    .join(rel.trim_end_matches('/'))
                    .symlink_metadata()
                    .is_ok()
            })
            .collect();
        let report = match (upper, project.access) {
            // Most runs change nothing: no scan, no thread hop.
            (Some(upper), ProjectAccess::Overlay) if changes::untouched(&upper) => None,
            (Some(upper), ProjectAccess::Overlay) => {
                let (host, protected, ledger) = (
                    project.host_path.clone(),
                    project.protected.clone(),
                    self.ledger.clone(),
                );
                let scanned = tokio::task::spawn_blocking(move || {
                    changes::report(&upper, &host, &protected, &ledger.patches, title)
                })
                .await;
                match scanned {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        tracing::warn!("cannot read the run's changes to the project: {e}");
                        None
                    }
                    Err(_) => None,
                }
            }
            _ => None,
        };
        // A session reports its changes when they differ from the last call's.
        let report = match (report, session) {
            (Some(r), Some((name, fresh))) => {
                let mut reported = self
                    .ledger
                    .reported
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let before = reported.insert(name.to_string(), r.digest);
                (fresh || before != Some(r.digest)).then_some(r)
            }
            (r, _) => r,
        };
        if report.is_none() && created_protected.is_empty() {
            return None;
        }
        Some(Note {
            report: report.map(Box::new),
            of_session: session.is_some(),
            created_protected,
        })
    }
}

/// The note as the result's `changes` object.
pub(super) fn to_json(note: &Note) -> Value {
    let mut v = json!({});
    if let Some(r) = &note.report {
        v = json!({
            "added": r.counts.added,
            "modified": r.counts.modified,
            "deleted": r.counts.deleted,
            "bytes": r.counts.bytes,
            "patch_bytes": r.patch_bytes,
            "patch_uri": r.uri,
        });
        if note.of_session {
            v["cumulative"] = json!(true);
        }
        if let Some(p) = &r.patch {
            v["patch"] = json!(p);
        }
        if r.ignored > 0 {
            v["ignored"] = json!(r.ignored);
            v["ignored_paths"] = json!(r.ignored_named);
        }
        if !r.protected.is_empty() {
            v["protected"] = json!(r.protected);
            if r.protected_more {
                v["protected_more"] = json!(true);
            }
        }
        if !r.summarized.is_empty() {
            v["summarized"] = json!(r.summarized);
        }
    }
    if !note.created_protected.is_empty() {
        v["protected_created"] = json!(note.created_protected);
    }
    v
}

/// The note as lines of the result's text.
pub(super) fn to_text(note: &Note) -> String {
    let mut t = String::new();
    if let Some(r) = &note.report {
        let c = r.counts;
        let whose = if note.of_session {
            "the session's changes to the project so far"
        } else {
            "changes to the project"
        };
        t += &format!(
            "{whose} (the user's files are untouched): {} added, {} modified, {} deleted, {}\n",
            c.added,
            c.modified,
            c.deleted,
            human_bytes(c.bytes)
        );
        if r.ignored > 0 {
            let more = if r.ignored > r.ignored_named.len() {
                ", ..."
            } else {
                ""
            };
            t += &format!(
                "left out of the patch as ignored by the project: {}{more}\n",
                r.ignored_named.join(", ")
            );
        }
        if !r.protected.is_empty() {
            let more = if r.protected_more { ", and more" } else { "" };
            let example = super::uri::percent_encode(&r.protected[0]);
            t += &format!(
                "left out of the patch: {}{more} (agent or editor configuration, a repository, or files the host runs, which applying could run code on the user's machine; the user should review them: the resource {}?include={example} adds one by name)\n",
                r.protected.join(", "),
                r.uri
            );
        }
        for s in &r.summarized {
            t += &format!("summarized: {s}\n");
        }
        match &r.patch {
            Some(p) if !p.is_empty() => t += &format!("--- patch ---\n{p}"),
            Some(_) => {}
            None => {
                t += &format!(
                    "patch ({}): read the resource {}\n",
                    human_bytes(r.patch_bytes as u64),
                    r.uri
                )
            }
        }
    }
    if !note.created_protected.is_empty() {
        t += &format!(
            "created in the user's project, which is writable: {} (agent configuration or files the host runs; the user should review them)\n",
            note.created_protected.join(", ")
        );
    }
    t
}

/// A link to the whole patch, for clients that read resources.
pub(super) fn link(note: &Note) -> Option<ContentBlock> {
    let r = note.report.as_ref()?;
    let mut resource = Resource::new(r.uri.clone(), "changes.patch");
    resource.mime_type = Some(PATCH_MIME.to_string());
    resource.size = Some(r.patch_bytes as u64);
    resource.description = Some(
        "The run's changes to the project as a git-style patch (git apply); protected paths are left out unless named with ?include=PATH.".to_string(),
    );
    Some(ContentBlock::resource_link(resource))
}

/// The patches kept, newest first.
pub(super) fn list(ledger: &Ledger) -> ListResourcesResult {
    let resources = ledger
        .patches
        .list()
        .into_iter()
        .map(|p| {
            let mut r = Resource::new(p.uri, p.title);
            r.mime_type = Some(PATCH_MIME.to_string());
            r.size = Some(p.text.len() as u64);
            r
        })
        .collect();
    ListResourcesResult::with_all_items(resources)
}

/// A patch URI's base and the protected paths its query includes
/// (`?include=PATH`, repeated, each percent-encoded).
fn parse_patch_uri(uri: &str) -> Result<(&str, Vec<String>), McpError> {
    let Some((base, query)) = uri.split_once('?') else {
        return Ok((uri, Vec::new()));
    };
    let mut include = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let value = pair
            .strip_prefix("include=")
            .and_then(super::uri::percent_decode)
            .and_then(|v| String::from_utf8(v).ok());
        match value {
            Some(v) => include.push(v),
            None => {
                return Err(McpError::invalid_params(
                    format!(
                        "{uri}: the only query a patch takes is include=PATH (a protected path the result named, percent-encoded), repeated for more"
                    ),
                    None,
                ));
            }
        }
    }
    Ok((base, include))
}

pub(super) fn read(ledger: &Ledger, uri: &str) -> Result<ReadResourceResult, McpError> {
    let (base, include) = parse_patch_uri(uri)?;
    match ledger.patches.get(base) {
        Some(p) => {
            let text = p.with(&include).map_err(|missing| {
                let have: Vec<&str> = p.protected().collect();
                McpError::invalid_params(
                    format!(
                        "{base} has no protected path {missing:?} to include; it has: {}",
                        if have.is_empty() {
                            "none".to_string()
                        } else {
                            have.join(", ")
                        }
                    ),
                    None,
                )
            })?;
            Ok(ReadResourceResult::new(vec![
                ResourceContents::text(text, uri).with_mime_type(PATCH_MIME),
            ]))
        }
        None if base.starts_with(URI_PREFIX) => Err(McpError::resource_not_found(
            format!(
                "{base} is no longer kept (the server keeps the last {KEPT_PATCHES} patches); run the code again to see its changes"
            ),
            None,
        )),
        None => Err(McpError::resource_not_found(
            format!(
                "{uri} is not a resource of this server; its resources are patches, {URI_PREFIX}N"
            ),
            None,
        )),
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}
