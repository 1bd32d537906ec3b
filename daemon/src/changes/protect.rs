//! Which changed paths are protected: agent instructions and configuration,
//! editor configuration, and files the host runs by itself (a repository's
//! `.git`, `.envrc`, hook managers), at any depth of the project, since a
//! tool that starts in a subdirectory reads that directory's; the paths the
//! operator adds (`[project] protected`, relative to the project's root);
//! and symlinks that lead out of the project, which a later build or copy
//! on the host would follow. A protected change is flagged in the result
//! and kept out of the default patch (see `patch.rs`).
//!
//! | rule                      | matches                                        |
//! |---------------------------|------------------------------------------------|
//! | [`ANYWHERE`] name         | that name as any path component, and below it |
//! | [`ANYWHERE`] `a/b`        | `a/b` at any depth, and below it               |
//! | operator's `p` / `p/`     | `p` from the project root (a dir: and below)   |
//! | symlink                   | absolute target, or `..` past the project root |

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Protected at any depth: a path whose components include one of these
/// sequences is protected from that component on (`sub/.git/config` is
/// under the protected `sub/.git`).
pub const ANYWHERE: &[&str] = &[
    // Agent instructions and configuration.
    ".mcp.json",
    "CLAUDE.md",
    "CLAUDE.local.md",
    "AGENTS.md",
    "AGENTS.override.md",
    "GEMINI.md",
    ".cursorrules",
    ".windsurfrules",
    ".clinerules",
    ".claude",
    ".codex",
    ".cursor",
    ".gemini",
    ".continue",
    ".github/copilot-instructions.md",
    // Editors, which run tasks and extensions a workspace names.
    ".vscode",
    ".idea",
    ".zed",
    // What the host runs by itself: a repository (hooks, fsmonitor,
    // redirects through commondir, alternates or gitdir files), direnv,
    // mise, hook managers.
    ".git",
    ".gitmodules",
    ".envrc",
    "mise.toml",
    ".mise.toml",
    ".husky",
    ".pre-commit-config.yaml",
    ".nix-sandbox-mcp",
];

/// The protection rules of one project.
#[derive(Debug, Clone, Default)]
pub struct Protection {
    /// The operator's paths, relative to the project's root (a trailing
    /// `/` for a directory and everything in it).
    configured: Vec<String>,
}

impl Protection {
    /// The built-in rules and `configured` (the operator's paths).
    pub fn new(configured: &[String]) -> Protection {
        Protection {
            configured: configured.to_vec(),
        }
    }

    /// The protected path that `rel` (relative to the project) is, or is
    /// under: the path the result names and the patch keeps apart.
    pub fn root_of(&self, rel: &Path) -> Option<PathBuf> {
        let parts: Vec<&[u8]> = rel.iter().map(|c| c.as_bytes()).collect();
        let anywhere = ANYWHERE
            .iter()
            .filter_map(|rule| {
                let rule: Vec<&[u8]> = rule.split('/').map(str::as_bytes).collect();
                parts
                    .windows(rule.len())
                    .position(|w| w == rule.as_slice())
                    .map(|at| at + rule.len())
            })
            .min();
        let configured = self
            .configured
            .iter()
            .filter_map(|p| {
                let dir = p.ends_with('/');
                let rule = Path::new(p.trim_end_matches('/'));
                let len = rule.iter().count();
                (rel == rule || (dir && rel.starts_with(rule))).then_some(len)
            })
            .min();
        let len = anywhere.into_iter().chain(configured).min()?;
        Some(rel.iter().take(len).collect())
    }
}

/// Whether a symlink at `rel` (relative to the project) with `target`
/// leads out of the project: an absolute target, or one whose `..`
/// climb above the project's root.
pub fn leaves_project(rel: &Path, target: &[u8]) -> bool {
    let target = Path::new(std::ffi::OsStr::from_bytes(target));
    if target.is_absolute() {
        return true;
    }
    // The link's own directory, as a depth below the root.
    let mut depth = rel.iter().count().saturating_sub(1) as i64;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(p: &Protection, rel: &str) -> Option<String> {
        p.root_of(Path::new(rel))
            .map(|r| r.to_string_lossy().into_owned())
    }

    #[test]
    fn built_in_rules_hold_at_any_depth() {
        let p = Protection::new(&[]);
        for (rel, want) in [
            (".git/config", Some(".git")),
            ("sub/.git/HEAD", Some("sub/.git")),
            ("a/b/.git", Some("a/b/.git")),
            ("sub/.envrc", Some("sub/.envrc")),
            ("deep/er/CLAUDE.md", Some("deep/er/CLAUDE.md")),
            ("x/.claude/settings.json", Some("x/.claude")),
            ("x/.vscode/tasks.json", Some("x/.vscode")),
            (
                "pkg/.github/copilot-instructions.md",
                Some("pkg/.github/copilot-instructions.md"),
            ),
            (".git/modules/m/.git/config", Some(".git")),
            ("src/lib.rs", None),
            ("src/.github/workflows/ci.yml", None),
            ("notes/CLAUDE.md.bak", None),
            ("git/config", None),
        ] {
            assert_eq!(root(&p, rel).as_deref(), want, "{rel}");
        }
    }

    #[test]
    fn the_operators_paths_hold_from_the_root() {
        let p = Protection::new(&["deploy/".to_string(), "secrets.toml".to_string()]);
        assert_eq!(root(&p, "deploy/key").as_deref(), Some("deploy"));
        assert_eq!(root(&p, "deploy").as_deref(), Some("deploy"));
        assert_eq!(root(&p, "secrets.toml").as_deref(), Some("secrets.toml"));
        assert_eq!(root(&p, "sub/deploy/key"), None);
        assert_eq!(root(&p, "secrets.toml.d/x"), None);
    }

    #[test]
    fn symlinks_out_of_the_project_are_told_apart() {
        let out = |rel: &str, t: &str| leaves_project(Path::new(rel), t.as_bytes());
        assert!(out("build", "/home/u/.bashrc"));
        assert!(out("build", "../x"));
        assert!(out("a/b/link", "../../../x"));
        assert!(out("a/link", "b/../../../x"));
        assert!(!out("a/b/link", "../../x"));
        assert!(!out("link", "src/lib.rs"));
        assert!(!out("a/link", "./b/../c"));
    }
}
