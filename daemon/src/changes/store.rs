//! The patches results point to, for the client to read as MCP resources:
//! bounded in number and in bytes, the oldest dropped first.

use std::collections::VecDeque;
use std::sync::Mutex;

/// The URI scheme and prefix of a stored patch.
pub const URI_PREFIX: &str = "nix-sandbox-mcp://changes/";

#[derive(Debug, Clone)]
pub struct StoredPatch {
    pub uri: String,
    /// What the patch is of, e.g. `bash run` or `python session "s"`.
    pub title: String,
    pub text: String,
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

    /// Keeps `text` and returns its URI.
    pub fn keep(&self, title: String, text: String) -> String {
        let mut guard = self.patches.lock().unwrap_or_else(|p| p.into_inner());
        let (next, list) = &mut *guard;
        *next += 1;
        let uri = format!("{URI_PREFIX}{next}");
        list.push_back(StoredPatch {
            uri: uri.clone(),
            title,
            text,
        });
        let bytes = |l: &VecDeque<StoredPatch>| l.iter().map(|p| p.text.len()).sum::<usize>();
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
