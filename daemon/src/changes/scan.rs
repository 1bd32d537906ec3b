//! Reading an overlay's upper layer against its lower one (the host's
//! project): each entry of the upper layer is a change, a whiteout is a
//! deletion, an opaque directory replaced the lower one. Only the upper
//! layer is walked, so the cost follows what changed, not the project's
//! size.
//!
//! The upper layer belongs to the sandbox, so the walk holds against
//! anything it can build there:
//! - iterative, with one open directory per level, and no deeper than
//!   [`MAX_DEPTH`] levels (a deeper directory is counted, not read);
//! - entries are listed up to [`MAX_LISTED`] changes and
//!   [`LISTED_PATH_BYTES`] of their paths; past that they are counted;
//! - no file's contents are held: a file whose size and mode match the
//!   host's is compared with it in chunks (never trusting its modification
//!   time, which the sandbox sets at will), within [`COMPARE_BYTES`] a scan;
//!   past that it is reported as modified and the result says so;
//! - read through descriptors, one component at a time, never following a
//!   symlink, opening nothing but directories and regular files, never
//!   blocking on one swapped for a FIFO.
//!
//! Ignore rules (`.gitignore`, `.git/info/exclude`) leave out untracked
//! build output; a file git tracks is always a change (see `tracked.rs`).
//! Protected paths are never ignored (see `protect.rs`).

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use super::protect::{self, Protection};
use super::tracked::Tracked;
use super::{Change, Entry, Scan};

/// Deepest directory read, in levels below the project's root.
pub const MAX_DEPTH: usize = 128;
/// Changes listed by path; more are counted.
pub const MAX_LISTED: usize = 20_000;
/// Bytes of listed paths; past them changes are counted.
pub const LISTED_PATH_BYTES: usize = 4 << 20;
/// Bytes read comparing files whose size and mode did not change.
pub const COMPARE_BYTES: u64 = 256 << 20;
/// A scan stops listing ignored paths after this many (it still counts them).
const IGNORED_NAMED: usize = 20;
/// Protected paths named in a result; more are said to exist.
const PROTECTED_NAMED: usize = 50;
/// The opaque marker overlayfs sets (with `userxattr`) on a directory that
/// replaced the lower one.
const OPAQUE: &str = "user.overlay.opaque";
const CHUNK: usize = 64 << 10;

/// Reads the changes in `upper` (a descriptor on the overlay's upper
/// directory) against the project at `lower`.
pub fn scan(upper: &OwnedFd, lower: &Path, protection: &Protection) -> std::io::Result<Scan> {
    let mut walk = Walk {
        lower_root: lower,
        protection,
        tracked: None,
        compare_left: COMPARE_BYTES,
        listed_path_bytes: 0,
        scan: Scan::default(),
    };
    let mut ignores = Vec::new();
    if let Some(g) = gitignore(lower, &[".gitignore", ".git/info/exclude"]) {
        ignores.push(g);
    }
    let root = Frame {
        dir: Dir::read_from(upper)?,
        rel: PathBuf::new(),
        lower: Some(lower.to_path_buf()),
        opaque: false,
        pushed_ignores: false,
    };
    let mut stack = vec![root];
    while let Some(frame) = stack.last_mut() {
        let name = match frame.dir.read() {
            Some(Ok(entry)) => entry.file_name().to_bytes().to_vec(),
            Some(Err(_)) => {
                walk.scan.summary.unreadable += 1;
                Vec::new()
            }
            None => Vec::new(),
        };
        if name.is_empty() {
            let done = stack.pop().expect("a frame is on the stack");
            walk.finish(done, &mut ignores);
            continue;
        }
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsStr::from_bytes(&name);
        if let Some(sub) = walk.entry(frame, name, &ignores) {
            if let Some(g) = sub
                .lower
                .as_deref()
                .and_then(|l| gitignore(l, &[".gitignore"]))
            {
                ignores.push(g);
                stack.push(Frame {
                    pushed_ignores: true,
                    ..sub
                });
            } else {
                stack.push(sub);
            }
        }
    }
    walk.scan.changes.sort_by(|a, b| a.path.cmp(&b.path));
    walk.scan.protected.sort();
    walk.scan.ignored_named.sort();
    Ok(walk.scan)
}

/// One directory of the upper layer being listed.
struct Frame {
    dir: Dir,
    rel: PathBuf,
    /// The same directory in the host's tree, when there is one.
    lower: Option<PathBuf>,
    /// The upper directory replaced the lower one.
    opaque: bool,
    /// This directory's `.gitignore` is on the ignore stack.
    pushed_ignores: bool,
}

impl Frame {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.dir.fd().ok()
    }
}

struct Walk<'a> {
    lower_root: &'a Path,
    protection: &'a Protection,
    /// What git tracks, read at the first path an ignore rule matches.
    tracked: Option<Tracked>,
    compare_left: u64,
    listed_path_bytes: usize,
    scan: Scan,
}

impl Walk<'_> {
    /// Visits the upper entry `name` of `frame`; returns the subdirectory
    /// to descend into, if it is one.
    fn entry(&mut self, frame: &Frame, name: &OsStr, ignores: &[Gitignore]) -> Option<Frame> {
        let rel = frame.rel.join(name);
        let dir = frame.fd()?;
        let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            self.scan.summary.unreadable += 1;
            return None;
        };
        let kind = FileType::from_raw_mode(st.st_mode);
        let lower = frame.lower.as_ref().map(|l| l.join(name));
        let lower_meta = lower.as_ref().and_then(|l| l.symlink_metadata().ok());
        if kind == FileType::CharacterDevice && st.st_rdev == 0 {
            // A whiteout: deleted from the lower layer.
            if let Some(l) = &lower {
                self.deleted(&rel, l, ignores);
            }
            return None;
        }
        let is_dir = kind == FileType::Directory;
        let guard = self.protection.root_of(&rel);
        if guard.is_none() && self.ignored(ignores, &rel, is_dir, lower_meta.is_some()) {
            self.scan.ignore(&rel, is_dir);
            return None;
        }
        if is_dir {
            if rel.iter().count() > MAX_DEPTH {
                self.scan.summary.too_deep(&rel);
                return None;
            }
            let opened = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            let Ok(sub) = opened.and_then(Dir::new) else {
                self.scan.summary.unreadable += 1;
                return None;
            };
            let opaque = sub.fd().is_ok_and(|fd| is_opaque(fd));
            let lower_dir = match (&lower_meta, lower) {
                (Some(m), Some(l)) if m.is_dir() => {
                    if m.mode() & 0o7777 != st.st_mode & 0o7777 {
                        self.record(Change {
                            path: rel.clone(),
                            old: Some(Entry::directory(m.mode())),
                            new: Some(Entry::directory(st.st_mode)),
                            guard,
                        });
                    }
                    Some(l)
                }
                (Some(_), Some(l)) => {
                    // The host's file became a directory.
                    self.deleted(&rel, &l, ignores);
                    None
                }
                _ => None,
            };
            return Some(Frame {
                dir: sub,
                rel,
                opaque: opaque && lower_dir.is_some(),
                lower: lower_dir,
                pushed_ignores: false,
            });
        }
        let new = upper_entry(dir, name, &st);
        let old = match (&lower_meta, &lower) {
            (Some(m), Some(_)) if !m.is_dir() => Some(lower_entry(lower.as_deref()?, m)),
            (Some(_), Some(l)) => {
                self.deleted(&rel, l, ignores);
                None
            }
            _ => None,
        };
        if let (Some(old), Some(l)) = (&old, &lower)
            && self.unchanged(dir, name, &new, old, l)
        {
            // Copied up without a change (opened for writing, touched).
            return None;
        }
        let guard = guard.or_else(|| {
            new.target
                .as_ref()
                .filter(|t| protect::leaves_project(&rel, t))
                .map(|_| rel.clone())
        });
        self.record(Change {
            path: rel,
            old,
            new: Some(new),
            guard,
        });
        None
    }

    /// A directory is done: an opaque one hides everything of the lower
    /// one it does not hold.
    fn finish(&mut self, frame: Frame, ignores: &mut Vec<Gitignore>) {
        if let (true, Some(lower), Some(fd)) = (frame.opaque, &frame.lower, frame.fd())
            && let Ok(entries) = std::fs::read_dir(lower)
        {
            for e in entries.flatten() {
                let name = e.file_name();
                if rustix::fs::statat(fd, &name, AtFlags::SYMLINK_NOFOLLOW).is_err() {
                    self.deleted(&frame.rel.join(&name), &e.path(), ignores);
                }
            }
        }
        if frame.pushed_ignores {
            ignores.pop();
        }
    }

    /// Everything under `lower` (the host's `rel`) is gone: walked
    /// iteratively, to the same depth as the upper layer.
    fn deleted(&mut self, rel: &Path, lower: &Path, ignores: &[Gitignore]) {
        let mut pending = vec![(rel.to_path_buf(), lower.to_path_buf())];
        while let Some((rel, path)) = pending.pop() {
            let Ok(meta) = path.symlink_metadata() else {
                continue;
            };
            let guard = self.protection.root_of(&rel);
            if guard.is_none() && self.ignored(ignores, &rel, meta.is_dir(), true) {
                self.scan.ignore(&rel, meta.is_dir());
                continue;
            }
            if meta.is_dir() {
                if rel.iter().count() > MAX_DEPTH {
                    self.scan.summary.too_deep(&rel);
                    continue;
                }
                match std::fs::read_dir(&path) {
                    Ok(d) => {
                        pending.extend(d.flatten().map(|e| (rel.join(e.file_name()), e.path())))
                    }
                    Err(_) => self.scan.summary.unreadable += 1,
                }
                continue;
            }
            let old = lower_entry(&path, &meta);
            self.record(Change {
                path: rel,
                old: Some(old),
                new: None,
                guard,
            });
        }
    }

    /// Counts a change, names its protected path, and lists it while the
    /// bounds allow.
    fn record(&mut self, change: Change) {
        let s = &mut self.scan;
        match (&change.old, &change.new) {
            (None, Some(n)) => {
                s.counts.added += 1;
                s.counts.bytes += n.stored_bytes();
            }
            (Some(_), Some(n)) => {
                s.counts.modified += 1;
                s.counts.bytes += n.stored_bytes();
            }
            (Some(_), None) => s.counts.deleted += 1,
            _ => {}
        }
        if let Some(g) = &change.guard
            && !s.protected.contains(g)
        {
            if s.protected.len() < PROTECTED_NAMED {
                s.protected.push(g.clone());
            } else {
                s.protected_more = true;
            }
        }
        let bytes = change.path.as_os_str().len();
        if s.changes.len() < MAX_LISTED && self.listed_path_bytes + bytes <= LISTED_PATH_BYTES {
            self.listed_path_bytes += bytes;
            s.changes.push(change);
        } else {
            s.summary.unlisted += 1;
        }
    }

    /// Whether the project's ignore rules (the innermost deciding) leave
    /// `rel` out: only an untracked path is ignored. `on_host`: the host
    /// has `rel`, which counts as tracked where the index cannot be read.
    fn ignored(&mut self, ignores: &[Gitignore], rel: &Path, is_dir: bool, on_host: bool) -> bool {
        let path = self.lower_root.join(rel);
        let matched = ignores.iter().rev().find_map(|g| {
            let m = g.matched_path_or_any_parents(&path, is_dir);
            (m.is_ignore() || m.is_whitelist()).then_some(m.is_ignore())
        });
        if matched != Some(true) {
            return false;
        }
        let tracked = self
            .tracked
            .get_or_insert_with(|| Tracked::load(self.lower_root));
        let key = rel.as_os_str().as_bytes();
        let tracked = if is_dir {
            tracked.under(key)
        } else {
            tracked.file(key)
        };
        !tracked.unwrap_or(on_host)
    }

    /// Whether the upper file `name` (in `dir`) is the host's `old` at
    /// `lower` unchanged: same type, mode, size, and contents.
    fn unchanged(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        new: &Entry,
        old: &Entry,
        lower: &Path,
    ) -> bool {
        if new.mode != old.mode || new.size != old.size {
            return false;
        }
        if new.is_symlink() {
            return new.target == old.target;
        }
        if !new.is_file() {
            // A FIFO, socket or device copied up: nothing else to compare.
            return true;
        }
        if new.size > self.compare_left {
            self.scan.summary.not_compared += 1;
            return false;
        }
        self.compare_left -= new.size;
        let Ok(upper) = open_regular(dir, name) else {
            return false;
        };
        let Ok(host) = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(lower)
        else {
            return false;
        };
        same_bytes(File::from(upper), host)
    }
}

/// Whether two readers yield the same bytes, read in chunks.
fn same_bytes(mut a: File, mut b: File) -> bool {
    let (mut x, mut y) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    loop {
        let Ok(n) = read_full(&mut a, &mut x) else {
            return false;
        };
        let Ok(m) = read_full(&mut b, &mut y) else {
            return false;
        };
        if n != m || x[..n] != y[..m] {
            return false;
        }
        if n == 0 {
            return true;
        }
    }
}

/// Fills `buf` as far as the file goes.
fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Opens the regular file `name` in `dir` for reading, never following a
/// symlink or blocking on a FIFO (the sandbox may have swapped it).
pub fn open_regular(dir: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if !FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode).is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(fd)
}

/// Opens the regular file at `rel` below `root`, one component at a time,
/// never following a symlink.
pub fn open_beneath(root: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let mut parts: Vec<&OsStr> = rel.iter().collect();
    let name = parts.pop().ok_or(std::io::ErrorKind::InvalidInput)?;
    let mut dir: Option<OwnedFd> = None;
    for part in parts {
        let at = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
        dir = Some(rustix::fs::openat(
            at,
            part,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
    }
    open_regular(dir.as_ref().map_or(root.as_fd(), |d| d.as_fd()), name)
}

/// An upper entry, described without following it anywhere.
fn upper_entry(dir: BorrowedFd<'_>, name: &OsStr, st: &rustix::fs::Stat) -> Entry {
    let target = (FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
        .then(|| rustix::fs::readlinkat(dir, name, Vec::new()).map(|t| t.into_bytes()))
        .and_then(Result::ok);
    Entry {
        mode: st.st_mode,
        size: st.st_size as u64,
        allocated: st.st_blocks as u64 * 512,
        target,
    }
}

/// A host entry, as the lower layer holds it.
fn lower_entry(path: &Path, meta: &std::fs::Metadata) -> Entry {
    let target = meta
        .file_type()
        .is_symlink()
        .then(|| std::fs::read_link(path).ok())
        .flatten()
        .map(|t| t.into_os_string().into_vec());
    Entry {
        mode: meta.mode(),
        size: meta.len(),
        allocated: meta.blocks() * 512,
        target,
    }
}

use std::os::unix::ffi::OsStringExt;

fn is_opaque(dir: BorrowedFd<'_>) -> bool {
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
