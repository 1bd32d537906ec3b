//! Which bubblewrap the server uses, and why. A user whose system's
//! bubblewrap is missing, too old or broken should not need root to fix
//! it: one installed beside this binary, or in a Nix profile
//! (`nix profile install nixpkgs#bubblewrap`), serves as well. Candidates,
//! in order, the first with every feature the jail uses winning (else the
//! first that runs, with the features it lacks said):
//!
//! | candidate | why it is looked at |
//! |---|---|
//! | `NIX_SANDBOX_BWRAP` | the operator named it: used or refused, nothing else tried |
//! | `bwrap` on `PATH` | the system's |
//! | `bwrap` beside this binary | an install that brings its own |
//! | `~/.nix-profile/bin`, `/nix/var/nix/profiles/default/bin`, `/run/current-system/sw/bin` | a Nix profile's, installable without root |

use std::path::{Path, PathBuf};
use std::process::Command;

use super::PlatformError;

pub use crate::config::knobs::BWRAP_VAR;

/// Options the jail uses that old releases lack, and the release each came in.
const FEATURES: &[(&str, &str)] = &[
    ("--disable-userns", "0.8"),
    ("--add-seccomp-fd", "0.5"),
    ("--json-status-fd", "0.5"),
];

/// The bubblewrap chosen.
#[derive(Debug, Clone)]
pub struct Chosen {
    pub path: PathBuf,
    pub version: String,
    /// Its `--help` text: which options it has.
    pub help: String,
    /// Why this one, in words (`first on PATH`, `beside this binary`, …).
    pub why: String,
    /// Those passed over before it, and why.
    pub passed_over: Vec<(PathBuf, String)>,
}

impl Chosen {
    /// The jail's options it lacks, with the release that brings each.
    pub fn missing(&self) -> Vec<String> {
        missing(&self.help)
    }
}

fn missing(help: &str) -> Vec<String> {
    FEATURES
        .iter()
        .filter(|(option, _)| !help.contains(option))
        .map(|(option, since)| format!("{option} (bubblewrap {since})"))
        .collect()
}

/// Finds the bubblewrap to use: `named` (by [`BWRAP_VAR`]) when given.
pub fn choose(named: Option<&Path>) -> Result<Chosen, PlatformError> {
    if let Some(named) = named {
        let path = named.to_path_buf();
        return try_run(&path)
            .map(|(version, help)| Chosen {
                path: path.clone(),
                version,
                help,
                why: format!("named by {BWRAP_VAR}"),
                passed_over: Vec::new(),
            })
            .map_err(|error| PlatformError::BwrapBroken { path, error });
    }
    choose_from(candidates())
}

/// The candidates after the variable, in order, each once.
fn candidates() -> Vec<(PathBuf, String)> {
    let mut found: Vec<(PathBuf, String)> = Vec::new();
    if let Ok(p) = which::which("bwrap") {
        found.push((p, "first on PATH".to_string()));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        found.push((dir.join("bwrap"), "beside this binary".to_string()));
    }
    if let Some(home) = std::env::var_os("HOME") {
        found.push((
            PathBuf::from(home).join(".nix-profile/bin/bwrap"),
            "from your Nix profile".to_string(),
        ));
    }
    for dir in [
        "/nix/var/nix/profiles/default/bin",
        "/run/current-system/sw/bin",
    ] {
        found.push((
            Path::new(dir).join("bwrap"),
            format!("from the Nix profile {dir}"),
        ));
    }
    let mut seen = Vec::new();
    found.retain(|(p, _)| {
        let key = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        let fresh = !seen.contains(&key);
        seen.push(key);
        fresh && p.is_file()
    });
    found
}

/// The first of `candidates` with every feature, else the first that runs.
fn choose_from(candidates: Vec<(PathBuf, String)>) -> Result<Chosen, PlatformError> {
    let mut passed_over = Vec::new();
    let mut fallback: Option<Chosen> = None;
    for (path, why) in candidates {
        match try_run(&path) {
            Ok((version, help)) => {
                let lacks = missing(&help);
                let chosen = Chosen {
                    path: path.clone(),
                    version: version.clone(),
                    help,
                    why,
                    passed_over: passed_over.clone(),
                };
                if lacks.is_empty() {
                    return Ok(chosen);
                }
                passed_over.push((path, format!("{version} lacks {}", lacks.join(", "))));
                fallback.get_or_insert(chosen);
            }
            Err(e) => passed_over.push((path, e)),
        }
    }
    match fallback {
        Some(mut chosen) => {
            chosen.passed_over = passed_over
                .into_iter()
                .filter(|(p, _)| *p != chosen.path)
                .collect();
            Ok(chosen)
        }
        None if passed_over.is_empty() => Err(PlatformError::NoBwrap),
        None => {
            let (path, error) = passed_over.remove(0);
            Err(PlatformError::BwrapBroken { path, error })
        }
    }
}

/// Its version and `--help` text, or why it does not run.
fn try_run(path: &Path) -> Result<(String, String), String> {
    let run = |arg: &str| {
        Command::new(path)
            .arg(arg)
            .output()
            .map_err(|e| e.to_string())
    };
    let version = run("--version")?;
    if !version.status.success() {
        return Err(format!("`{} --version` failed", path.display()));
    }
    let version = String::from_utf8_lossy(&version.stdout)
        .trim()
        .trim_start_matches("bubblewrap ")
        .to_string();
    let help = run("--help")?;
    let help =
        String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
    Ok((version, help))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, version: &str, help: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\ncase \"$1\" in --version) echo 'bubblewrap {version}';; *) echo '{help}';; esac\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    const FULL: &str = "--disable-userns --add-seccomp-fd --json-status-fd";

    #[test]
    fn the_first_with_every_feature_wins_and_the_others_are_said() {
        let dir = tempfile::tempdir().unwrap();
        let old = script(dir.path(), "old", "0.4.0", "--unshare-all");
        let broken = dir.path().join("missing");
        let good = script(dir.path(), "good", "0.11.0", FULL);
        let chosen = choose_from(vec![
            (old.clone(), "first on PATH".into()),
            (broken.clone(), "beside this binary".into()),
            (good.clone(), "from your Nix profile".into()),
        ])
        .unwrap();
        assert_eq!(chosen.path, good);
        assert_eq!(chosen.why, "from your Nix profile");
        assert_eq!(chosen.version, "0.11.0");
        assert!(chosen.missing().is_empty());
        assert_eq!(chosen.passed_over.len(), 2);
        assert!(
            chosen.passed_over[0]
                .1
                .contains("0.4.0 lacks --disable-userns (bubblewrap 0.8)"),
            "{:?}",
            chosen.passed_over
        );
    }

    #[test]
    fn without_a_complete_one_the_first_that_runs_is_used_and_its_gaps_said() {
        let dir = tempfile::tempdir().unwrap();
        let old = script(
            dir.path(),
            "old",
            "0.6.0",
            "--add-seccomp-fd --json-status-fd",
        );
        let older = script(dir.path(), "older", "0.4.0", "");
        let chosen = choose_from(vec![
            (old.clone(), "first on PATH".into()),
            (older.clone(), "x".into()),
        ])
        .unwrap();
        assert_eq!(chosen.path, old);
        assert_eq!(chosen.missing(), ["--disable-userns (bubblewrap 0.8)"]);
        assert_eq!(chosen.passed_over.len(), 1);
        assert!(matches!(
            choose_from(Vec::new()),
            Err(PlatformError::NoBwrap)
        ));
        assert!(matches!(
            choose_from(vec![(dir.path().join("none"), "x".into())]),
            Err(PlatformError::BwrapBroken { .. })
        ));
    }
}
