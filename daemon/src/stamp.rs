//! What a file's metadata says of its identity and its last change: two
//! equal stamps mean the file was not replaced or written in between, so
//! its text need not be read again.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of the file `path` names (links followed).
    pub fn of(path: &Path) -> std::io::Result<Stamp> {
        std::fs::metadata(path).map(|m| Stamp::from(&m))
    }

    /// The stamp of `path` itself (a link is not followed).
    pub fn of_entry(path: &Path) -> std::io::Result<Stamp> {
        std::fs::symlink_metadata(path).map(|m| Stamp::from(&m))
    }

    fn from(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}
