//! Reading an overlay's upper layer against its lower one (the host's
//! project): each entry of the upper layer is a change, a whiteout is a
//! deletion, an opaque directory replaced the lower one. Only the upper
//! layer is walked, so the cost follows what changed, not the project's
//! size. The upper layer belongs to the sandbox: it is read through
//! descriptors, one component at a time, never following a symlink, and
//! never opening anything but a directory or a regular file.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::{Change, Content, Entry, Scan};

/// Files larger than this are compared by size and modification time, and
/// named rather than diffed.
pub const DIFF_BYTES: u64 = 1 << 20;
/// A scan stops listing ignored paths after this many (it still counts them).
const IGNORED_NAMED: usize = 20;
/// The opaque marker overlayfs sets (with `userxattr`) on a directory that
/// replaced the lower one.
const OPAQUE: &str = "user.overlay.opaque";

/// Reads the changes in `upper` (a descriptor on the overlay's upper
/// directory) against the project at `lower`; `protected` are paths
/// (relative, a trailing `/` for a directory) whose change is flagged.
pub fn scan(upper: &OwnedFd, lower: &Path, protected: &[String]) -> std::io::Result<Scan> {
    let mut walk = Walk {
        lower_root: lower,
        protected,
        scan: Scan::default(),
    };
    let mut ignores = Vec::new();
    if let Some(g) = gitignore(lower, &[".gitignore", ".git/info/exclude"]) {
        ignores.push(g);
    }
    walk.directory(upper, Path::new(""), Some(lower), false, &mut ignores)?;
    walk.scan.changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(walk.scan)
}

struct Walk<'a> {
    lower_root: &'a Path,
    protected: &'a [String],
    scan: Scan,
}

impl Walk<'_> {
    /// Visits the upper directory `dir` (`rel` from the project's root);
    /// `lower` is the same directory in the host's tree when there is one,
    /// `opaque` when the upper one replaced it.
    fn directory(
        &mut self,
        dir: &OwnedFd,
        rel: &Path,
        lower: Option<&Path>,
        opaque: bool,
        ignores: &mut Vec<Gitignore>,
    ) -> std::io::Result<()> {
        let pushed = match lower.and_then(|l| gitignore(l, &[".gitignore"])) {
            Some(g) if !rel.as_os_str().is_empty() => {
                ignores.push(g);
                true
            }
            _ => false,
        };
        let mut seen = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir)? {
            let name = OsStr::from_bytes(entry?.file_name().to_bytes()).to_os_string();
            if name != "." && name != ".." {
                seen.push(name);
            }
        }
        seen.sort();
        for name in &seen {
            self.entry(dir, rel, lower, name, ignores)?;
        }
        // An opaque directory hides everything of the lower one it does not hold.
        if let (true, Some(lower)) = (opaque, lower) {
            for e in std::fs::read_dir(lower)?.flatten() {
                if !seen.contains(&e.file_name()) {
                    self.deleted(&rel.join(e.file_name()), &e.path(), ignores);
                }
            }
        }
        if pushed {
            ignores.pop();
        }
        Ok(())
    }

    fn entry(
        &mut self,
        dir: &OwnedFd,
        rel_dir: &Path,
        lower_dir: Option<&Path>,
        name: &OsStr,
        ignores: &mut Vec<Gitignore>,
    ) -> std::io::Result<()> {
        let rel = rel_dir.join(name);
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        let kind = FileType::from_raw_mode(st.st_mode);
        let lower = lower_dir.map(|l| l.join(name));
        let lower_meta = lower.as_ref().and_then(|l| l.symlink_metadata().ok());
        self.flag_protected(&rel);
        if kind == FileType::CharacterDevice && st.st_rdev == 0 {
            // A whiteout: deleted from the lower layer.
            if let Some(l) = &lower {
                self.deleted(&rel, l, ignores);
            }
            return Ok(());
        }
        let is_dir = kind == FileType::Directory;
        if ignored(ignores, self.lower_root, &rel, is_dir) {
            // An ignored directory is one path, however much it holds. The
            // version control's own directory counts here too, after a look
            // for the protected files inside.
            if is_dir && rel == Path::new(".git") {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                if let Ok(git) = rustix::fs::openat(dir, name, flags, Mode::empty()) {
                    for inner in ["hooks", "config"] {
                        if rustix::fs::statat(&git, inner, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                            self.flag_protected(&rel.join(inner));
                        }
                    }
                }
            }
            self.scan.ignore(&rel, is_dir);
            return Ok(());
        }
        if is_dir {
            let sub = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let opaque = is_opaque(&sub);
            match (&lower_meta, &lower) {
                (Some(m), Some(l)) if m.is_dir() => {
                    if m.permissions().mode() & 0o7777 != st.st_mode & 0o7777 {
                        self.scan.changes.push(Change {
                            path: rel.clone(),
                            old: Some(Entry::directory(m.permissions().mode())),
                            new: Some(Entry::directory(st.st_mode)),
                        });
                    }
                    return self.directory(&sub, &rel, Some(l), opaque, ignores);
                }
                (Some(_), Some(l)) => self.deleted(&rel, l, ignores),
                _ => {}
            }
            return self.directory(&sub, &rel, None, false, ignores);
        }
        let new = self.read_upper(dir, name, &st)?;
        let old = match (&lower_meta, &lower) {
            (Some(m), Some(l)) if !m.is_dir() => Some(read_lower(l, m)),
            (Some(_), Some(l)) => {
                self.deleted(&rel, l, ignores);
                None
            }
            _ => None,
        };
        if let Some(old) = &old
            && old.same_as(&new)
        {
            // Copied up without a change (opened for writing, touched).
            return Ok(());
        }
        self.scan.changes.push(Change {
            path: rel,
            old,
            new: Some(new),
        });
        Ok(())
    }

    /// Everything under `lower` (the host's) is gone.
    fn deleted(&mut self, rel: &Path, lower: &Path, ignores: &[Gitignore]) {
        self.flag_protected(rel);
        let Ok(meta) = lower.symlink_metadata() else {
            return;
        };
        if ignored(ignores, self.lower_root, rel, meta.is_dir()) {
            self.scan.ignore(rel, meta.is_dir());
            return;
        }
        if meta.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(lower)
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            names.sort();
            for n in names {
                self.deleted(&rel.join(&n), &lower.join(&n), ignores);
            }
            return;
        }
        self.scan.changes.push(Change {
            path: rel.to_path_buf(),
            old: Some(read_lower(lower, &meta)),
            new: None,
        });
    }

    fn flag_protected(&mut self, rel: &Path) {
        // A protected directory is named once, not with everything in it.
        let named = self.scan.protected.iter().any(|p| rel.starts_with(p));
        if super::is_protected(self.protected, rel) && !named {
            self.scan.protected.push(rel.to_path_buf());
        }
    }

    /// An upper entry, read without following it anywhere.
    fn read_upper(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        st: &rustix::fs::Stat,
    ) -> std::io::Result<Entry> {
        let mode = st.st_mode;
        let size = st.st_size as u64;
        match FileType::from_raw_mode(mode) {
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
                Ok(Entry::symlink(target.into_bytes()))
            }
            FileType::RegularFile if size <= DIFF_BYTES => {
                // Non-blocking and checked after opening: the sandbox may
                // have swapped the file for a FIFO meanwhile.
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                );
                let content = match fd {
                    Ok(fd)
                        if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode).is_file() =>
                    {
                        let mut bytes = Vec::with_capacity(size as usize);
                        File::from(fd)
                            .take(DIFF_BYTES + 1)
                            .read_to_end(&mut bytes)?;
                        Content::Bytes(bytes)
                    }
                    _ => Content::Unreadable,
                };
                Ok(Entry::file(mode, size, st.st_mtime, content))
            }
            FileType::RegularFile => Ok(Entry::file(mode, size, st.st_mtime, Content::TooLarge)),
            _ => Ok(Entry::special(mode)),
        }
    }
}

/// A host entry, as the lower layer holds it.
fn read_lower(path: &Path, meta: &std::fs::Metadata) -> Entry {
    let mode = meta.mode();
    if meta.file_type().is_symlink() {
        return match std::fs::read_link(path) {
            Ok(t) => Entry::symlink(t.into_os_string().into_vec()),
            Err(_) => Entry::special(mode),
        };
    }
    if !meta.is_file() {
        return Entry::special(mode);
    }
    let content = if meta.len() > DIFF_BYTES {
        Content::TooLarge
    } else {
        std::fs::read(path).map_or(Content::Unreadable, Content::Bytes)
    };
    Entry::file(mode, meta.len(), meta.mtime(), content)
}

fn is_opaque(dir: &OwnedFd) -> bool {
    let mut value = [0u8; 4];
    matches!(rustix::fs::fgetxattr(dir, OPAQUE, &mut value), Ok(n) if value[..n] == *b"y")
}

/// The ignore rules in `files` (relative to `dir`), when any exists.
fn gitignore(dir: &Path, files: &[&str]) -> Option<Gitignore> {
    let mut builder = GitignoreBuilder::new(dir);
    let mut any = false;
    for f in files {
        let p: PathBuf = dir.join(f);
        if p.is_file() {
            any = true;
            let _ = builder.add(p);
        }
    }
    if !any {
        return None;
    }
    builder.build().ok()
}

/// Whether the project's ignore rules (the innermost deciding) ignore
/// `rel`; the version control's own directory always is.
fn ignored(ignores: &[Gitignore], root: &Path, rel: &Path, is_dir: bool) -> bool {
    if rel
        .components()
        .next()
        .is_some_and(|c| c.as_os_str() == ".git")
    {
        return true;
    }
    let path = root.join(rel);
    for g in ignores.iter().rev() {
        let m = g.matched_path_or_any_parents(&path, is_dir);
        if m.is_ignore() {
            return true;
        }
        if m.is_whitelist() {
            return false;
        }
    }
    false
}

impl Scan {
    fn ignore(&mut self, rel: &Path, is_dir: bool) {
        self.ignored += 1;
        if self.ignored_named.len() < IGNORED_NAMED {
            let mut name = rel.to_string_lossy().into_owned();
            if is_dir {
                name.push('/');
            }
            self.ignored_named.push(name);
        }
    }
}
