//! Confirmation across the two rounds of one tool call (MCP 2026-07-28's
//! multi round-trip requests). The first round answers `input_required` with
//! a question and a `requestState`; the retry brings the user's answer and
//! that state back. The client holds the state, so it is sealed: an HMAC
//! (rmcp's codec) under a key made when the server starts, over the
//! principal that asked, the digest of the exact invocation, an expiry and
//! a nonce. It is accepted once: its nonce is remembered until it expires.
//! What a refused state was (altered, expired, another principal's, another
//! invocation's, already used) is told apart, checked only once the seal
//! holds. A replica's states begin with its name and `~` (`a~rs1.…`), so
//! that a load balancer can route the retry back to it (see
//! deploy/haproxy/haproxy.cfg); another replica refuses such a state,
//! saying which replica holds it, and runs nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::model::{RequestStateCodec, RequestStateError, SealOptions};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::sync::Recover;

/// Sealed states outstanding at once; beyond, the oldest nonces are
/// forgotten (and their states refused as already used).
const MAX_REMEMBERED: usize = 4096;

/// What a state says, inside its seal.
#[derive(Serialize, Deserialize)]
struct Contents {
    /// SHA-256 of the principal, hex.
    principal: String,
    /// The invocation's digest, hex.
    invocation: String,
    /// 16 random bytes, hex.
    nonce: String,
}

/// Why a presented state was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Issued by the replica named, not this one.
    HeldBy(String),
    /// Not sealed by this server as it runs now: altered, made up, from
    /// another server, or from before a restart.
    NotOurs,
    Expired,
    /// Sealed for another principal.
    OtherPrincipal,
    /// Sealed for another command or other arguments.
    OtherInvocation,
    /// Accepted once already.
    Used,
}

impl Refused {
    /// Says what the state was, for the error a model reads.
    pub fn describe(&self) -> String {
        match self {
            Refused::HeldBy(replica) => {
                return format!(
                    "the requestState was issued by replica {replica}, not this one; the load balancer must send the retry to the replica that asked"
                );
            }
            Refused::NotOurs => {
                "the requestState was not issued by this server as it runs now (altered, made up, or from before a restart)"
            }
            Refused::Expired => "the requestState has expired",
            Refused::OtherPrincipal => "the requestState was issued to another client",
            Refused::OtherInvocation => {
                "the requestState was issued for another command or other arguments"
            }
            Refused::Used => "the requestState was already used",
        }
        .to_string()
    }
}

/// How long an accepted state's nonce is remembered: as long as any state
/// lives (a state lives as long as the question it carries, at most
/// [`super::confirm::ASK_TIMEOUT`]).
const REMEMBER: Duration = super::confirm::ASK_TIMEOUT;

/// The sealing key and the nonces of the states accepted and not yet expired.
pub struct SealedStates {
    codec: RequestStateCodec,
    used: Mutex<HashMap<[u8; 16], Instant>>,
    /// This server's name among replicas, which begins its states.
    replica: Option<String>,
}

/// Between a replica's name and the sealed state.
const REPLICA_END: char = '~';

impl std::fmt::Debug for SealedStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedStates").finish_non_exhaustive()
    }
}

impl SealedStates {
    /// A fresh key from the operating system; `replica`: this server's
    /// name among replicas, if it is one.
    pub fn new(replica: Option<String>) -> Result<SealedStates, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        let codec = RequestStateCodec::try_new(key.to_vec())
            .expect("a 32-byte key is long enough for the codec");
        Ok(SealedStates {
            codec,
            used: Mutex::default(),
            replica,
        })
    }

    /// A state for `invocation` asked by `principal`, living `ttl` (at
    /// most [`REMEMBER`]).
    pub fn seal(
        &self,
        principal: &str,
        invocation: &[u8; 32],
        ttl: Duration,
    ) -> Result<String, getrandom::Error> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce)?;
        let contents = Contents {
            principal: hex(&Sha256::digest(principal.as_bytes())),
            invocation: hex(invocation),
            nonce: hex(&nonce),
        };
        let sealed = self
            .codec
            .seal_json_with(&contents, &SealOptions::new().ttl(ttl.min(REMEMBER)))
            .expect("the contents serialize");
        Ok(match &self.replica {
            Some(replica) => format!("{replica}{REPLICA_END}{sealed}"),
            None => sealed,
        })
    }

    /// Accepts `sealed` for `invocation` asked by `principal`, once.
    pub fn open(
        &self,
        sealed: &str,
        principal: &str,
        invocation: &[u8; 32],
    ) -> Result<(), Refused> {
        let sealed = match (sealed.split_once(REPLICA_END), &self.replica) {
            (Some((name, rest)), Some(ours)) if name == ours => rest,
            (Some((name, _)), _) if crate::server::check_replica(name).is_ok() => {
                return Err(Refused::HeldBy(name.to_string()));
            }
            _ => sealed,
        };
        let contents: Contents = self
            .codec
            .open_json_with(sealed, &[])
            .map_err(|e| match e {
                RequestStateError::Expired => Refused::Expired,
                _ => Refused::NotOurs,
            })?;
        let principal_hash = hex(&Sha256::digest(principal.as_bytes()));
        if !bool::from(
            contents
                .principal
                .as_bytes()
                .ct_eq(principal_hash.as_bytes()),
        ) {
            return Err(Refused::OtherPrincipal);
        }
        if !bool::from(
            contents
                .invocation
                .as_bytes()
                .ct_eq(hex(invocation).as_bytes()),
        ) {
            return Err(Refused::OtherInvocation);
        }
        let nonce = unhex16(&contents.nonce).ok_or(Refused::NotOurs)?;
        let now = Instant::now();
        let mut used = self.used.lock().recover();
        used.retain(|_, expires| *expires > now);
        if used.contains_key(&nonce) {
            return Err(Refused::Used);
        }
        if used.len() >= MAX_REMEMBERED {
            // Forgetting one would let its state be used again: refuse instead.
            return Err(Refused::Used);
        }
        used.insert(nonce, now + REMEMBER);
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex16(s: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if s.len() != 32 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "stdio:a";
    const INV: [u8; 32] = [7; 32];
    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_state_is_accepted_once_for_its_principal_and_invocation() {
        let states = SealedStates::new(None).unwrap();
        let s = states.seal(ME, &INV, MINUTE).unwrap();
        assert_eq!(
            states.open(&s, "stdio:b", &INV),
            Err(Refused::OtherPrincipal)
        );
        assert_eq!(states.open(&s, ME, &[8; 32]), Err(Refused::OtherInvocation));
        assert_eq!(states.open(&s, ME, &INV), Ok(()));
        assert_eq!(states.open(&s, ME, &INV), Err(Refused::Used));
        // Another state for the same invocation is another nonce.
        let again = states.seal(ME, &INV, MINUTE).unwrap();
        assert_eq!(states.open(&again, ME, &INV), Ok(()));
    }

    #[test]
    fn a_replicas_state_names_it_and_only_it_accepts_the_state() {
        let a = SealedStates::new(Some("a".into())).unwrap();
        let b = SealedStates::new(Some("b".into())).unwrap();
        let alone = SealedStates::new(None).unwrap();
        let s = a.seal(ME, &INV, MINUTE).unwrap();
        assert!(s.starts_with("a~rs1."), "{s}");
        let held = Refused::HeldBy("a".into());
        assert_eq!(b.open(&s, ME, &INV), Err(held.clone()));
        assert_eq!(alone.open(&s, ME, &INV), Err(held.clone()));
        assert!(held.describe().contains("issued by replica a"));
        assert_eq!(a.open(&s, ME, &INV), Ok(()));
        // Without its name, or under a name that is no replica's, only the
        // key that sealed it opens it.
        let bare = s.strip_prefix("a~").unwrap();
        assert_eq!(b.open(bare, ME, &INV), Err(Refused::NotOurs));
        assert_eq!(
            b.open(&format!("A B~{bare}"), ME, &INV),
            Err(Refused::NotOurs)
        );
        assert_eq!(a.open(bare, ME, &INV), Err(Refused::Used));
    }

    #[test]
    fn an_altered_or_foreign_state_is_not_ours() {
        let states = SealedStates::new(None).unwrap();
        let s = states.seal(ME, &INV, MINUTE).unwrap();
        // Every character changed in turn, and the state cut short.
        for i in 0..s.len() {
            let mut bytes = s.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            if altered != s {
                assert_eq!(
                    states.open(&altered, ME, &INV),
                    Err(Refused::NotOurs),
                    "{i}"
                );
            }
        }
        assert_eq!(
            states.open(&s[..s.len() - 1], ME, &INV),
            Err(Refused::NotOurs)
        );
        assert_eq!(states.open("", ME, &INV), Err(Refused::NotOurs));
        let other_server = SealedStates::new(None).unwrap();
        assert_eq!(other_server.open(&s, ME, &INV), Err(Refused::NotOurs));
        assert_eq!(states.open(&s, ME, &INV), Ok(()));
    }

    #[test]
    fn a_state_expires() {
        let states = SealedStates::new(None).unwrap();
        let s = states.seal(ME, &INV, Duration::from_millis(20)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(states.open(&s, ME, &INV), Err(Refused::Expired));
    }

    #[test]
    fn the_state_shows_no_principal_or_arguments() {
        let states = SealedStates::new(None).unwrap();
        let s = states.seal("stdio:secret-principal", &INV, MINUTE).unwrap();
        assert!(!s.contains("secret-principal"), "{s}");
    }
}
