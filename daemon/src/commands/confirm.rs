//! Confirmation of `confirm = true` commands, two ways. Where the client can
//! ask its user (MCP elicitation), the server asks with the exact argv and
//! waits, bounded (under 2026-07-28 the question goes back in the call's
//! result instead, with a sealed state: `sealed.rs`). Elsewhere it hands out a token: 32 random bytes from the
//! operating system, single use, expiring, bound to the digest of the exact
//! invocation, compared in constant time, and kept only as a hash. A token
//! never appears in a log or in the audit log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::Recover;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientResult, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, ServerRequest,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use rmcp::{Peer, RoleServer};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

/// How long a token stays valid.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// How long the server waits for the user's answer to a question.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(120);
/// Tokens outstanding at once; beyond, the oldest is dropped.
const MAX_PENDING: usize = 64;
/// An expired token is remembered this long, to say "expired" rather than "unknown".
const REMEMBER_EXPIRED: Duration = Duration::from_secs(600);

/// A token as handed to the agent. Its `Debug` does not show it, so it
/// cannot reach a log by accident.
pub struct Token(String);

impl Token {
    /// The token's text, for the one result that carries it.
    pub fn reveal(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

#[derive(Debug)]
struct Pending {
    /// SHA-256 of the token: the token itself is not kept.
    token_hash: [u8; 32],
    /// SHA-256 of the principal it was handed to.
    holder: [u8; 32],
    invocation: [u8; 32],
    expires: Instant,
}

/// What presenting a token amounted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeemed {
    /// Valid, unexpired, for this invocation: run it.
    Valid,
    Expired,
    /// Never issued, already used, or dropped.
    Unknown,
    /// Issued for a different invocation (it is now used up all the same).
    OtherInvocation,
}

/// Outstanding tokens.
#[derive(Debug)]
pub struct Tokens {
    pending: Mutex<Vec<Pending>>,
    ttl: Duration,
}

impl Tokens {
    /// `ttl` can only shorten [`TOKEN_TTL`].
    pub fn new(ttl: Duration) -> Tokens {
        Tokens {
            pending: Mutex::new(Vec::new()),
            ttl: ttl.min(TOKEN_TTL),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A fresh token for `holder` (a principal), bound to `invocation` (an
    /// invocation's digest).
    pub fn issue(&self, holder: &str, invocation: [u8; 32]) -> Result<Token, getrandom::Error> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)?;
        let token = URL_SAFE_NO_PAD.encode(secret);
        let now = Instant::now();
        let mut pending = self.pending.lock().recover();
        pending.retain(|p| now < p.expires + REMEMBER_EXPIRED);
        if pending.len() >= MAX_PENDING {
            pending.remove(0);
        }
        pending.push(Pending {
            token_hash: Sha256::digest(token.as_bytes()).into(),
            holder: Sha256::digest(holder.as_bytes()).into(),
            invocation,
            expires: now + self.ttl,
        });
        Ok(Token(token))
    }

    /// Presents `token` for `invocation`, by `holder`. A token its holder
    /// presents is used up whatever the outcome: it can be tried once.
    /// Presented by another principal it is unknown to them, and stays its
    /// holder's: nobody else can spend it.
    pub fn redeem(&self, token: &str, holder: &str, invocation: &[u8; 32]) -> Redeemed {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let holder: [u8; 32] = Sha256::digest(holder.as_bytes()).into();
        let now = Instant::now();
        let mut pending = self.pending.lock().recover();
        // Compare against every entry, each in constant time, so that
        // neither the comparison nor the search reveals how close a guess was.
        let mut found = None;
        for (i, p) in pending.iter().enumerate() {
            if bool::from(p.token_hash.ct_eq(&presented)) {
                found = Some(i);
            }
        }
        let Some(i) = found.filter(|&i| bool::from(pending[i].holder.ct_eq(&holder))) else {
            return Redeemed::Unknown;
        };
        let p = pending.remove(i);
        if now >= p.expires {
            Redeemed::Expired
        } else if bool::from(p.invocation.ct_eq(invocation)) {
            Redeemed::Valid
        } else {
            Redeemed::OtherInvocation
        }
    }
}

/// Whether the client said it can ask its user with a form (an empty
/// `elicitation` capability means form, per the 2025-11-25 revision).
pub fn client_can_ask(capabilities: Option<&ClientCapabilities>) -> bool {
    capabilities
        .and_then(|c| c.elicitation.as_ref())
        .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

/// The user's answer to a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Approved,
    /// Declined, or accepted without approving.
    Declined,
    /// Dismissed without a choice.
    Cancelled,
    /// No answer in time.
    TimedOut,
    /// The tool call itself was cancelled while waiting.
    CallCancelled,
    /// The client could not ask (an error from it, or the connection closed).
    Failed(String),
}

/// The property of the form the user approves with.
const APPROVE: &str = "approve";

/// The form that asks the user whether to run: `message`, and one yes/no
/// field.
pub fn question_form(message: String) -> Result<ElicitRequestParams, String> {
    let schema = ElicitationSchema::builder()
        .required_bool_with(APPROVE, |b| b.title("Run this command").with_default(true))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    })
}

/// What the user's answer to [`question_form`] was.
pub fn answer_of(r: &ElicitResult) -> Answer {
    match r.action {
        ElicitationAction::Accept => {
            let approved = r
                .content
                .as_ref()
                .and_then(|c| c.get(APPROVE))
                .and_then(|v| v.as_bool())
                == Some(true);
            if approved {
                Answer::Approved
            } else {
                Answer::Declined
            }
        }
        ElicitationAction::Decline => Answer::Declined,
        _ => Answer::Cancelled,
    }
}

/// Asks the user, through the client, whether to run; waits at most `wait`
/// and stops waiting (withdrawing the question) when `cancel` fires.
pub async fn ask(
    peer: &Peer<RoleServer>,
    message: String,
    wait: Duration,
    cancel: &CancellationToken,
) -> Answer {
    let form = match question_form(message) {
        Ok(f) => f,
        Err(e) => return Answer::Failed(e),
    };
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(form));
    let handle = match peer
        .send_request_with_option(request, PeerRequestOptions::with_timeout(wait))
        .await
    {
        Ok(h) => h,
        Err(e) => return Answer::Failed(e.to_string()),
    };
    let (id, requester) = (handle.id.clone(), handle.peer.clone());
    let response = tokio::select! {
        r = handle.await_response() => r,
        _ = cancel.cancelled() => {
            let _ = requester
                .notify_cancelled(CancelledNotificationParam::new(Some(id), Some("the tool call was cancelled".into())))
                .await;
            return Answer::CallCancelled;
        }
    };
    match response {
        Ok(ClientResult::ElicitResult(r)) => answer_of(&r),
        Ok(_) => Answer::Failed("the client answered with something other than a form".into()),
        Err(ServiceError::Timeout { .. }) => Answer::TimedOut,
        Err(e) => Answer::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "stdio:a";

    #[test]
    fn tokens_are_32_random_bytes_in_base64url() {
        let t = Tokens::new(TOKEN_TTL);
        let a = t.issue(ME, [1; 32]).unwrap();
        let b = t.issue(ME, [1; 32]).unwrap();
        assert_eq!(a.reveal().len(), 43);
        assert!(
            a.reveal()
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_ne!(a.reveal(), b.reveal());
        assert_eq!(URL_SAFE_NO_PAD.decode(a.reveal()).unwrap().len(), 32);
        assert_eq!(format!("{a:?}"), "Token(…)");
        assert!(!format!("{t:?}").contains(a.reveal()));
    }

    #[test]
    fn a_token_works_once_and_only_for_its_invocation() {
        let t = Tokens::new(TOKEN_TTL);
        let token = t.issue(ME, [1; 32]).unwrap();
        assert_eq!(t.redeem(token.reveal(), ME, &[1; 32]), Redeemed::Valid);
        assert_eq!(t.redeem(token.reveal(), ME, &[1; 32]), Redeemed::Unknown);
        let token = t.issue(ME, [1; 32]).unwrap();
        assert_eq!(
            t.redeem(token.reveal(), ME, &[2; 32]),
            Redeemed::OtherInvocation
        );
        assert_eq!(t.redeem(token.reveal(), ME, &[1; 32]), Redeemed::Unknown);
        assert_eq!(t.redeem("made-up", ME, &[1; 32]), Redeemed::Unknown);
    }

    #[test]
    fn another_principal_cannot_spend_a_token() {
        let t = Tokens::new(TOKEN_TTL);
        let token = t.issue(ME, [1; 32]).unwrap();
        assert_eq!(
            t.redeem(token.reveal(), "other", &[1; 32]),
            Redeemed::Unknown
        );
        assert_eq!(
            t.redeem(token.reveal(), "other", &[2; 32]),
            Redeemed::Unknown
        );
        assert_eq!(t.redeem(token.reveal(), ME, &[1; 32]), Redeemed::Valid);
    }

    #[test]
    fn tokens_expire() {
        let t = Tokens::new(Duration::from_millis(20));
        let token = t.issue(ME, [1; 32]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(t.redeem(token.reveal(), ME, &[1; 32]), Redeemed::Expired);
        assert_eq!(Tokens::new(Duration::from_secs(3600)).ttl(), TOKEN_TTL);
    }

    #[test]
    fn outstanding_tokens_are_bounded() {
        let t = Tokens::new(TOKEN_TTL);
        let first = t.issue(ME, [0; 32]).unwrap();
        for _ in 0..MAX_PENDING {
            t.issue(ME, [0; 32]).unwrap();
        }
        assert_eq!(t.redeem(first.reveal(), ME, &[0; 32]), Redeemed::Unknown);
        assert_eq!(t.pending.lock().recover().len(), MAX_PENDING);
    }

    #[test]
    fn the_elicitation_capability_decides_whether_to_ask() {
        let caps = |v: serde_json::Value| serde_json::from_value::<ClientCapabilities>(v).unwrap();
        assert!(!client_can_ask(None));
        assert!(!client_can_ask(Some(&caps(serde_json::json!({})))));
        assert!(client_can_ask(Some(&caps(
            serde_json::json!({"elicitation": {}})
        ))));
        assert!(client_can_ask(Some(&caps(
            serde_json::json!({"elicitation": {"form": {}}})
        ))));
        assert!(!client_can_ask(Some(&caps(
            serde_json::json!({"elicitation": {"url": {}}})
        ))));
    }
}
