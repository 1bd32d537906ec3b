//! A scan as a git-style unified diff: `diff --git` headers, new, deleted
//! and mode lines, and hunks with three lines of context, so that `git
//! apply` takes it in the project's directory. Binary files, files too
//! large to diff, sparse files and special files are named ("Binary files
//! ... differ"); paths with unusual characters are quoted as git quotes
//! them, which keeps the text ASCII where names are not.
//!
//! Changes under a protected path (see `protect.rs`) are rendered apart,
//! one fragment per protected path, so that the default patch never
//! plants code the host runs; the user asks for a fragment by name.
//!
//! Contents are read here, one file at a time, and dropped once diffed:
//! the server's memory for a patch is bounded by [`PATCH_BYTES`] of text
//! plus two files of at most [`DIFF_BYTES`], and the reading by
//! [`READ_BYTES`] a patch, whatever the sandbox wrote.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use similar::TextDiff;

use super::scan::open_beneath;
use super::{Change, Entry, Scan};

/// Files larger than this are named, not diffed.
pub const DIFF_BYTES: u64 = 1 << 20;
/// A patch (its fragments included) is cut past this size, at a file
/// boundary, saying so.
pub const PATCH_BYTES: usize = 8 << 20;
/// Bytes of file contents read for one patch; past them files are named.
pub const READ_BYTES: u64 = 64 << 20;
/// How long diffing one file may take before the diff settles for a coarser result.
const DIFF_TIME: Duration = Duration::from_millis(200);
/// A file with less than this share of its size allocated is sparse:
/// named, not read (its holes read as zeros, a binary file).
const SPARSE_PERCENT: u64 = 50;

/// A rendered patch: the changes outside protected paths, and one
/// fragment per protected path.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Rendered {
    pub main: String,
    /// (protected path, its changes as a patch), in path order.
    pub fragments: Vec<(String, String)>,
    /// Changed paths past the cut, not shown.
    pub cut: usize,
    /// Files named without their contents because [`READ_BYTES`] was spent.
    pub unread: usize,
}

impl Rendered {
    /// Bytes held: the main patch and every fragment.
    pub fn bytes(&self) -> usize {
        self.main.len() + self.fragments.iter().map(|(_, f)| f.len()).sum::<usize>()
    }
}

/// Renders `scan`, reading the new contents from `upper` and the old from
/// the project at `lower`; cut past `limit` bytes (see [`PATCH_BYTES`]).
pub fn render(scan: &Scan, upper: &OwnedFd, lower: &Path, limit: usize) -> Rendered {
    let mut out = Rendered::default();
    let mut read_left = READ_BYTES;
    let mut held = 0usize;
    for (i, change) in scan.changes.iter().enumerate() {
        let mut contents = Contents {
            upper,
            lower,
            read_left: &mut read_left,
            unread: &mut out.unread,
        };
        let one = file_patch(change, &mut contents);
        if held + one.len() > limit {
            out.cut = scan.changes.len() - i;
            let _ = writeln!(
                out.main,
                "# patch cut at {limit} bytes: {} more changed path(s) not shown",
                out.cut
            );
            break;
        }
        held += one.len();
        match &change.guard {
            None => out.main.push_str(&one),
            Some(guard) => {
                let name = guard.to_string_lossy().into_owned();
                match out.fragments.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, text)) => text.push_str(&one),
                    None => out.fragments.push((name, one)),
                }
            }
        }
    }
    out.fragments.sort();
    out
}

/// Where a patch reads contents, and what it may still read.
struct Contents<'a> {
    upper: &'a OwnedFd,
    lower: &'a Path,
    read_left: &'a mut u64,
    unread: &'a mut usize,
}

/// One side of a file's diff.
enum Side {
    /// Absent (an added or deleted file's other side), or text.
    Text(String),
    /// Named, not shown, and why (empty for a plain binary file).
    Named(&'static str),
}

impl Contents<'_> {
    /// `entry` as text, when it is text; `upper` says which layer holds it.
    fn side(&mut self, entry: Option<&Entry>, rel: &Path, upper: bool) -> Side {
        let Some(e) = entry else {
            return Side::Text(String::new());
        };
        if let Some(target) = &e.target {
            return match String::from_utf8(target.clone()) {
                Ok(t) => Side::Text(t),
                Err(_) => Side::Named(""),
            };
        }
        if !e.is_file() {
            return Side::Named(" (not a regular file)");
        }
        if e.size > DIFF_BYTES {
            return Side::Named(" (too large to diff)");
        }
        if e.size > 4096 && e.allocated * 100 < e.size * SPARSE_PERCENT {
            return Side::Named(" (sparse file)");
        }
        if e.size > *self.read_left {
            *self.unread += 1;
            return Side::Named(" (not read: the patch's reading budget is spent)");
        }
        let file = if upper {
            open_beneath(self.upper, rel).map(File::from)
        } else {
            File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(self.lower.join(rel))
        };
        let Ok(file) = file else {
            return Side::Named(" (unreadable)");
        };
        let mut bytes = Vec::with_capacity(e.size as usize);
        if file.take(DIFF_BYTES + 1).read_to_end(&mut bytes).is_err() {
            return Side::Named(" (unreadable)");
        }
        *self.read_left = self.read_left.saturating_sub(bytes.len() as u64);
        if bytes.len() as u64 > DIFF_BYTES || bytes[..bytes.len().min(8000)].contains(&0) {
            return Side::Named("");
        }
        String::from_utf8(bytes).map_or(Side::Named(""), Side::Text)
    }
}

fn file_patch(c: &Change, contents: &mut Contents) -> String {
    let path = quote("", &c.path);
    let (a, b) = (quote("a/", &c.path), quote("b/", &c.path));
    let mut out = format!("diff --git {a} {b}\n");
    let old = c.old.as_ref().filter(|e| !e.is_dir());
    let new = c.new.as_ref().filter(|e| !e.is_dir());
    match (old, new) {
        (None, Some(n)) => {
            let _ = writeln!(out, "new file mode {:o}", n.mode);
        }
        (Some(o), None) => {
            let _ = writeln!(out, "deleted file mode {:o}", o.mode);
        }
        (Some(o), Some(n)) if o.mode != n.mode => {
            let _ = writeln!(out, "old mode {:o}\nnew mode {:o}", o.mode, n.mode);
        }
        (None, None) => {
            // A directory's permissions: git does not track them; say so.
            if let (Some(o), Some(n)) = (&c.old, &c.new) {
                return format!(
                    "# directory {path}: mode {:o} -> {:o} (not expressible in a patch)\n",
                    o.mode & 0o7777,
                    n.mode & 0o7777
                );
            }
            return String::new();
        }
        _ => {}
    }
    let from = if old.is_some() {
        a.as_str()
    } else {
        "/dev/null"
    };
    let to = if new.is_some() {
        b.as_str()
    } else {
        "/dev/null"
    };
    let before = contents.side(old, &c.path, false);
    let after = contents.side(new, &c.path, true);
    match (before, after) {
        (Side::Text(before), Side::Text(after)) => {
            if before == after {
                return out;
            }
            let diff = TextDiff::configure()
                .timeout(DIFF_TIME)
                .diff_lines(&before, &after);
            let _ = write!(
                out,
                "{}",
                diff.unified_diff().context_radius(3).header(from, to)
            );
        }
        (before, after) => {
            let why = match (after, before) {
                (Side::Named(why), _) | (_, Side::Named(why)) => why,
                _ => "",
            };
            let _ = writeln!(out, "Binary files {from} and {to} differ{why}");
        }
    }
    out
}

/// `prefix` and `path` as git writes them in a patch: as is when plain,
/// else in double quotes with C escapes (octal for bytes outside printable
/// ASCII).
fn quote(prefix: &str, path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = [prefix.as_bytes(), path.as_os_str().as_bytes()].concat();
    let plain = bytes
        .iter()
        .all(|b| (0x20..0x7f).contains(b) && *b != b'"' && *b != b'\\');
    if plain {
        return String::from_utf8_lossy(&bytes).into_owned();
    }
    let mut out = String::from("\"");
    for b in &bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x20..=0x7e => out.push(*b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}
