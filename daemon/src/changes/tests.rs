//! Tests of the change reports: scans of real upper layers, the patch's
//! format and its cuts, ignored and protected paths.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::*;

fn open_dir(p: &Path) -> OwnedFd {
    rustix::fs::open(
        p,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap()
}

fn protected() -> Vec<String> {
    PROTECTED.iter().map(|s| s.to_string()).collect()
}

/// A host tree and an upper layer as overlayfs would leave it after some
/// edits (whiteouts only where this process may make device nodes).
fn layers() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    for d in [&lower, &upper] {
        fs::create_dir(d).unwrap();
    }
    fs::write(lower.join(".gitignore"), "target/\n*.log\n").unwrap();
    fs::write(lower.join("same.txt"), "same\n").unwrap();
    fs::write(lower.join("edit.txt"), "one\ntwo\nthree\n").unwrap();
    fs::create_dir(lower.join("src")).unwrap();
    fs::write(lower.join("src/lib.rs"), "fn a() {}\n").unwrap();
    // Upper: an unchanged copy-up, an edit, new files, build output.
    fs::write(upper.join("same.txt"), "same\n").unwrap();
    fs::write(upper.join("edit.txt"), "one\n2\nthree\n").unwrap();
    fs::write(upper.join("new.txt"), "fresh\n").unwrap();
    fs::write(upper.join("blob.bin"), [0u8, 1, 2, 0]).unwrap();
    fs::write(upper.join("CLAUDE.md"), "do as I say\n").unwrap();
    fs::write(upper.join("run.log"), "noise\n").unwrap();
    fs::create_dir_all(upper.join("target/debug")).unwrap();
    fs::write(upper.join("target/debug/app"), "elf").unwrap();
    fs::create_dir(upper.join("src")).unwrap();
    (dir, lower, upper)
}

#[test]
fn a_scan_lists_what_changed_and_nothing_else() {
    let (_dir, lower, upper) = layers();
    let scan = scan(&open_dir(&upper), &lower, &protected()).unwrap();
    let paths: Vec<_> = scan
        .changes
        .iter()
        .map(|c| c.path.to_string_lossy().into_owned())
        .collect();
    assert_eq!(paths, ["CLAUDE.md", "blob.bin", "edit.txt", "new.txt"]);
    assert_eq!(
        scan.counts(),
        Counts {
            added: 3,
            modified: 1,
            deleted: 0,
            bytes: 12 + 4 + 12 + 6
        }
    );
    assert_eq!(scan.ignored, 2, "{:?}", scan.ignored_named);
    assert_eq!(scan.ignored_named, ["run.log", "target/"]);
    assert_eq!(scan.protected_names(), ["CLAUDE.md"]);
}

#[test]
fn whiteouts_and_opaque_directories_are_deletions() {
    let (_dir, lower, upper) = layers();
    let whiteout = |p: &Path| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            0,
        )
    };
    if whiteout(&upper.join("same.txt.probe")).is_err() {
        eprintln!("SKIP: this user cannot make the device nodes overlayfs uses as whiteouts");
        return;
    }
    fs::remove_file(upper.join("same.txt.probe")).unwrap();
    fs::remove_file(upper.join("same.txt")).unwrap();
    whiteout(&upper.join("same.txt")).unwrap();
    // src/ replaced by an opaque directory holding one new file.
    fs::write(upper.join("src/main.rs"), "fn main() {}\n").unwrap();
    rustix::fs::setxattr(
        upper.join("src"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let scan = scan(&open_dir(&upper), &lower, &protected()).unwrap();
    let kinds: Vec<_> = scan
        .changes
        .iter()
        .map(|c| {
            (
                c.path.to_string_lossy().into_owned(),
                c.old.is_some(),
                c.new.is_some(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("same.txt".into(), true, false)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("src/lib.rs".into(), true, false)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("src/main.rs".into(), false, true)),
        "{kinds:?}"
    );
}

#[test]
fn the_patch_is_git_style_and_names_binary_files() {
    let (_dir, lower, upper) = layers();
    let scan = scan(&open_dir(&upper), &lower, &protected()).unwrap();
    let patch = render(&scan, 1 << 20);
    assert!(patch.contains("diff --git a/edit.txt b/edit.txt\n--- a/edit.txt\n+++ b/edit.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"), "{patch}");
    assert!(patch.contains("diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+fresh\n"), "{patch}");
    assert!(
        patch.contains("Binary files /dev/null and b/blob.bin differ"),
        "{patch}"
    );
    assert!(
        !patch.contains("target") && !patch.contains("run.log") && !patch.contains("same.txt"),
        "{patch}"
    );
}

#[test]
fn a_patch_over_its_limit_is_cut_between_files_and_says_so() {
    let (_dir, lower, upper) = layers();
    let scan = scan(&open_dir(&upper), &lower, &protected()).unwrap();
    let patch = render(&scan, 200);
    assert!(patch.len() < 300, "{patch}");
    assert!(patch.contains("more changed path(s) not shown"), "{patch}");
}

#[test]
fn deleted_files_and_mode_changes() {
    let change = |old: Option<Entry>, new: Option<Entry>| Scan {
        changes: vec![Change {
            path: "dir/x y.sh".into(),
            old,
            new,
        }],
        ..Scan::default()
    };
    let file = |mode: u32, text: &str| {
        Entry::file(
            0o100000 | mode,
            text.len() as u64,
            0,
            Content::Bytes(text.into()),
        )
    };
    let patch = render(&change(Some(file(0o644, "gone\n")), None), 1 << 20);
    assert_eq!(
        patch,
        "diff --git a/dir/x y.sh b/dir/x y.sh\ndeleted file mode 100644\n--- a/dir/x y.sh\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n"
    );
    let patch = render(
        &change(Some(file(0o644, "s\n")), Some(file(0o755, "s\n"))),
        1 << 20,
    );
    assert_eq!(
        patch,
        "diff --git a/dir/x y.sh b/dir/x y.sh\nold mode 100644\nnew mode 100755\n"
    );
}

#[test]
fn unusual_names_are_quoted_as_git_quotes_them() {
    let scan = Scan {
        changes: vec![Change {
            path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"caf\xc3\xa9 \"q\".txt")),
            old: None,
            new: Some(Entry::file(0o100644, 0, 0, Content::Bytes(Vec::new()))),
        }],
        ..Scan::default()
    };
    let patch = render(&scan, 1 << 20);
    assert!(
        patch.starts_with(
            "diff --git \"a/caf\\303\\251 \\\"q\\\".txt\" \"b/caf\\303\\251 \\\"q\\\".txt\"\n"
        ),
        "{patch}"
    );
}

#[test]
fn the_store_keeps_the_newest_within_its_bounds() {
    let store = PatchStore::new(2, 1 << 20);
    let first = store.keep("one".into(), "a".into());
    let second = store.keep("two".into(), "b".into());
    let third = store.keep("three".into(), "c".into());
    assert!(store.get(&first).is_none());
    assert_eq!(store.get(&second).unwrap().text, "b");
    assert_eq!(
        store
            .list()
            .iter()
            .map(|p| p.uri.clone())
            .collect::<Vec<_>>(),
        [third, second]
    );
    let small = PatchStore::new(10, 3);
    small.keep("x".into(), "xx".into());
    let kept = small.keep("y".into(), "yy".into());
    assert_eq!(small.list().len(), 1);
    assert!(small.get(&kept).is_some());
}
