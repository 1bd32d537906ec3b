//! The mount table as /proc/self/mountinfo gives it, parsed in one place
//! for the modules that look mounts up (the cgroup hierarchies, the removal
//! of runtime directories left by killed servers).

use std::path::PathBuf;

/// One mount.
#[derive(Debug)]
pub struct Mount {
    /// The path within its filesystem that is mounted (a bind's source).
    pub root: String,
    pub point: PathBuf,
    pub fstype: String,
    /// The filesystem's own options (the superblock's), comma-separated.
    pub options: String,
}

/// The mounts of this process's mount namespace; none where the table
/// cannot be read.
pub fn mounts() -> Vec<Mount> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// Parses the text of a mountinfo file.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some(Mount {
                root: unescape(pre.get(3)?),
                point: PathBuf::from(unescape(pre.get(4)?)),
                fstype: post.first()?.to_string(),
                options: post.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes of space, tab, newline and backslash.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_points_roots_types_and_escapes() {
        let text = "36 25 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
                    40 25 8:1 /a\\040b /mnt/with\\040space rw - ext4 /dev/sda1 rw,relatime\n\
                    bad line\n";
        let m = parse(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(
            (m[0].fstype.as_str(), m[0].options.as_str()),
            ("cgroup", "rw,memory")
        );
        assert_eq!(m[1].root, "/a b");
        assert_eq!(m[1].point, PathBuf::from("/mnt/with space"));
    }
}
