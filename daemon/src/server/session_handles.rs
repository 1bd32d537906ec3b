//! Sessions under the stateless revision (2026-07-28), which has no
//! connection to scope a session's name, and over HTTP under both: a
//! session a caller names gets a handle (`ids.rs`: `s_`, the replica's name
//! when there are replicas, and 128 random bits), bound to that caller (its
//! principal). The session table is keyed by the handle; the name stays an
//! alias in the caller's own scope, so calls may name either. A handle is
//! refused to anyone but its principal, one of another replica is said to
//! be held there, and one that was never issued (forged, or from another
//! server or before a restart) is told apart from a name. Under 2025-11-25
//! on stdio names key the table as they are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::ids;
use crate::sync::Recover;

const PREFIX: &str = "s_";
/// Names (aliases) remembered at once, over every principal. When the table
/// is full, the names of sessions no longer open are let go: open sessions
/// are far fewer (`max_sessions`), so no caller can fill it for the others.
const MAX_ALIASES: usize = 4096;

/// Why a session named in a call cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// A handle this server never issued (or no longer knows).
    UnknownHandle,
    /// A handle issued to another principal.
    OtherPrincipal,
    /// A handle of another replica, which holds the session.
    OtherReplica(String),
    /// Too many names: no handle for a new one.
    TooManyNames,
}

/// The session a call reaches: the key of the table, and its handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub handle: String,
}

#[derive(Debug, Default)]
pub struct Handles {
    inner: Mutex<Tables>,
    /// This server's name among replicas, put in the handles it mints.
    replica: Option<String>,
}

#[derive(Debug, Default)]
struct Tables {
    /// (principal, name) → handle.
    aliases: HashMap<(Arc<str>, String), String>,
    /// handle → principal.
    owners: HashMap<String, Arc<str>>,
}

impl Handles {
    /// Handles minted by `replica` (none: a server that is no replica).
    pub fn new(replica: Option<String>) -> Handles {
        Handles {
            inner: Mutex::default(),
            replica,
        }
    }

    /// Whether `handle` was issued to `principal`.
    pub fn owns(&self, principal: &str, handle: &str) -> bool {
        self.inner
            .lock()
            .recover()
            .owners
            .get(handle)
            .is_some_and(|o| &**o == principal)
    }

    /// The session `principal` reaches by `given` (a handle, or a name,
    /// which gets a handle the first time). `is_open`: whether a handle's
    /// session is open, asked only when the table is full.
    pub fn reach(
        &self,
        principal: &Arc<str>,
        given: &str,
        is_open: &dyn Fn(&str) -> bool,
    ) -> Result<Reached, Unreachable> {
        let mut t = self.inner.lock().recover();
        if let Some(theirs) = ids::replica_of(PREFIX, given) {
            if let Some(other) = theirs.filter(|r| Some(*r) != self.replica.as_deref()) {
                return Err(Unreachable::OtherReplica(other.to_string()));
            }
            return match t.owners.get(given) {
                Some(owner) if owner == principal => Ok(Reached {
                    handle: given.to_string(),
                }),
                Some(_) => Err(Unreachable::OtherPrincipal),
                None => Err(Unreachable::UnknownHandle),
            };
        }
        let key = (principal.clone(), given.to_string());
        if let Some(handle) = t.aliases.get(&key) {
            return Ok(Reached {
                handle: handle.clone(),
            });
        }
        if t.aliases.len() >= MAX_ALIASES {
            t.aliases.retain(|_, h| is_open(h));
            let Tables { aliases, owners } = &mut *t;
            owners.retain(|h, _| aliases.values().any(|a| a == h));
        }
        if t.aliases.len() >= MAX_ALIASES {
            return Err(Unreachable::TooManyNames);
        }
        let handle = ids::mint(PREFIX, self.replica.as_deref()).ok_or(Unreachable::TooManyNames)?;
        t.owners.insert(handle.clone(), principal.clone());
        t.aliases.insert(key, handle.clone());
        Ok(Reached { handle })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_lets_go_of_the_names_of_closed_sessions_only() {
        let h = Handles::new(None);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let kept = h.reach(&b, "kept", &|_| true).unwrap();
        for i in 1..MAX_ALIASES {
            h.reach(&a, &format!("n{i}"), &|_| true).unwrap();
        }
        assert_eq!(
            h.reach(&a, "more", &|_| true),
            Err(Unreachable::TooManyNames)
        );
        // With only b's session open, a's closed ones make room.
        let open = |handle: &str| handle == kept.handle;
        let more = h.reach(&b, "more", &open).unwrap();
        assert_eq!(h.reach(&b, &kept.handle, &open).unwrap(), kept);
        assert_eq!(h.reach(&b, "more", &open).unwrap(), more);
        assert_eq!(
            h.reach(&a, "n1", &open).unwrap().handle.len(),
            34,
            "a forgotten name gets a new handle"
        );
    }

    #[test]
    fn a_name_gets_one_handle_per_principal_and_the_handle_reaches_it() {
        let h = Handles::new(None);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let first = h.reach(&a, "work", &|_| true).unwrap();
        assert_eq!(
            ids::replica_of(PREFIX, &first.handle),
            Some(None),
            "{first:?}"
        );
        assert_eq!(h.reach(&a, "work", &|_| true).unwrap(), first);
        assert_eq!(h.reach(&a, &first.handle, &|_| true).unwrap(), first);
        // The same name is another session for another principal.
        let theirs = h.reach(&b, "work", &|_| true).unwrap();
        assert_ne!(theirs, first);
        // Nobody reaches another principal's session by its handle.
        assert_eq!(
            h.reach(&b, &first.handle, &|_| true),
            Err(Unreachable::OtherPrincipal)
        );
        assert_eq!(
            h.reach(&a, &theirs.handle, &|_| true),
            Err(Unreachable::OtherPrincipal)
        );
    }

    #[test]
    fn a_handle_never_issued_is_unknown_and_not_taken_for_a_name() {
        let h = Handles::new(None);
        let me: Arc<str> = "a".into();
        let forged = format!("s_{}", "0".repeat(32));
        assert_eq!(
            h.reach(&me, &forged, &|_| true),
            Err(Unreachable::UnknownHandle)
        );
        // Not of a handle's form: a name.
        assert!(h.reach(&me, "s_xyz", &|_| true).is_ok());
        assert!(
            h.reach(&me, &format!("s_{}", "A".repeat(32)), &|_| true)
                .is_ok()
        );
    }

    #[test]
    fn a_replicas_handles_name_it_and_another_replicas_are_told_apart() {
        let (a, b) = (
            Handles::new(Some("a".into())),
            Handles::new(Some("b".into())),
        );
        let me: Arc<str> = "me".into();
        let on_a = a.reach(&me, "work", &|_| true).unwrap();
        assert!(on_a.handle.starts_with("s_a_"), "{on_a:?}");
        assert_eq!(a.reach(&me, &on_a.handle, &|_| true).unwrap(), on_a);
        assert_eq!(
            b.reach(&me, &on_a.handle, &|_| true),
            Err(Unreachable::OtherReplica("a".into()))
        );
        // One minted by a server that is no replica is unknown to a replica.
        let plain = Handles::new(None).reach(&me, "work", &|_| true).unwrap();
        assert_eq!(
            a.reach(&me, &plain.handle, &|_| true),
            Err(Unreachable::UnknownHandle)
        );
    }
}
