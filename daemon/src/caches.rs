//! Caches: directories an environment keeps between its calls and sessions
//! in one project (a package manager's downloads, a build's target
//! directory). Owns where they live on the host, creating them, keeping
//! each environment's within its bound, listing and clearing them; the jail
//! only binds what [`Caches::mounts`] returns.
//!
//! Layout: `ROOT/PROJECT/ENV/CACHE`, where PROJECT is the project
//! directory's name and a hash of its path (projects never share a cache)
//! and CACHE the declared path, encoded. ROOT is
//! `$XDG_CACHE_HOME/nix-sandbox-mcp/caches` (`~/.cache/…`); a root server's
//! is `/var/cache/nix-sandbox-mcp/caches`, because its sandboxes run as
//! uid 65534, which must pass through every directory above its own.
//!
//! The bound is kept after the fact: a trimmer removes the oldest files of
//! an environment's caches once they hold more than its `cache_mb`, when a
//! call starts (at most every 5 seconds per environment and project, since a
//! check walks the whole cache) and every minute while calls come. A single call may exceed
//! the bound until the next check; the sandbox's own limits (file size,
//! time) bound how far. Trimming works through directory descriptors and
//! never follows a symlink, whatever the sandbox leaves there.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::environment::Environment;
use crate::jail::{CacheMount, WORKSPACE};
use crate::sync::Recover;

/// An environment's caches hold at most this much by default (1 GiB).
pub const DEFAULT_BYTES: u64 = 1 << 30;
/// Trimming leaves this share of the bound, so that it does not run at
/// every call of a full cache.
const TRIM_TO_PERCENT: u64 = 90;
/// How often caches in use are checked, and for how long after their
/// environment's last call.
const CHECK_EVERY: Duration = Duration::from_secs(60);
/// The least time between two checks of the same caches, however many
/// calls start meanwhile: a check walks the whole cache.
const CHECK_SPACING: Duration = Duration::from_secs(5);
const ACTIVE_FOR: Duration = Duration::from_secs(3600);

/// The project, as caches in it need it.
#[derive(Debug, Clone)]
pub struct ProjectView {
    pub host_path: PathBuf,
    pub mount_point: String,
    /// Whether the sandbox may create a directory there (overlay, readwrite).
    pub writable: bool,
}

/// The caches of one project.
#[derive(Debug)]
pub struct Caches {
    /// `ROOT/PROJECT`.
    dir: PathBuf,
    project: Option<ProjectView>,
    /// Who the sandboxes run as, when not the server's user.
    owner: Option<(u32, u32)>,
    trimmer: Arc<Trimmer>,
    /// Caches (environment, path) already warned about.
    skipped: Mutex<std::collections::HashSet<(String, String)>>,
}

#[derive(Debug, Default)]
struct Trimmer {
    active: Mutex<HashMap<PathBuf, Watched>>,
    wake: Condvar,
}

/// An environment's caches directory, as the trimmer keeps track of it.
#[derive(Debug, Clone, Copy)]
struct Watched {
    bound: u64,
    /// When a call last started with these caches.
    used: Instant,
    /// When they were last measured (and trimmed), if ever.
    checked: Option<Instant>,
}

impl Watched {
    /// How long until these caches are due a check; zero when they are.
    /// A call started since the last check makes them due after
    /// [`CHECK_SPACING`], else they are due every [`CHECK_EVERY`].
    fn due_in(&self) -> Duration {
        match self.checked {
            None => Duration::ZERO,
            Some(at) if self.used > at => CHECK_SPACING.saturating_sub(at.elapsed()),
            Some(at) => CHECK_EVERY.saturating_sub(at.elapsed()),
        }
    }
}

/// Where every project's caches live, for this user.
pub fn root() -> PathBuf {
    if rustix::process::geteuid().is_root() && std::env::var_os("XDG_CACHE_HOME").is_none() {
        return PathBuf::from("/var/cache/nix-sandbox-mcp/caches");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("nix-sandbox-mcp/caches")
}

/// The directory of `project`'s caches (or of runs without a project).
pub fn project_dir(root: &Path, project: Option<&Path>) -> PathBuf {
    match project {
        None => root.join("no-project"),
        Some(p) => {
            let hash = Sha256::digest(p.as_os_str().as_encoded_bytes());
            let hex: String = hash[..6].iter().map(|b| format!("{b:02x}")).collect();
            let name: String = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(40)
                .collect();
            root.join(format!("{name}-{hex}"))
        }
    }
}

/// The host directory's name for a declared cache path: one component.
fn encode(path: &str) -> String {
    let mut out = String::new();
    for c in path.trim_end_matches('/').chars() {
        match c {
            '/' => out.push_str("%2F"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out
}

/// The declared path back from its directory's name.
pub fn decode(name: &str) -> String {
    name.replace("%2F", "/").replace("%25", "%")
}

impl Caches {
    pub fn new(project: Option<ProjectView>, owner: Option<(u32, u32)>) -> Caches {
        let dir = project_dir(&root(), project.as_ref().map(|p| p.host_path.as_path()));
        let trimmer = Arc::new(Trimmer::default());
        let worker = trimmer.clone();
        // Without the thread caches are still bound; only the bound is not kept.
        if let Err(e) = std::thread::Builder::new()
            .name("cache-trimmer".into())
            .spawn(move || worker.run())
        {
            tracing::warn!("cannot start the cache trimmer: {e}");
        }
        Caches {
            dir,
            project,
            owner,
            trimmer,
            skipped: Mutex::default(),
        }
    }

    /// The mounts for `env`'s caches, creating their directories; a cache
    /// that cannot be made is left out, with a warning. A cache in the
    /// project needs a project, and, when the project is read-only, a
    /// directory already there to mount over.
    pub fn mounts(&self, env: &Environment) -> Vec<CacheMount> {
        if env.caches.is_empty() {
            return Vec::new();
        }
        let env_dir = self.dir.join(&env.name);
        let mut mounts = Vec::new();
        for cache in &env.caches {
            let in_project = !cache.0.starts_with("~/");
            let at = match (&self.project, in_project) {
                (_, false) => cache.in_sandbox(WORKSPACE, ""),
                (Some(p), true) => {
                    let rel = cache.0.trim_end_matches('/');
                    if let Err(why) = real_directories(&p.host_path, rel) {
                        self.skip_once(&env.name, &cache.0, &why);
                        continue;
                    }
                    let there = p.host_path.join(rel);
                    if !(there.is_dir() || p.writable && self.may_create_in(&there)) {
                        self.skip_once(
                            &env.name,
                            &cache.0,
                            "the project has no such directory and the sandbox cannot create it (create it in the project)",
                        );
                        continue;
                    }
                    cache.in_sandbox(WORKSPACE, &p.mount_point)
                }
                (None, true) => continue,
            };
            let host = env_dir.join(encode(&cache.0));
            match self.create(&host) {
                Ok(()) => mounts.push(CacheMount { host, at }),
                Err(e) => self.skip_once(
                    &env.name,
                    &cache.0,
                    &format!("cannot create {}: {e}", host.display()),
                ),
            }
        }
        if !mounts.is_empty() {
            self.trimmer.touch(env_dir, env.cache_bytes);
        }
        mounts
    }

    /// Whether the sandbox can create `dir` (whose parent is in the
    /// project): the server's user when sandboxes run as it, else uid
    /// `owner` by the parent's owner and mode.
    fn may_create_in(&self, dir: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(parent) = dir.parent() else {
            return false;
        };
        match self.owner {
            None => rustix::fs::access(
                parent,
                rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
            )
            .is_ok(),
            Some((uid, _)) => std::fs::metadata(parent).is_ok_and(|m| {
                (m.uid() == uid && m.mode() & 0o300 == 0o300) || m.mode() & 0o003 == 0o003
            }),
        }
    }

    /// Says once why a cache is not kept.
    fn skip_once(&self, env: &str, cache: &str, why: &str) {
        if self
            .skipped
            .lock()
            .unwrap()
            .insert((env.to_string(), cache.to_string()))
        {
            tracing::warn!("cache {cache} of environment {env} is not kept: {why}");
        }
    }

    /// Creates `leaf` and the directories above it: the leaf belongs to
    /// whoever the sandboxes run as; above it, a root server's directories
    /// can be passed through but not listed.
    fn create(&self, leaf: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if leaf.is_dir() {
            return Ok(());
        }
        let parent_mode = if self.owner.is_some() { 0o711 } else { 0o700 };
        let mut missing = Vec::new();
        let mut p = leaf.parent();
        while let Some(dir) = p {
            if dir.exists() {
                break;
            }
            missing.push(dir);
            p = dir.parent();
        }
        for dir in missing.into_iter().rev() {
            std::fs::DirBuilder::new().mode(parent_mode).create(dir)?;
            // The umask may have taken bits away.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(parent_mode))?;
        }
        std::fs::DirBuilder::new().mode(0o700).create(leaf)?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(leaf, Some(uid), Some(gid))?;
        }
        Ok(())
    }
}

impl Trimmer {
    fn touch(&self, env_dir: PathBuf, bound: u64) {
        let now = Instant::now();
        let mut active = self.active.lock().recover();
        let watched = active.entry(env_dir).or_insert(Watched {
            bound,
            used: now,
            checked: None,
        });
        watched.bound = bound;
        watched.used = now;
        // The trimmer recomputes when the caches are due; it measures them
        // at most once per spacing, however fast calls come.
        self.wake.notify_one();
    }

    fn run(&self) {
        let mut active = self.active.lock().recover();
        loop {
            active.retain(|_, w| w.used.elapsed() < ACTIVE_FOR);
            let now = Instant::now();
            let due: Vec<(PathBuf, u64)> = active
                .iter_mut()
                .filter(|(_, w)| w.due_in().is_zero())
                .map(|(dir, w)| {
                    w.checked = Some(now);
                    (dir.clone(), w.bound)
                })
                .collect();
            drop(active);
            for (dir, bound) in due {
                match trim(&dir, bound) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        "cache {} was over its bound: removed {n} oldest files",
                        dir.display()
                    ),
                    Err(e) => tracing::warn!("cannot trim cache {}: {e}", dir.display()),
                }
            }
            active = self.active.lock().recover();
            let wait = active
                .values()
                .map(Watched::due_in)
                .min()
                .unwrap_or(CHECK_EVERY)
                .max(Duration::from_millis(10));
            active = self.wake.wait_timeout(active, wait).recover().0;
        }
    }
}

/// A file in a cache: its path (relative to the environment's directory),
/// its size on disk and when it last changed.
struct CachedFile {
    path: PathBuf,
    bytes: u64,
    mtime: i64,
}

/// Stops a walk of a hostile tree from taking the server's memory: files
/// listed, and bytes of their paths.
const MAX_FILES: usize = 1 << 20;
const MAX_PATH_BYTES: usize = 64 << 20;
/// Deepest directory walked, below the environment's directory; a deeper
/// one is a sandbox's doing (no package manager nests so), and is removed
/// whole when the caches are trimmed.
const MAX_DEPTH: usize = 64;

/// Removes the oldest files under `dir` until what it holds is within
/// `TRIM_TO_PERCENT` of `bound`, when it holds more than `bound`, and any
/// directory deeper than [`MAX_DEPTH`]. Returns how many files and
/// directories were removed.
pub fn trim(dir: &Path, bound: u64) -> std::io::Result<usize> {
    let root = match open_dir(rustix::fs::CWD, dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let Walked {
        mut files,
        too_deep,
    } = walk(&root)?;
    let mut removed = 0;
    for deep in &too_deep {
        match remove_deep(&root, deep) {
            Ok(()) => {
                tracing::warn!(
                    "removed a directory deeper than {MAX_DEPTH} levels from cache {}",
                    dir.display()
                );
                removed += 1;
            }
            Err(e) => tracing::warn!(
                "cannot remove a directory deeper than {MAX_DEPTH} levels from cache {}: {e}",
                dir.display()
            ),
        }
    }
    let mut total: u64 = files.iter().map(|f| f.bytes).sum();
    if total <= bound {
        return Ok(removed);
    }
    let target = bound / 100 * TRIM_TO_PERCENT;
    files.sort_by_key(|f| f.mtime);
    for f in files {
        if total <= target {
            break;
        }
        if remove(&root, &f.path).is_ok() {
            total = total.saturating_sub(f.bytes);
            removed += 1;
        }
    }
    Ok(removed)
}

/// Checks that every component of `rel` under `root` that exists is a
/// directory, not a symlink: a cache's mount point in the project must be
/// where the project says it is (a repository's `target -> /home/u` or
/// `target -> ../newroot/workspace` would take the mount elsewhere).
fn real_directories(root: &Path, rel: &str) -> Result<(), String> {
    let mut at = root.to_path_buf();
    for part in Path::new(rel).components() {
        at.push(part);
        match at.symlink_metadata() {
            Err(_) => return Ok(()),
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&at).unwrap_or_default();
                return Err(format!(
                    "{} is a symlink in the project (to {}), and a cache is never mounted through a symlink: remove the link or move the cache",
                    at.strip_prefix(root).unwrap_or(&at).display(),
                    target.display()
                ));
            }
            Ok(m) if !m.is_dir() => {
                return Err(format!(
                    "{} is a file in the project, not a directory",
                    at.strip_prefix(root).unwrap_or(&at).display()
                ));
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// What `dir`'s caches hold, in bytes (0 when there are none).
pub fn size(dir: &Path) -> u64 {
    let Ok(root) = open_dir(rustix::fs::CWD, dir) else {
        return 0;
    };
    walk(&root).map_or(0, |w| w.files.iter().map(|f| f.bytes).sum())
}

fn open_dir<Fd: rustix::fd::AsFd, P: rustix::path::Arg>(
    at: Fd,
    path: P,
) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// What a walk of a cache found.
struct Walked {
    files: Vec<CachedFile>,
    /// Directories at [`MAX_DEPTH`], not walked (relative paths).
    too_deep: Vec<PathBuf>,
}

/// Lists the files under `root`, iteratively, one open directory per
/// level, no deeper than [`MAX_DEPTH`] and within [`MAX_FILES`] and
/// [`MAX_PATH_BYTES`]; never following a symlink.
fn walk(root: &OwnedFd) -> std::io::Result<Walked> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Walked {
        files: Vec::new(),
        too_deep: Vec::new(),
    };
    let mut path_bytes = 0usize;
    let mut stack = vec![(rustix::fs::Dir::read_from(root)?, PathBuf::new())];
    loop {
        let depth = stack.len();
        let Some((dir, rel)) = stack.last_mut() else {
            break;
        };
        let Some(Ok(entry)) = dir.read() else {
            stack.pop();
            continue;
        };
        let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
        if name == "." || name == ".." {
            continue;
        }
        let Ok(fd) = dir.fd() else {
            stack.pop();
            continue;
        };
        let Ok(st) = rustix::fs::statat(fd, &name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let path = rel.join(&name);
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            if depth > MAX_DEPTH {
                out.too_deep.push(path);
            } else if let Ok(sub) = open_dir(fd, &name).and_then(|d| Ok(rustix::fs::Dir::new(d)?)) {
                stack.push((sub, path));
            }
            continue;
        }
        path_bytes += path.as_os_str().len();
        if out.files.len() >= MAX_FILES || path_bytes > MAX_PATH_BYTES {
            break;
        }
        out.files.push(CachedFile {
            path,
            bytes: st.st_blocks as u64 * 512,
            mtime: st.st_mtime,
        });
    }
    Ok(out)
}

/// Opens the directory at `rel` below `root`, each component without
/// following a symlink.
fn open_beneath(root: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let mut dir: Option<OwnedFd> = None;
    for part in rel.iter() {
        let next = open_dir(dir.as_ref().unwrap_or(root), part)?;
        dir = Some(next);
    }
    match dir {
        Some(d) => Ok(d),
        None => open_dir(root, "."),
    }
}

/// Unlinks the file at `path` below `root`, opening each directory on the
/// way without following symlinks.
fn remove(root: &OwnedFd, path: &Path) -> std::io::Result<()> {
    let name = path.file_name().ok_or(std::io::ErrorKind::InvalidInput)?;
    let parent = open_beneath(root, path.parent().unwrap_or(Path::new("")))?;
    rustix::fs::unlinkat(&parent, name, AtFlags::empty())?;
    Ok(())
}

/// Removes the directory at `rel` below `root` and everything in it,
/// however deep, holding two directories open at a time: each pass pulls
/// the entries of its subdirectories up into it (under fresh names) and
/// removes what is not a directory, so every pass takes a level away.
fn remove_deep(root: &OwnedFd, rel: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let name = rel.file_name().ok_or(std::io::ErrorKind::InvalidInput)?;
    let parent = open_beneath(root, rel.parent().unwrap_or(Path::new("")))?;
    let top = open_dir(&parent, name)?;
    let mut fresh = 0u64;
    loop {
        let mut any = false;
        let names: Vec<std::ffi::OsString> = rustix::fs::Dir::read_from(&top)?
            .filter_map(Result::ok)
            .map(|e| std::ffi::OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
            .filter(|n| n != "." && n != "..")
            .collect();
        for entry in names {
            any = true;
            let Ok(st) = rustix::fs::statat(&top, &entry, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                let _ = rustix::fs::unlinkat(&top, &entry, AtFlags::empty());
                continue;
            }
            let sub = open_dir(&top, &entry)?;
            for inner in rustix::fs::Dir::read_from(&sub)?.filter_map(Result::ok) {
                let inner = inner.file_name().to_owned();
                if inner.as_c_str() == c"." || inner.as_c_str() == c".." {
                    continue;
                }
                fresh += 1;
                let _ = rustix::fs::renameat(
                    &sub,
                    inner.as_c_str(),
                    &top,
                    format!(".nsm-up-{fresh}").as_str(),
                );
            }
            let _ = rustix::fs::unlinkat(&top, &entry, AtFlags::REMOVEDIR);
        }
        if !any {
            break;
        }
    }
    rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_paths_become_one_component_each() {
        assert_eq!(encode("~/.cache/pip"), "~%2F.cache%2Fpip");
        assert_eq!(encode("target/"), "target");
        assert_eq!(encode("a%2Fb"), "a%252Fb");
        for p in ["~/.cache/pip", "target", "a%2Fb", "%%/x"] {
            assert_eq!(decode(&encode(p)), p);
        }
    }

    #[test]
    fn projects_never_share_a_directory() {
        let root = Path::new("/c");
        let a = project_dir(root, Some(Path::new("/home/u/app")));
        let b = project_dir(root, Some(Path::new("/srv/app")));
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with("app-"));
        assert_eq!(project_dir(root, None), Path::new("/c/no-project"));
    }

    #[test]
    fn a_tree_too_deep_to_walk_is_removed_whole_without_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("env");
        std::fs::create_dir_all(cache.join("keep")).unwrap();
        std::fs::write(cache.join("keep/file"), "kept").unwrap();
        let mut at = open_dir(rustix::fs::CWD, &cache).unwrap();
        for i in 0..3000 {
            rustix::fs::mkdirat(&at, "d", Mode::from_raw_mode(0o755)).unwrap();
            at = open_dir(&at, "d").unwrap();
            if i % 500 == 0 {
                rustix::fs::openat(
                    &at,
                    "f",
                    OFlags::CREATE | OFlags::WRONLY,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
            }
        }
        drop(at);
        // On a small stack, as a thread of the server's has.
        let removed = std::thread::scope(|s| {
            std::thread::Builder::new()
                .stack_size(128 << 10)
                .spawn_scoped(s, || {
                    assert!(size(&cache) > 0);
                    trim(&cache, u64::MAX).unwrap()
                })
                .unwrap()
                .join()
                .unwrap()
        });
        assert_eq!(removed, 1);
        let d = cache.join("d");
        let mut depth = 0;
        let mut p = d.clone();
        while p.is_dir() {
            depth += 1;
            p.push("d");
        }
        assert_eq!(depth, MAX_DEPTH, "kept down to the bound, the rest removed");
        assert_eq!(
            std::fs::read_to_string(cache.join("keep/file")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn trimming_removes_the_oldest_files_first_and_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let keep = outside.path().join("precious");
        std::fs::write(&keep, vec![1u8; 64 << 10]).unwrap();
        let cache = dir.path().join("env");
        std::fs::create_dir_all(cache.join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path(), cache.join("link")).unwrap();
        for (i, name) in ["old", "sub/middle", "new"].iter().enumerate() {
            let p = cache.join(name);
            std::fs::write(&p, vec![7u8; 64 << 10]).unwrap();
            let t =
                std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 * (i as u64 + 1));
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        let before = size(&cache);
        assert!(before >= 3 * (64 << 10));
        assert_eq!(trim(&cache, before).unwrap(), 0);
        // Room for about two files: the oldest goes.
        assert_eq!(trim(&cache, before - 1).unwrap(), 1);
        assert!(!cache.join("old").exists());
        assert!(cache.join("sub/middle").exists() && cache.join("new").exists());
        assert!(keep.exists());
        assert_eq!(trim(&cache, 1).unwrap(), 2);
        assert!(keep.exists(), "a symlink in the cache was followed");
    }
}
