//! Which project the server works on, and switching it. A configured project
//! (`PROJECT_DIR`, `[project] path`) is fixed. Otherwise the project is the
//! server's working directory until the client, if it declares the roots
//! capability, names its roots: then it is the first `file://` root, read
//! again on `notifications/roots/list_changed`. A switch carries everything
//! that depends on the project: the mount, the caches, the declared
//! commands and the project file's watcher, the sandboxes kept ready, the
//! open sessions (closed, with the reason), the `project` environment of
//! `[project] use_flake`, and the tools' descriptions.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::service::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use super::SandboxServer;
use crate::app::{self, ProjectOrigin};
use crate::commands::Commands;
use crate::jail::ProjectMount;
use crate::sync::Recover;

/// How long the client may take to list its roots; calls that arrive
/// meanwhile wait for the answer (at most this long).
pub const ROOTS_WAIT: Duration = Duration::from_secs(5);

/// The project and what is read from it, replaced as a whole on a switch.
pub struct ProjectState {
    pub mount: Option<ProjectMount>,
    /// The declared commands (the project file's among them).
    pub commands: Arc<Commands>,
    /// The client's root the project was chosen from; `None` for the
    /// configured project or the working directory.
    pub root: Option<PathBuf>,
    /// The client's other `file://` roots: named in the `run` tool's
    /// description, not mounted.
    pub other_roots: Vec<String>,
    /// Why no project is mounted, when none is (said in the description).
    pub unmounted: Option<String>,
    /// Stops the watcher of this state's project file.
    pub watching: CancellationToken,
}

impl ProjectState {
    /// `note`: why there is no project, when there is none.
    pub fn new(
        mount: Option<ProjectMount>,
        note: Option<String>,
        commands: Arc<Commands>,
    ) -> ProjectState {
        ProjectState {
            unmounted: note.filter(|_| mount.is_none()),
            mount,
            commands,
            root: None,
            other_roots: Vec::new(),
            watching: CancellationToken::new(),
        }
    }
}

/// The client's roots as the server reads them: the first `file://` root
/// is the project, the other `file://` roots are listed; anything else is
/// skipped with a warning.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Roots {
    pub first: Option<PathBuf>,
    pub others: Vec<String>,
}

/// Reads the roots' URIs (in the client's order).
pub fn read_roots<'a>(uris: impl IntoIterator<Item = &'a str>) -> Roots {
    let mut roots = Roots::default();
    for uri in uris {
        match file_uri_path(uri) {
            Some(path) if roots.first.is_none() => roots.first = Some(path),
            Some(path) => roots.others.push(path.display().to_string()),
            None => tracing::warn!("client root {uri:?} skipped: not a local file:// URI"),
        }
    }
    roots
}

/// The local path of a `file://` URI (RFC 8089: an empty or `localhost`
/// authority, an absolute path, percent-escapes decoded); `None` for
/// anything else, and for a path holding a NUL byte.
pub fn file_uri_path(uri: &str) -> Option<PathBuf> {
    let rest = uri
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("file://"))
        .map(|_| &uri[7..])?;
    let path = match rest.find('/') {
        Some(0) => rest,
        Some(at) if rest[..at].eq_ignore_ascii_case("localhost") => &rest[at..],
        _ => return None,
    };
    // A query or fragment is not part of the path.
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let bytes = super::uri::percent_decode(path)?;
    if bytes.contains(&0) {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&bytes)))
}

/// Asks the client for its roots. MCP roots are deprecated in rmcp (SEP-2577),
/// but they are what clients send today.
#[allow(deprecated)]
async fn list_roots(peer: &Peer<RoleServer>) -> Result<Roots, rmcp::ServiceError> {
    let listed = peer.list_roots().await?;
    Ok(read_roots(listed.roots.iter().map(|r| r.uri.as_str())))
}

impl SandboxServer {
    /// Whether calls must wait for the client's roots before they run: the
    /// project is not configured and the client declared roots.
    pub(super) fn follows_roots(&self, peer: &Peer<RoleServer>) -> bool {
        !self.remote
            && !self.shared.config.project.path_is_explicit
            && peer
                .peer_info()
                .is_some_and(|i| i.capabilities.roots.is_some())
    }

    /// Waits until the client's roots have been read once (or the wait
    /// ran out), when the project follows them.
    pub(super) async fn roots_read(&self, peer: &Peer<RoleServer>) {
        if !self.follows_roots(peer) {
            return;
        }
        let mut read = self.roots_read.subscribe();
        let _ = tokio::time::timeout(ROOTS_WAIT, read.wait_for(|done| *done)).await;
    }

    /// Asks the client for its roots and makes the project follow them.
    pub(super) async fn follow_roots(&self, peer: &Peer<RoleServer>) {
        if self.follows_roots(peer) {
            // One switch at a time, in the order the client asked.
            let _switching = self.switching.lock().await;
            match tokio::time::timeout(ROOTS_WAIT, list_roots(peer)).await {
                Ok(Ok(roots)) => self.switch_to(roots).await,
                Ok(Err(e)) => tracing::warn!("the client did not list its roots: {e}"),
                Err(_) => tracing::warn!(
                    "the client did not list its roots within {} s; the project stays as it is",
                    ROOTS_WAIT.as_secs()
                ),
            }
        }
        self.roots_read.send_replace(true);
    }

    /// Makes the project the first of `roots` (or, without one, the working
    /// directory again); with the same project, only the list of other
    /// roots changes.
    async fn switch_to(&self, roots: Roots) {
        let current = self.shared.project_state();
        if current.root == roots.first {
            if current.other_roots != roots.others {
                let state = ProjectState {
                    mount: current.mount.clone(),
                    commands: current.commands.clone(),
                    root: current.root.clone(),
                    other_roots: roots.others,
                    unmounted: current.unmounted.clone(),
                    watching: current.watching.clone(),
                };
                *self.shared.project.write().recover() = Arc::new(state);
                // Only the run tool's description changes.
                self.make_tools(&self.shared.registry());
                self.tell_tools_changed();
            }
            return;
        }
        let config = &self.shared.config;
        let chosen = match &roots.first {
            Some(path) => app::project_at(config, path, ProjectOrigin::ClientRoot),
            None => app::resolve_project(config),
        };
        let (mut mount, mut note) = chosen.unwrap_or_else(|e| (None, Some(e.to_string())));
        let executor = self.shared.executor.clone();
        if let Some(mut m) = mount.take() {
            let settled = tokio::task::spawn_blocking(move || {
                let note = app::settle_project(&executor, &mut m);
                (m, note)
            })
            .await;
            match settled {
                Ok((m, n)) => (mount, note) = (Some(m), n),
                Err(e) => note = Some(format!("no project mounted: {e}")),
            }
        }
        let shown = match &mount {
            Some(m) => m.host_path.display().to_string(),
            None => "none".to_string(),
        };
        match &note {
            Some(note) => tracing::warn!("the project follows the client's roots: {note}"),
            None => tracing::info!("the project follows the client's roots: {shown}"),
        }
        self.shared.executor.keep_caches(mount.as_ref());
        self.shared.executor.forget_ready().await;
        self.shared
            .sessions
            .change_project(
                mount.clone(),
                &format!("the project changed to {shown} (the client's roots changed)"),
            )
            .await;
        let registry = self.shared.registry();
        let commands = app::commands_for_new_project(config, &registry, mount.as_ref())
            .unwrap_or_else(|e| {
                tracing::error!("{e}\nthe declared commands are withdrawn for this project");
                Commands::none()
            });
        let state = ProjectState {
            unmounted: note.filter(|_| mount.is_none()),
            mount,
            commands: Arc::new(commands),
            root: roots.first,
            other_roots: roots.others,
            watching: self.shared.shutdown.child_token(),
        };
        let earlier =
            std::mem::replace(&mut *self.shared.project.write().recover(), Arc::new(state));
        earlier.watching.cancel();
        self.watch_project_file();
        if config.project.use_flake {
            self.rebuild_for_project();
        }
        // Every recipe changed with the project: keep sandboxes ready anew.
        self.offer(&self.shared.registry(), None);
        self.tell_tools_changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_become_paths() {
        let p = |u: &str| file_uri_path(u).map(|p| p.display().to_string());
        assert_eq!(p("file:///home/u/app").as_deref(), Some("/home/u/app"));
        assert_eq!(p("FILE:///srv/x/").as_deref(), Some("/srv/x/"));
        assert_eq!(p("file://localhost/srv/x").as_deref(), Some("/srv/x"));
        assert_eq!(
            p("file:///home/u/my%20app/%C3%A9t%C3%A9").as_deref(),
            Some("/home/u/my app/été")
        );
        assert_eq!(p("file:///a/b?x=1#frag").as_deref(), Some("/a/b"));
    }

    #[test]
    fn other_uris_are_not_paths() {
        for uri in [
            "https://example.com/x",
            "file://host/share/x",
            "file:relative",
            "file://",
            "file:///a%2",
            "file:///a%zz",
            "file:///a%00b",
            "/plain/path",
        ] {
            assert_eq!(file_uri_path(uri), None, "{uri}");
        }
    }

    #[test]
    fn the_first_file_root_is_the_project_and_the_others_are_listed() {
        let roots = read_roots([
            "https://example.com/repo",
            "file:///work/app",
            "file:///work/lib",
            "file://server/share",
            "file:///work/docs",
        ]);
        assert_eq!(roots.first, Some(PathBuf::from("/work/app")));
        assert_eq!(roots.others, ["/work/lib", "/work/docs"]);
        assert_eq!(read_roots([]), Roots::default());
    }
}
