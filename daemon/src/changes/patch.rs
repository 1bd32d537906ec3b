//! A scan as a git-style unified diff: `diff --git` headers, new, deleted
//! and mode lines, and hunks with three lines of context, so that `git
//! apply` (or `patch -p1`) takes it in the project's directory. Binary
//! files, files too large to diff and special files are named ("Binary
//! files ... differ"); paths with unusual characters are quoted as git
//! quotes them, which keeps the text ASCII where names are not.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use similar::TextDiff;

use super::{Change, Content, Entry, Scan};

/// How long diffing one file may take before the diff settles for a coarser result.
const DIFF_TIME: Duration = Duration::from_millis(200);

/// The patch for `scan`, cut (at a file boundary, with a closing note) past
/// `limit` bytes.
pub fn render(scan: &Scan, limit: usize) -> String {
    let mut out = String::new();
    for (i, change) in scan.changes.iter().enumerate() {
        let one = file_patch(change);
        if out.len() + one.len() > limit {
            let _ = writeln!(
                out,
                "# patch cut at {limit} bytes: {} more changed path(s) not shown",
                scan.changes.len() - i
            );
            break;
        }
        out.push_str(&one);
    }
    out
}

fn file_patch(c: &Change) -> String {
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
    let text = |e: Option<&Entry>| -> Option<Option<String>> {
        match e {
            None => Some(None),
            Some(e) => match &e.content {
                Content::Bytes(b) if e.is_file() || e.is_symlink() => {
                    let binary = b[..b.len().min(8000)].contains(&0);
                    match (binary, String::from_utf8(b.clone())) {
                        (false, Ok(s)) => Some(Some(s)),
                        _ => None,
                    }
                }
                _ => None,
            },
        }
    };
    match (text(old), text(new)) {
        (Some(before), Some(after)) => {
            let before = before.unwrap_or_default();
            let after = after.unwrap_or_default();
            if before == after {
                return out;
            }
            let diff = TextDiff::configure()
                .timeout(DIFF_TIME)
                .diff_lines(&before, &after);
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
            let _ = write!(
                out,
                "{}",
                diff.unified_diff().context_radius(3).header(from, to)
            );
        }
        _ => {
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
            let why = match new.or(old).map(|e| &e.content) {
                Some(Content::TooLarge) => " (too large to diff)",
                Some(Content::Unreadable) => " (unreadable)",
                Some(Content::None) => " (not a regular file)",
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
