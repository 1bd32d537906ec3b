//! Start-up builds already done: the store path each gave, recorded under a
//! fingerprint of what it built, so that the next start offers it at once,
//! without running Nix. A fingerprint exists only for what cannot change
//! under the same name: the build's target as written (which holds the
//! running daemon's store path, when it has one) and, for each flake in a
//! local git repository it names (`git+file://`), the commit checked out and
//! the uncommitted changes to tracked files (what `git+file:` reads). A
//! remote reference counts only when it pins a revision; `path:` outside
//! the store, never (anything in the directory may have changed).
//!
//! Records live in `$XDG_CACHE_HOME/nix-sandbox-mcp/builds` (a root
//! server's in `/var/cache/nix-sandbox-mcp/builds`), one file per
//! fingerprint holding the store path. A path the store no longer has (a
//! garbage collection) is built again.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::flakes::Target;

/// Where the records are.
pub fn dir() -> PathBuf {
    let caches = crate::caches::root();
    caches.parent().unwrap_or(&caches).join("builds")
}

/// Whether `path` is ours and no one else may write it (so that a record
/// in it was written by this user).
fn ours(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.uid() == rustix::process::geteuid().as_raw() && m.mode() & 0o022 == 0)
}

/// The fingerprint of `target`, when it has one (see the module's header).
pub fn fingerprint(target: &Target) -> Option<String> {
    let text = match target {
        Target::Reference(r) => r,
        Target::Expression(e) => e,
    };
    let mut hash = Sha256::new();
    hash.update(text.as_bytes());
    let store = super::artifact::store_dir();
    for reference in references(text) {
        if let Some(dir) = reference.strip_prefix("git+file://") {
            let dir = dir.split(['?', '#']).next().unwrap_or(dir);
            hash.update(repository_state(Path::new(dir))?);
        } else if let Some(dir) = reference.strip_prefix("path:") {
            if !Path::new(dir.split(['?', '#']).next().unwrap_or(dir)).starts_with(&store) {
                return None;
            }
        } else if !pins_a_revision(reference) {
            return None;
        }
    }
    Some(format!("{:x}", hash.finalize()))
}

/// The flake references in a target: the whole of a reference, or each
/// string literal of an expression that looks like one.
fn references(text: &str) -> Vec<&str> {
    if !text.contains('"') {
        return vec![text];
    }
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            [
                "git+file://",
                "path:",
                "github:",
                "gitlab:",
                "sourcehut:",
                "git+",
                "https://",
                "http://",
                "tarball+",
                "file+",
            ]
            .iter()
            .any(|scheme| s.starts_with(scheme))
        })
        .collect()
}

/// Whether a remote reference names one revision for good.
fn pins_a_revision(reference: &str) -> bool {
    let is_rev = |s: &str| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let (location, _) = reference.split_once('#').unwrap_or((reference, ""));
    let (path, query) = location.split_once('?').unwrap_or((location, ""));
    query
        .split('&')
        .any(|kv| kv.strip_prefix("rev=").is_some_and(is_rev))
        || path.rsplit('/').next().is_some_and(is_rev)
}

/// The commit checked out in `dir` and its uncommitted tracked changes, as
/// git reports them; `None` when git cannot say.
fn repository_state(dir: &Path) -> Option<Vec<u8>> {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        out.status.success().then_some(out.stdout)
    };
    let mut state = git(&["rev-parse", "HEAD"])?;
    state.extend(git(&["diff", "HEAD", "--binary"])?);
    Some(state)
}

/// The store path recorded for `key`, if the store still has it.
pub fn lookup(key: &str) -> Option<PathBuf> {
    let dir = dir();
    let file = dir.join(key);
    if !ours(&dir) || !ours(&file) {
        return None;
    }
    let recorded = std::fs::read_to_string(file).ok()?;
    let path = PathBuf::from(recorded.trim());
    (path.starts_with(super::artifact::store_dir()) && path.exists()).then_some(path)
}

/// Records that the build `key` gave `path`; a failure only costs the next
/// start a build.
pub fn record(key: &str, path: &Path) {
    let dir = dir();
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        if !ours(&dir) {
            return Err(std::io::Error::other("the directory is not only ours"));
        }
        let temporary = dir.join(format!(".{key}.{}", std::process::id()));
        std::fs::write(&temporary, path.as_os_str().as_encoded_bytes())?;
        std::fs::rename(&temporary, dir.join(key))
    });
    if let Err(e) = written {
        tracing::debug!("cannot record the build of {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_cannot_change_under_its_name_has_a_fingerprint() {
        let rev = "0123456789abcdef0123456789abcdef01234567";
        assert!(fingerprint(&Target::Reference(format!("github:me/envs/{rev}#ruby"))).is_some());
        assert!(
            fingerprint(&Target::Reference(format!(
                "git+https://host/r?rev={rev}#x"
            )))
            .is_some()
        );
        assert!(fingerprint(&Target::Reference("github:me/envs#ruby".into())).is_none());
        assert!(fingerprint(&Target::Reference("path:/home/me/envs#ruby".into())).is_none());
        let store = super::super::artifact::store_dir();
        let in_store = format!("path:{}/abc-source#x", store.display());
        assert!(fingerprint(&Target::Reference(in_store)).is_some());
        // A git+file flake outside a repository: git cannot say.
        let dir = tempfile::tempdir().unwrap();
        let expression = format!(
            "(builtins.getFlake \"git+file://{}\").x",
            dir.path().display()
        );
        assert!(fingerprint(&Target::Expression(expression)).is_none());
    }

    #[test]
    fn a_repository_fingerprint_follows_commits_and_tracked_changes() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(dir.path().join("flake.nix"), "{ }").unwrap();
        git(&["add", "flake.nix"]);
        git(&["commit", "-qm", "one"]);
        let target = Target::Expression(format!(
            "(builtins.getFlake \"git+file://{}\").x",
            dir.path().display()
        ));
        let first = fingerprint(&target).unwrap();
        assert_eq!(fingerprint(&target).unwrap(), first);
        // An untracked file does not reach the store: the same fingerprint.
        std::fs::write(dir.path().join(".env"), "SECRET=1").unwrap();
        assert_eq!(fingerprint(&target).unwrap(), first);
        std::fs::write(dir.path().join("flake.nix"), "{ outputs = _: { }; }").unwrap();
        let edited = fingerprint(&target).unwrap();
        assert_ne!(edited, first);
        git(&["commit", "-qam", "two"]);
        assert_ne!(fingerprint(&target).unwrap(), edited);
    }
}
