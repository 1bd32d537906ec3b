//! What a sandbox changed in an overlay project: the scan of its upper
//! layer (`scan.rs`), a summary for the result, and the whole change as a
//! git-style unified diff (`patch.rs`) that `git apply` takes. Binary files
//! and files over [`scan::DIFF_BYTES`] are named, not dumped; paths the
//! project's ignore rules cover (build output) are counted and left out;
//! changes to agent configuration files are flagged. Nothing here writes
//! to the host's tree: applying a patch is the user's decision.

mod patch;
mod scan;
mod store;

use std::hash::{Hash, Hasher};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

pub use patch::render;
pub use scan::scan;
pub use store::{PatchStore, StoredPatch, URI_PREFIX};

/// Paths (relative to the project; a trailing `/` for a directory) of agent
/// instructions and configuration, and of files the host runs by itself:
/// read-only in `readwrite` projects, flagged when an overlay's change
/// touches them.
pub const PROTECTED: &[&str] = &[
    ".mcp.json",
    "CLAUDE.md",
    "CLAUDE.local.md",
    "AGENTS.md",
    "GEMINI.md",
    ".cursorrules",
    ".windsurfrules",
    ".clinerules",
    ".claude/",
    ".cursor/",
    ".vscode/",
    ".gemini/",
    ".github/copilot-instructions.md",
    ".envrc",
    ".git/hooks/",
    ".git/config",
    ".nix-sandbox-mcp/",
];

/// A patch is cut past this size (at a file boundary, saying so).
pub const PATCH_BYTES: usize = 8 << 20;
/// A patch up to this size travels in the result itself.
pub const INLINE_BYTES: usize = 4096;

/// The changes a run left in the project, as its result reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub counts: Counts,
    pub ignored: usize,
    /// The first ignored paths by name (a directory ends in `/`).
    pub ignored_named: Vec<String>,
    /// Protected paths the change touches.
    pub protected: Vec<String>,
    /// The whole patch, when it is at most [`INLINE_BYTES`].
    pub patch: Option<String>,
    pub patch_bytes: usize,
    /// Where the whole patch can be read (an MCP resource).
    pub uri: String,
    /// Tells one state of the changes from another (a session's calls
    /// report them only when they differ from the previous call's).
    pub digest: u64,
}

/// Scans `upper` against the project at `project`, keeps the patch in
/// `store` (titled `title`), and reports; `None` when nothing changed.
/// Blocking: reads the changed files.
pub fn report(
    upper: &OwnedFd,
    project: &Path,
    protected: &[String],
    store: &PatchStore,
    title: String,
) -> std::io::Result<Option<Report>> {
    let scan = scan::scan(upper, project, protected)?;
    if scan.is_empty() {
        return Ok(None);
    }
    let text = patch::render(&scan, PATCH_BYTES);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&text, scan.ignored, &scan.ignored_named).hash(&mut hasher);
    let patch_bytes = text.len();
    let inline = (patch_bytes <= INLINE_BYTES).then(|| text.clone());
    Ok(Some(Report {
        counts: scan.counts(),
        ignored: scan.ignored,
        ignored_named: scan.ignored_named.clone(),
        protected: scan.protected_names(),
        patch: inline,
        patch_bytes,
        uri: store.keep(title, text),
        digest: hasher.finish(),
    }))
}

/// Whether the upper layer `upper` is still empty: nothing changed.
pub fn untouched(upper: &OwnedFd) -> bool {
    match rustix::fs::Dir::read_from(upper) {
        Ok(dir) => !dir
            .into_iter()
            .any(|e| e.is_ok_and(|e| e.file_name() != c"." && e.file_name() != c"..")),
        Err(_) => false,
    }
}

/// What a run did to the project, for its result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Note {
    /// An overlay's changes (a session's: all of them so far).
    pub report: Option<Report>,
    pub of_session: bool,
    /// Protected paths a run in a read-write project created.
    pub created_protected: Vec<String>,
}

/// What a scan found.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    /// Changed paths, sorted.
    pub changes: Vec<Change>,
    /// Paths left out because the project ignores them (an ignored
    /// directory counts once), and the first of them by name.
    pub ignored: usize,
    pub ignored_named: Vec<String>,
    /// Protected paths that were changed, created or deleted.
    pub protected: Vec<PathBuf>,
}

/// One changed path: `old` is the host's entry, `new` the sandbox's.
#[derive(Debug, Clone)]
pub struct Change {
    pub path: PathBuf,
    pub old: Option<Entry>,
    pub new: Option<Entry>,
}

/// A file, symlink, directory or special file, as far as a patch needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `st_mode`: the type and permission bits.
    pub mode: u32,
    pub size: u64,
    pub mtime: i64,
    pub content: Content,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// A regular file's bytes, or a symlink's target.
    Bytes(Vec<u8>),
    /// Over [`scan::DIFF_BYTES`]: compared by size and modification time.
    TooLarge,
    Unreadable,
    /// A directory, FIFO, socket or device: nothing to diff.
    None,
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFDIR: u32 = 0o040000;

impl Entry {
    fn file(mode: u32, size: u64, mtime: i64, content: Content) -> Entry {
        Entry {
            mode,
            size,
            mtime,
            content,
        }
    }

    fn symlink(target: Vec<u8>) -> Entry {
        Entry {
            mode: S_IFLNK | 0o777,
            size: target.len() as u64,
            mtime: 0,
            content: Content::Bytes(target),
        }
    }

    fn directory(mode: u32) -> Entry {
        Entry {
            mode: S_IFDIR | (mode & 0o7777),
            size: 0,
            mtime: 0,
            content: Content::None,
        }
    }

    fn special(mode: u32) -> Entry {
        Entry {
            mode,
            size: 0,
            mtime: 0,
            content: Content::None,
        }
    }

    pub fn is_file(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }

    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    /// Unchanged, as far as a patch can tell (the time of a copy-up is not a change).
    fn same_as(&self, other: &Entry) -> bool {
        if self.mode != other.mode || self.size != other.size {
            return false;
        }
        match (&self.content, &other.content) {
            (Content::Bytes(a), Content::Bytes(b)) => a == b,
            (Content::TooLarge, Content::TooLarge) => self.mtime == other.mtime,
            _ => false,
        }
    }
}

/// The summary a result reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Size of what was added or modified, as the sandbox left it.
    pub bytes: u64,
}

impl Scan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.ignored == 0 && self.protected.is_empty()
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for ch in &self.changes {
            match (&ch.old, &ch.new) {
                (None, Some(n)) => {
                    c.added += 1;
                    c.bytes += n.size;
                }
                (Some(_), Some(n)) => {
                    c.modified += 1;
                    c.bytes += n.size;
                }
                (Some(_), None) => c.deleted += 1,
                (None, None) => {}
            }
        }
        c
    }

    /// Protected paths that changed, as text.
    pub fn protected_names(&self) -> Vec<String> {
        self.protected
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }
}

/// Whether `rel` (relative to the project) is protected by `list`.
pub fn is_protected(list: &[String], rel: &Path) -> bool {
    let text = rel.to_string_lossy();
    list.iter().any(|p| match p.strip_suffix('/') {
        Some(dir) => text == dir || text.starts_with(&format!("{dir}/")),
        None => text == p.as_str(),
    })
}

#[cfg(test)]
mod tests;
