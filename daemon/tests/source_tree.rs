//! The source tree against itself: the architecture page names every
//! module, and the Nix build's source holds every file the unit tests read
//! (which `nix flake check` runs from that source alone).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The quoted string after each `marker` in `text`.
fn quoted_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    text.match_indices(marker)
        .filter_map(|(i, _)| {
            let rest = &text[i + marker.len()..];
            rest.split('"').next()
        })
        .collect()
}

#[test]
fn the_architecture_page_names_every_module() {
    let lib = read("daemon/src/lib.rs");
    let page = read("docs/architecture.md");
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ").or(l.strip_prefix("mod ")))
        .filter_map(|l| l.strip_suffix(';'))
        .filter(|m| *m != "skip")
        .collect();
    assert!(modules.len() > 20, "{modules:?}");
    for m in modules {
        assert!(
            page.contains(&format!("| `{m}` |")),
            "docs/architecture.md has no row for module `{m}`"
        );
    }
}

#[test]
fn the_nix_build_source_holds_every_file_the_unit_tests_read() {
    let nix = read("nix/daemon.nix");
    let mut files = Vec::new();
    rust_files(&root().join("daemon/src"), &mut files);
    let mut read_by_tests = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        read_by_tests.extend(
            quoted_after(&text, "source_path(\"")
                .into_iter()
                .map(str::to_string),
        );
        read_by_tests.extend(
            quoted_after(&text, "join(\"../")
                .into_iter()
                .map(str::to_string),
        );
    }
    assert!(
        read_by_tests.iter().any(|f| f == "docs/security.md"),
        "{read_by_tests:?}"
    );
    for rel in read_by_tests {
        assert!(
            nix.contains(&format!("../{rel}")),
            "the unit tests read {rel}, which nix/daemon.nix leaves out of the build's source"
        );
    }
}
