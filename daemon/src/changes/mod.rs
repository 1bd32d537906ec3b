//! What a sandbox changed in an overlay project: the scan of its upper
//! layer (`scan.rs`), a summary for the result, and the whole change as a
//! git-style unified diff (`patch.rs`) that `git apply` takes. Binary files
//! and files over [`patch::DIFF_BYTES`] are named, not dumped; untracked
//! paths the project's ignore rules cover (build output) are counted and
//! left out (`tracked.rs`); changes to protected paths — agent and editor
//! configuration, `.git`, `.envrc` at any depth, symlinks out of the
//! project (`protect.rs`) — are flagged and kept out of the default patch.
//! Everything here is bounded in memory whatever the sandbox wrote, and
//! what was counted or named instead of read is said. Nothing here writes
//! to the host's tree: applying a patch is the user's decision.

mod patch;
mod protect;
mod scan;
mod store;
mod tracked;

use std::hash::{Hash, Hasher};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

pub use patch::{PATCH_BYTES, Rendered, render};
pub use protect::{ANYWHERE as PROTECTED, Protection};
pub use scan::{MAX_DEPTH, scan};
pub use store::{PatchStore, StoredPatch, URI_PREFIX};

/// A patch up to this size travels in the result itself.
pub const INLINE_BYTES: usize = 4096;

/// The changes a run left in the project, as its result reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub counts: Counts,
    pub ignored: usize,
    /// The first ignored paths by name (a directory ends in `/`).
    pub ignored_named: Vec<String>,
    /// Protected paths the change touches (left out of the patch), and
    /// whether there are more than those named.
    pub protected: Vec<String>,
    pub protected_more: bool,
    /// The whole patch (protected paths left out), when it is at most
    /// [`INLINE_BYTES`].
    pub patch: Option<String>,
    pub patch_bytes: usize,
    /// Where the whole patch can be read (an MCP resource).
    pub uri: String,
    /// What was counted or named instead of read, in sentences.
    pub summarized: Vec<String>,
    /// Tells one state of the changes from another (a session's calls
    /// report them only when they differ from the previous call's).
    pub digest: u64,
}

/// Scans `upper` against the project at `project`, keeps the patch in
/// `store` (titled `title`), and reports; `None` when nothing changed.
/// `protected`: the operator's protected paths besides the built-in ones.
/// Blocking: reads the changed files.
pub fn report(
    upper: &OwnedFd,
    project: &Path,
    protected: &[String],
    store: &PatchStore,
    title: String,
) -> std::io::Result<Option<Report>> {
    let scan = scan::scan(upper, project, &Protection::new(protected))?;
    if scan.is_empty() {
        return Ok(None);
    }
    let rendered = patch::render(&scan, upper, project, PATCH_BYTES);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&rendered, scan.ignored, &scan.ignored_named).hash(&mut hasher);
    let patch_bytes = rendered.main.len();
    let inline = (patch_bytes <= INLINE_BYTES).then(|| rendered.main.clone());
    let summarized = scan.summary.sentences(&rendered);
    Ok(Some(Report {
        counts: scan.counts,
        ignored: scan.ignored,
        ignored_named: scan.ignored_named.clone(),
        protected: scan.protected_names(),
        protected_more: scan.protected_more,
        patch: inline,
        patch_bytes,
        uri: store.keep(title, rendered),
        summarized,
        digest: hasher.finish(),
    }))
}

/// Whether the upper layer `upper` is still empty: nothing changed. Reads
/// the descriptor's own entries (one system call for an empty directory;
/// `upper` is opened for this look, so moving its offset costs nothing).
pub fn untouched(upper: &OwnedFd) -> bool {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 512];
    let mut entries = rustix::fs::RawDir::new(upper, &mut buf);
    while let Some(entry) = entries.next() {
        match entry {
            Ok(e) if e.file_name() == c"." || e.file_name() == c".." => {}
            _ => return false,
        }
    }
    true
}

/// What a run did to the project, for its result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Note {
    /// An overlay's changes (a session's: all of them so far).
    pub report: Option<Box<Report>>,
    pub of_session: bool,
    /// Protected paths a run in a read-write project created.
    pub created_protected: Vec<String>,
}

/// What a scan found.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    /// Changed paths, sorted (at most [`scan::MAX_LISTED`]).
    pub changes: Vec<Change>,
    /// Every change, listed or not.
    pub counts: Counts,
    /// Paths left out because the project ignores them (an ignored
    /// directory counts once), and the first of them by name.
    pub ignored: usize,
    pub ignored_named: Vec<String>,
    /// Protected paths that were changed, created or deleted (the first
    /// ones), and whether there were more.
    pub protected: Vec<PathBuf>,
    pub protected_more: bool,
    /// What was counted instead of read.
    pub summary: Summary,
}

/// What a scan counted instead of reading.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Directories deeper than [`MAX_DEPTH`], not read, and the first.
    pub too_deep: usize,
    pub first_too_deep: Option<PathBuf>,
    /// Changes counted but not listed (past the scan's bounds).
    pub unlisted: usize,
    /// Files of the host's size reported as modified without a comparison.
    pub not_compared: usize,
    /// Entries the scan could not read.
    pub unreadable: usize,
}

impl Summary {
    fn too_deep(&mut self, rel: &Path) {
        self.too_deep += 1;
        if self.first_too_deep.is_none() {
            self.first_too_deep = Some(rel.to_path_buf());
        }
    }

    /// What the result says about what was summarized instead of read.
    fn sentences(&self, rendered: &Rendered) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(first) = &self.first_too_deep {
            let shown: String = first.to_string_lossy().chars().take(120).collect();
            out.push(format!(
                "{} director{} deeper than {MAX_DEPTH} levels {} not read (the first: {shown}…); their contents are not in the counts or the patch",
                self.too_deep,
                if self.too_deep == 1 { "y" } else { "ies" },
                if self.too_deep == 1 { "was" } else { "were" },
            ));
        }
        if self.unlisted > 0 {
            out.push(format!(
                "{} changed paths past the first {} are counted but not in the patch",
                self.unlisted,
                scan::MAX_LISTED
            ));
        }
        if self.not_compared > 0 {
            out.push(format!(
                "{} files of the same size as the user's are reported as modified without comparing their contents (the scan compares at most {} MiB)",
                self.not_compared,
                scan::COMPARE_BYTES >> 20
            ));
        }
        if self.unreadable > 0 {
            out.push(format!(
                "{} entries could not be read and are left out",
                self.unreadable
            ));
        }
        if rendered.unread > 0 {
            out.push(format!(
                "{} files are named in the patch without their contents (it reads at most {} MiB of files)",
                rendered.unread,
                patch::READ_BYTES >> 20
            ));
        }
        if rendered.cut > 0 {
            out.push(format!(
                "the patch is cut at {} MiB: {} changed paths are not in it",
                PATCH_BYTES >> 20,
                rendered.cut
            ));
        }
        out
    }
}

/// One changed path: `old` is the host's entry, `new` the sandbox's.
#[derive(Debug, Clone)]
pub struct Change {
    pub path: PathBuf,
    pub old: Option<Entry>,
    pub new: Option<Entry>,
    /// The protected path it is (or is under): kept out of the default patch.
    pub guard: Option<PathBuf>,
}

/// A file, symlink, directory or special file, as far as a patch needs it;
/// contents are read only while the patch is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `st_mode`: the type and permission bits.
    pub mode: u32,
    /// The size the file claims (`st_size`).
    pub size: u64,
    /// What it takes on disk (less than `size` for a sparse file).
    pub allocated: u64,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFDIR: u32 = 0o040000;

impl Entry {
    fn directory(mode: u32) -> Entry {
        Entry {
            mode: S_IFDIR | (mode & 0o7777),
            size: 0,
            allocated: 0,
            target: None,
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

    /// What the entry holds: its size, or less where it is sparse (a
    /// small file may be stored with its inode, taking no block).
    fn stored_bytes(&self) -> u64 {
        match &self.target {
            Some(t) => t.len() as u64,
            None if self.size <= 4096 => self.size,
            None => self.size.min(self.allocated),
        }
    }
}

/// The summary a result reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    /// What was added or modified takes, as the sandbox left it (a sparse
    /// file's holes are not counted).
    pub bytes: u64,
}

impl Scan {
    pub fn is_empty(&self) -> bool {
        self.counts == Counts::default()
            && self.changes.is_empty()
            && self.ignored == 0
            && self.protected.is_empty()
            && self.summary == Summary::default()
    }

    /// Protected paths that changed, as text.
    pub fn protected_names(&self) -> Vec<String> {
        self.protected
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests;
