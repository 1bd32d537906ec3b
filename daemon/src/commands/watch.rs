//! Notices when the project's declaration file changes on disk, by looking
//! at it once a second (one `lstat`: cheaper than a watcher thread, and it
//! sees the file appear, disappear, be replaced or edited in place), reloads
//! the commands, and reports a change so the server can tell the client.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Commands;
use crate::stamp::Stamp;

/// How often the file is looked at.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Watches the project file of `commands` until `stop`, calling `changed`
/// after each reload that changed the commands. `None` when there is no
/// project file to watch.
pub fn spawn(
    commands: Arc<Commands>,
    changed: impl Fn() + Send + 'static,
    stop: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let path: PathBuf = commands.project_file()?.to_path_buf();
    Some(tokio::spawn(async move {
        // Any change since start-up is found by the reload itself, which
        // compares the text with what was loaded.
        let mut last = None;
        let mut every = tokio::time::interval(INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            let now = Stamp::of_entry(&path).ok();
            if last == Some(now) {
                continue;
            }
            last = Some(now);
            let reloaded = {
                let commands = commands.clone();
                tokio::task::spawn_blocking(move || commands.reload()).await
            };
            if reloaded.unwrap_or(false) {
                tracing::info!("{} changed; the commands were reloaded", path.display());
                changed();
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::{PROJECT_FILE, Setup};
    use crate::jail::ProjectMount;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn an_edit_is_noticed_and_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let project = ProjectMount {
            host_path: dir.path().canonicalize().unwrap(),
            mount_point: "/project".into(),
            access: crate::jail::ProjectAccess::ReadOnly,
            overlay: false,
            downgraded: false,
            protected: Vec::new(),
        };
        let commands = Arc::new(
            Commands::load(Setup {
                declared: &Default::default(),
                config_file: None,
                envs: vec!["bash".into()],
                ceilings: Default::default(),
                grants: Default::default(),
                project: Some(&project),
                confirm_ttl: None,
            })
            .unwrap(),
        );
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        let stop = CancellationToken::new();
        let task = spawn(
            commands.clone(),
            move || {
                seen.fetch_add(1, Ordering::SeqCst);
            },
            stop.clone(),
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(count.load(Ordering::SeqCst), 0);
        std::fs::create_dir(dir.path().join(".nix-sandbox-mcp")).unwrap();
        std::fs::write(
            dir.path().join(PROJECT_FILE),
            "[commands.ls]\ndescription = \"List\"\nenv = \"bash\"\nargv = [\"ls\"]\n",
        )
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while count.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(commands.catalog().offered[0].tool, "ls");
        stop.cancel();
        task.await.unwrap();
    }
}
