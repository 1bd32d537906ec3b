//! Reading a project's command declarations (`.nix-sandbox-mcp/commands.toml`)
//! safely, and locating problems in a declaration's text: the file, the line
//! and the key, for every error and warning.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::declaration::{CommandDecl, CommandName};

/// Longest accepted project file.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The project file as written: only `[commands.NAME]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectFile {
    #[serde(default)]
    commands: BTreeMap<CommandName, CommandDecl>,
}

/// A problem in a declaration, for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// The key, such as `commands.test.params.filter.pattern`.
    pub key: String,
    pub message: String,
    pub fix: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(
            f,
            ": key `{}`: {}\n  fix: {}",
            self.key, self.message, self.fix
        )
    }
}

impl std::error::Error for Diagnostic {}

/// A declaration file's text, to find the line of a key.
#[derive(Debug, Clone)]
pub struct Source {
    pub file: PathBuf,
    pub text: String,
}

impl Source {
    /// Reads the file; the text is only used to point at lines, so a file
    /// that cannot be read again gives messages without them.
    pub fn read_for_lines(file: &Path) -> Source {
        Source {
            file: file.to_path_buf(),
            text: std::fs::read_to_string(file).unwrap_or_default(),
        }
    }

    /// A diagnostic at `path` (under `commands`), on the line of the
    /// deepest part of the path found in the file.
    pub fn diagnostic(
        &self,
        path: &[&str],
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Diagnostic {
        let full: Vec<&str> = std::iter::once("commands")
            .chain(path.iter().copied())
            .collect();
        Diagnostic {
            file: self.file.clone(),
            line: line_of_key(&self.text, &full),
            key: full.join("."),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

/// The 1-based line of the deepest key of `path` that the document has.
pub(super) fn line_of_key(text: &str, path: &[&str]) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut found = None;
    for key in path {
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == *key) else {
            break;
        };
        found = Some(k.span().start);
        match v.get_ref() {
            toml::de::DeValue::Table(t) => table = t,
            _ => break,
        }
    }
    found.map(|offset| line_of(text, offset))
}

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

/// Reads the project file at `path` (a regular file, not a symlink, at most
/// 1 MiB); `Ok(None)` when there is none.
pub fn read_project_file(path: &Path) -> Result<Option<String>, Diagnostic> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let problem = |message: String, fix: &str| Diagnostic {
        file: path.to_path_buf(),
        line: None,
        key: "commands".to_string(),
        message,
        fix: fix.to_string(),
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(problem(
                format!("cannot read {}: {e}", dir.display()),
                "make it readable",
            ));
        }
        Ok(m) if !m.is_dir() => {
            return Err(problem(
                format!(
                    "{} is not a directory (a symlink is not followed)",
                    dir.display()
                ),
                "make .nix-sandbox-mcp a real directory in the project",
            ));
        }
        Ok(_) => {}
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(problem(
                "the file is a symlink, which is not followed".to_string(),
                "make it a regular file in the project",
            ));
        }
        Err(e) => return Err(problem(format!("cannot read it: {e}"), "make it readable")),
    };
    let meta = file
        .metadata()
        .map_err(|e| problem(format!("cannot read it: {e}"), "make it readable"))?;
    if !meta.is_file() {
        return Err(problem(
            "it is not a regular file".into(),
            "make it a regular file",
        ));
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| {
            problem(
                format!("cannot read it as UTF-8 text: {e}"),
                "save it as UTF-8",
            )
        })?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(problem(
            format!("it is larger than {MAX_FILE_BYTES} bytes"),
            "declare fewer commands",
        ));
    }
    Ok(Some(text))
}

/// Parses the project file's text: `[commands.NAME]` tables only.
pub fn parse_project_file(
    text: &str,
    file: &Path,
) -> Result<BTreeMap<String, CommandDecl>, Diagnostic> {
    let invalid = |key: String, span: Option<std::ops::Range<usize>>, message: String| {
        let key = if key.is_empty() || key == "." {
            "commands".to_string()
        } else {
            key
        };
        Diagnostic {
            file: file.to_path_buf(),
            line: span.map(|s| line_of(text, s.start)),
            key,
            message,
            fix: "see docs/commands.md for the keys of [commands.NAME] and their values"
                .to_string(),
        }
    };
    let deserializer = toml::de::Deserializer::parse(text)
        .map_err(|e| invalid(String::new(), e.span(), e.message().trim().to_string()))?;
    let raw: ProjectFile = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        invalid(key, inner.span(), inner.message().trim().to_string())
    })?;
    Ok(raw.commands.into_iter().map(|(k, v)| (k.0, v)).collect())
}
