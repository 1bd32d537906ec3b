//! The patches results point to, for the client to read as MCP resources:
//! bounded in number and in bytes, the oldest dropped first. A patch is
//! kept with its protected fragments (see `patch.rs`), which a reader
//! asks for by name.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::Rendered;

/// The URI scheme and prefix of a stored patch.
pub const URI_PREFIX: &str = "nix-sandbox-mcp://changes/";

#[derive(Debug, Clone)]
pub struct StoredPatch {
    pub uri: String,
    /// What the patch is of, e.g. `bash run` or `python session "s"`.
    pub title: String,
    /// The patch, protected paths left out.
    pub text: String,
    /// (protected path, its changes as a patch).
    pub fragments: Vec<(String, String)>,
}

impl StoredPatch {
    fn bytes(&self) -> usize {
        self.text.len() + self.fragments.iter().map(|(_, f)| f.len()).sum::<usize>()
    }

    /// The patch with the fragments of the protected paths `include`
    /// (each by the name the result gave it); `Err` names one that the
    /// patch does not have.
    pub fn with(&self, include: &[String]) -> Result<String, String> {
        let mut text = self.text.clone();
        for name in include {
            match self.fragments.iter().find(|(n, _)| n == name) {
                Some((_, f)) => text.push_str(f),
                None => return Err(name.clone()),
            }
        }
        Ok(text)
    }

    /// The protected paths kept apart, by name.
    pub fn protected(&self) -> impl Iterator<Item = &str> {
        self.fragments.iter().map(|(n, _)| n.as_str())
    }
}

#[derive(Debug)]
pub struct PatchStore {
    patches: Mutex<(u64, VecDeque<StoredPatch>)>,
    max_count: usize,
    max_bytes: usize,
}

impl PatchStore {
    pub fn new(max_count: usize, max_bytes: usize) -> PatchStore {
        PatchStore {
            patches: Mutex::new((0, VecDeque::new())),
            max_count: max_count.max(1),
            max_bytes,
        }
    }

    /// Keeps `rendered` and returns its URI.
    pub fn keep(&self, title: String, rendered: Rendered) -> String {
        let mut guard = self.patches.lock().unwrap_or_else(|p| p.into_inner());
        let (next, list) = &mut *guard;
        *next += 1;
        let uri = format!("{URI_PREFIX}{next}");
        list.push_back(StoredPatch {
            uri: uri.clone(),
            title,
            text: rendered.main,
            fragments: rendered.fragments,
        });
        let bytes = |l: &VecDeque<StoredPatch>| l.iter().map(StoredPatch::bytes).sum::<usize>();
        while list.len() > self.max_count || (list.len() > 1 && bytes(list) > self.max_bytes) {
            list.pop_front();
        }
        uri
    }

    pub fn get(&self, uri: &str) -> Option<StoredPatch> {
        let guard = self.patches.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.iter().find(|p| p.uri == uri).cloned()
    }

    /// The patches kept, newest first.
    pub fn list(&self) -> Vec<StoredPatch> {
        let guard = self.patches.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.iter().rev().cloned().collect()
    }
}
