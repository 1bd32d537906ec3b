//! The tokens file: static bearer tokens, one principal a line,
//! `NAME sha256:HEX` (the hex SHA-256 of the token; `#` starts a comment).
//! Only hashes are kept, a presented token is compared with every one in
//! constant time, and a token is never logged. A file that users other
//! than its owner may write, or one in a directory they may write, is
//! refused: whoever could add a line could call as anyone.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::http::check_principal_name;

/// What a new token starts with: recognisable in a secret scanner, and
/// never mistaken for a JWT (which has two dots).
const TOKEN_PREFIX: &str = "nsm_";

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("cannot read the tokens file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "the tokens file {path} {why}; anyone who could write it could call as anyone (fix: chmod go-w, and keep it in a directory only its owner writes)"
    )]
    Unsafe { path: PathBuf, why: String },
    #[error("cannot write the tokens file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Name(String),
    #[error(
        "the tokens file {path} already has a principal named {name:?} (remove its line to replace its token)"
    )]
    Taken { path: PathBuf, name: String },
    #[error("no randomness for a token: {0}")]
    Random(getrandom::Error),
}

/// The principals of a tokens file, by the hash of their token.
#[derive(Default)]
pub struct Tokens {
    entries: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens")
            .field("principals", &names)
            .finish()
    }
}

impl Tokens {
    /// Reads and checks `path` (its permissions first).
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        check_safe(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Tokens::parse(&text, path)
    }

    /// Parses the file's text; `path` is only for messages.
    pub fn parse(text: &str, path: &Path) -> Result<Tokens, TokensError> {
        let mut entries = Vec::new();
        let mut names = BTreeSet::new();
        let mut hashes = BTreeSet::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |message: String| TokensError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                message,
            };
            let mut words = line.split_whitespace();
            let (Some(name), Some(hash), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(
                    "expected `NAME sha256:HEX` (a principal's name and the hex SHA-256 of its token)".into(),
                ));
            };
            check_principal_name(name).map_err(bad)?;
            let hash = parse_hash(hash).ok_or_else(|| {
                bad(format!(
                    "{name}'s hash is not `sha256:` and 64 hex digits (`nix-sandbox-mcp token add NAME` writes a line)"
                ))
            })?;
            if !names.insert(name.to_string()) {
                return Err(bad(format!("{name} has a line already")));
            }
            if !hashes.insert(hash) {
                return Err(bad(format!("{name}'s token is another principal's too")));
            }
            entries.push((name.to_string(), hash));
        }
        Ok(Tokens { entries })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal whose token `presented` is. Every hash is compared
    /// in full, whichever matches.
    pub fn principal(&self, presented: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (name, hash) in &self.entries {
            if bool::from(hash.ct_eq(&digest)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn parse_hash(word: &str) -> Option<[u8; 32]> {
    let hex = word.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Refuses a file (or its directory) that others than its owner may write,
/// or one owned by a user who is neither root nor the server's.
fn check_safe(path: &Path) -> Result<(), TokensError> {
    let unsafe_because = |why: String| TokensError::Unsafe {
        path: path.to_path_buf(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|source| TokensError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(unsafe_because(format!(
            "belongs to uid {}, not to this server's user (uid {me}) or root",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_because(format!(
            "may be written by its group or others (mode {:o})",
            meta.mode() & 0o777
        )));
    }
    if let Some(dir) = path.parent().and_then(|d| std::fs::metadata(d).ok()) {
        let sticky = dir.mode() & 0o1000 != 0;
        if dir.mode() & 0o022 != 0 && !sticky {
            return Err(unsafe_because(format!(
                "is in a directory its group or others may write (mode {:o})",
                dir.mode() & 0o777
            )));
        }
    }
    Ok(())
}

/// Makes a token for `name`, has `show` show it (the only time it is ever
/// shown), and then, if it was shown, appends its line to `path` (created
/// with mode 0600). Whether it was added.
pub fn add(path: &Path, name: &str, show: impl FnOnce(&str) -> bool) -> Result<bool, TokensError> {
    check_principal_name(name).map_err(TokensError::Name)?;
    if path.exists() {
        let existing = Tokens::load(path)?;
        if existing.entries.iter().any(|(n, _)| n == name) {
            return Err(TokensError::Taken {
                path: path.to_path_buf(),
                name: name.to_string(),
            });
        }
    }
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(TokensError::Random)?;
    let token = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(secret));
    let mut line = format!("{name} sha256:");
    for b in Sha256::digest(token.as_bytes()) {
        let _ = write!(line, "{b:02x}");
    }
    line.push('\n');
    let write = |source| TokensError::Write {
        path: path.to_path_buf(),
        source,
    };
    if !show(&token) {
        return Ok(false);
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(write)?;
    check_safe(path)?;
    file.write_all(line.as_bytes()).map_err(write)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn line(name: &str, token: &str) -> String {
        let hex: String = Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{name} sha256:{hex}")
    }

    #[test]
    fn a_token_names_its_principal_and_nothing_else_does() {
        let text = format!(
            "# the team\n{}\n\n{}  # CI\n",
            line("alice", "secret-a"),
            line("ci", "secret-c")
        );
        let t = Tokens::parse(&text, Path::new("t")).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.principal("secret-a"), Some("alice"));
        assert_eq!(t.principal("secret-c"), Some("ci"));
        for wrong in ["", "secret-", "secret-a ", "SECRET-A", "sha256:00"] {
            assert_eq!(t.principal(wrong), None, "{wrong:?}");
        }
        assert!(!format!("{t:?}").contains("sha256"), "{t:?}");
    }

    #[test]
    fn malformed_lines_are_refused_with_their_line() {
        let good = line("alice", "a");
        let cases = [
            ("alice".to_string(), "expected `NAME sha256:HEX`"),
            (format!("{good} extra"), "expected `NAME sha256:HEX`"),
            ("alice sha256:abc".to_string(), "64 hex digits"),
            ("alice md5:00".to_string(), "64 hex digits"),
            (format!("al/ice {}", &good[6..]), "principal's name"),
            (format!("{good}\n{good}"), "has a line already"),
            (
                format!("{good}\nbob {}", &good[6..]),
                "another principal's too",
            ),
        ];
        for (text, want) in cases {
            let e = Tokens::parse(&text, Path::new("/etc/t"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(want) && e.starts_with("/etc/t:"),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn add_appends_a_line_whose_token_works_once_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let made = |name: &str| {
            let mut shown = String::new();
            assert!(
                add(&path, name, |t| {
                    shown = t.to_string();
                    true
                })
                .unwrap()
            );
            shown
        };
        let a = made("alice");
        let b = made("bob");
        assert!(
            !add(&path, "carol", |_| false).unwrap(),
            "a token not shown is not added"
        );
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == 4 + 43, "{a}");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&a) && !text.contains(&b), "{text}");
        let t = Tokens::load(&path).unwrap();
        assert_eq!(
            (t.principal(&a), t.principal(&b)),
            (Some("alice"), Some("bob"))
        );
        assert!(matches!(
            add(&path, "alice", |_| true),
            Err(TokensError::Taken { .. })
        ));
        assert!(matches!(
            add(&path, "a b", |_| true),
            Err(TokensError::Name(_))
        ));
        assert_eq!(Tokens::load(&path).unwrap().len(), 2);
    }

    #[test]
    fn a_file_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, line("alice", "a")).unwrap();
        for mode in [0o620, 0o602, 0o666] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Tokens::load(&path).unwrap_err().to_string();
            assert!(
                e.contains("may be written by its group or others"),
                "{mode:o}: {e}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Tokens::load(&path).is_ok());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Tokens::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("in a directory its group or others may write"),
            "{e}"
        );
    }
}
