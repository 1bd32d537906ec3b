//! The files the project's git tracks, read from its index without running
//! git (whose configuration the repository controls: `core.fsmonitor` and
//! friends run programs). Ignore rules apply only to untracked files, so a
//! change to a tracked file is reported even where a pattern matches it.
//!
//! The index format (git's `Documentation/gitformat-index.txt`): a header
//! (`DIRC`, version 2, 3 or 4, entry count), then each entry: 40 bytes of
//! stat data, the object name (20 bytes, 32 in a SHA-256 repository), 16
//! bits of flags, 16 more with version 3's extended flag, and the path:
//! NUL-terminated and padded to a multiple of 8 (versions 2 and 3), or
//! prefix-compressed against the previous path (version 4). A split index
//! (`link` extension) keeps entries in another file: read as unknown.
//!
//! The index is read whole only up to [`MAX_INDEX_BYTES`] and its paths up
//! to [`MAX_PATH_BYTES`]; past either, or for any file this reader does not
//! understand, the answer is [`Tracked::Unknown`], and the caller counts
//! every file the host has as tracked.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Largest index read (a repository of a few hundred thousand files).
const MAX_INDEX_BYTES: u64 = 64 << 20;
/// Most bytes of tracked paths held.
const MAX_PATH_BYTES: usize = 16 << 20;

/// What the index says.
#[derive(Debug)]
pub enum Tracked {
    /// Not a git repository: every file is untracked.
    NotARepository,
    /// The tracked paths, sorted bytewise (as git sorts them).
    Paths(Vec<Box<[u8]>>),
    /// An index this reader cannot take; the caller assumes the worst.
    Unknown,
}

impl Tracked {
    /// Reads the index of the repository at `project` (its `.git`
    /// directory, or the one a `.git` file names).
    pub fn load(project: &Path) -> Tracked {
        let dot_git = project.join(".git");
        let Ok(meta) = dot_git.symlink_metadata() else {
            return Tracked::NotARepository;
        };
        let git_dir = if meta.is_dir() {
            dot_git
        } else if meta.is_file() {
            match read_small(&dot_git, 4096)
                .ok()
                .and_then(|t| gitdir_of(&t, project))
            {
                Some(dir) => dir,
                None => return Tracked::Unknown,
            }
        } else {
            return Tracked::Unknown;
        };
        if !git_dir.is_dir() {
            return Tracked::Unknown;
        }
        let sha256 = read_small(&git_dir.join("config"), 1 << 20)
            .map(|c| object_format_is_sha256(&c))
            .unwrap_or(false);
        match read_small(&git_dir.join("index"), MAX_INDEX_BYTES) {
            Ok(bytes) => {
                parse(&bytes, if sha256 { 32 } else { 20 }).map_or(Tracked::Unknown, Tracked::Paths)
            }
            // A repository without an index tracks nothing yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Tracked::Paths(Vec::new()),
            Err(_) => Tracked::Unknown,
        }
    }

    /// Whether the file `rel` is tracked; `None` when that is unknown.
    pub fn file(&self, rel: &[u8]) -> Option<bool> {
        match self {
            Tracked::NotARepository => Some(false),
            Tracked::Paths(p) => Some(p.binary_search_by(|x| (**x).cmp(rel)).is_ok()),
            Tracked::Unknown => None,
        }
    }

    /// Whether a tracked file lies under the directory `rel`; `None`
    /// when that is unknown.
    pub fn under(&self, rel: &[u8]) -> Option<bool> {
        match self {
            Tracked::NotARepository => Some(false),
            Tracked::Paths(p) => {
                let mut prefix = rel.to_vec();
                prefix.push(b'/');
                let at = p.partition_point(|x| **x < *prefix);
                Some(p.get(at).is_some_and(|x| x.starts_with(&prefix)))
            }
            Tracked::Unknown => None,
        }
    }
}

/// Reads at most `limit` bytes of a regular file, never blocking on a FIFO
/// and never following a symlink at the last component.
fn read_small(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() > limit {
        return Err(std::io::Error::other("not a regular file of a sane size"));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The directory a `.git` file (`gitdir: PATH`) names, relative to the project.
fn gitdir_of(text: &[u8], project: &Path) -> Option<PathBuf> {
    let text = std::str::from_utf8(text).ok()?;
    let dir = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    (!dir.is_empty()).then(|| project.join(dir))
}

/// Whether a git configuration sets `extensions.objectFormat = sha256`.
fn object_format_is_sha256(config: &[u8]) -> bool {
    let text = String::from_utf8_lossy(config).to_ascii_lowercase();
    let mut in_extensions = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_extensions = line.trim_start_matches('[').starts_with("extensions");
        } else if in_extensions
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == "objectformat"
        {
            return v.trim() == "sha256";
        }
    }
    false
}

/// The paths of an index whose object names are `hash_len` bytes; `None`
/// for anything malformed, unknown, split, or over the bounds.
fn parse(bytes: &[u8], hash_len: usize) -> Option<Vec<Box<[u8]>>> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4)? != b"DIRC" {
        return None;
    }
    let version = r.u32()?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = r.u32()? as usize;
    // Each entry takes at least 62 bytes: no count past what the file holds.
    if count > bytes.len() / 62 {
        return None;
    }
    let mut paths: Vec<Box<[u8]>> = Vec::with_capacity(count);
    let mut held = 0usize;
    let mut previous: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = r.at;
        r.take(40 + hash_len)?;
        let flags = r.u16()?;
        if version >= 3 && flags & 0x4000 != 0 {
            r.u16()?;
        }
        let path = if version == 4 {
            let strip = r.varint()?;
            let keep = previous.len().checked_sub(strip)?;
            let suffix = r.until_nul()?;
            let mut p = previous[..keep].to_vec();
            p.extend_from_slice(suffix);
            p
        } else {
            let name = r.until_nul()?.to_vec();
            // The entry, NUL included, is padded with NULs to a multiple of 8.
            let len = r.at - start;
            let padded = len.div_ceil(8) * 8;
            r.take(padded - len)?;
            name
        };
        held += path.len();
        // A sparse index's directory entries (ending in '/') stand for
        // files this reader cannot list.
        if held > MAX_PATH_BYTES || path.ends_with(b"/") {
            return None;
        }
        paths.push(path.as_slice().into());
        previous = path;
    }
    // Extensions: a split index keeps its entries elsewhere.
    while r.at + 8 <= bytes.len().saturating_sub(hash_len) {
        let signature = r.take(4)?;
        let size = r.u32()? as usize;
        if signature == b"link" {
            return None;
        }
        r.take(size)?;
    }
    paths.sort();
    paths.dedup();
    Some(paths)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(out)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn until_nul(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.at..)?;
        let len = rest.iter().position(|b| *b == 0)?;
        self.at += len + 1;
        Some(&rest[..len])
    }
    /// git's offset encoding (version 4's prefix length).
    fn varint(&mut self) -> Option<usize> {
        let mut byte = self.take(1)?[0];
        let mut value = (byte & 0x7f) as usize;
        while byte & 0x80 != 0 {
            byte = self.take(1)?[0];
            value = value
                .checked_add(1)?
                .checked_mul(128)?
                .checked_add((byte & 0x7f) as usize)?;
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) {
        let status = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "core.hooksPath=/dev/null",
            ])
            .args(args)
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    fn repository(version: &str) -> Option<tempfile::TempDir> {
        if Command::new("git").arg("--version").output().is_err() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q"]);
        for f in ["a.txt", "build/keep.log", "src/deep/x.rs", "src/y.rs"] {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, f).unwrap();
        }
        git(dir.path(), &["add", "."]);
        git(dir.path(), &["update-index", "--index-version", version]);
        Some(dir)
    }

    #[test]
    fn every_index_version_reads_the_same_paths() {
        for version in ["2", "3", "4"] {
            let Some(dir) = repository(version) else {
                panic!("git is needed to write real indexes");
            };
            let t = Tracked::load(dir.path());
            let Tracked::Paths(p) = &t else {
                panic!("index version {version}: {t:?}");
            };
            let p: Vec<&[u8]> = p.iter().map(|x| &**x).collect();
            assert_eq!(
                p,
                [
                    &b"a.txt"[..],
                    b"build/keep.log",
                    b"src/deep/x.rs",
                    b"src/y.rs"
                ],
                "version {version}"
            );
            assert_eq!(t.file(b"build/keep.log"), Some(true));
            assert_eq!(t.file(b"build/other.log"), Some(false));
            assert_eq!(t.under(b"build"), Some(true));
            assert_eq!(t.under(b"src/deep"), Some(true));
            assert_eq!(t.under(b"sr"), Some(false));
            assert_eq!(t.under(b"target"), Some(false));
        }
    }

    #[test]
    fn a_hostile_index_is_unknown_never_a_crash() {
        let good = {
            let dir = repository("2").unwrap();
            std::fs::read(dir.path().join(".git/index")).unwrap()
        };
        assert!(parse(&good, 20).is_some());
        // Every truncation, and a huge entry count, a bad version, a varint
        // that overflows, a prefix longer than the previous path.
        for n in 0..good.len() - 20 {
            let _ = parse(&good[..n], 20);
        }
        let mut huge = good.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse(&huge, 20).is_none());
        let mut version = good.clone();
        version[4..8].copy_from_slice(&9u32.to_be_bytes());
        assert!(parse(&version, 20).is_none());
        let mut v4 = b"DIRC\0\0\0\x04\0\0\0\x01".to_vec();
        v4.extend([0u8; 62]);
        v4.extend([0xff; 16]);
        assert!(parse(&v4, 20).is_none());
        let mut strip = b"DIRC\0\0\0\x04\0\0\0\x01".to_vec();
        strip.extend([0u8; 62]);
        strip.extend([5, b'a', 0]);
        assert!(parse(&strip, 20).is_none());
    }

    #[test]
    fn without_git_nothing_is_tracked_and_a_strange_git_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(Tracked::load(dir.path()), Tracked::NotARepository));
        std::fs::write(dir.path().join(".git"), "gitdir: /nonexistent/x\n").unwrap();
        assert!(matches!(Tracked::load(dir.path()), Tracked::Unknown));
        std::fs::remove_file(dir.path().join(".git")).unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        assert!(matches!(Tracked::load(dir.path()), Tracked::Paths(ref p) if p.is_empty()));
        std::fs::write(dir.path().join(".git/index"), b"garbage").unwrap();
        assert!(matches!(Tracked::load(dir.path()), Tracked::Unknown));
    }
}
