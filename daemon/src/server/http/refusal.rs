//! Refusals: every request the HTTP layer turns away gets a proper status
//! and a JSON-RPC error body saying why (and, for authentication, the
//! `WWW-Authenticate` challenge). rmcp's own refusals, which it writes as
//! plain text, are rewritten the same way ([`as_json_rpc`]).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use serde_json::json;

pub type Body = BoxBody<Bytes, Infallible>;

/// JSON-RPC's "invalid request": the code of every refusal of the
/// client's doing (4xx).
const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's "internal error": the code of refusals of the server's (5xx).
const INTERNAL_ERROR: i64 = -32603;
/// The most of a plain-text refusal kept when it is rewritten.
const MAX_TEXT: usize = 4096;

#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// The `WWW-Authenticate` challenge (401, 403 for a missing scope).
    pub challenge: Option<String>,
    /// Seconds after which the client may try again (429, 503).
    pub retry_after: Option<u64>,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
            challenge: None,
            retry_after: None,
        }
    }

    pub fn with_challenge(mut self, challenge: String) -> Refusal {
        self.challenge = Some(challenge);
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Refusal {
        self.retry_after = Some(seconds);
        self
    }

    pub fn into_response(self) -> Response<Body> {
        let code = if self.status.is_server_error() {
            INTERNAL_ERROR
        } else {
            INVALID_REQUEST
        };
        let body = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": code, "message": self.message},
        });
        let mut response = Response::builder()
            .status(self.status)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())).boxed())
            .expect("a status and a content type make a response");
        let headers = response.headers_mut();
        if let Some(c) = self.challenge.and_then(|c| HeaderValue::try_from(c).ok()) {
            headers.insert(header::WWW_AUTHENTICATE, c);
        }
        if let Some(s) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

/// `response` as it goes out: a refusal (4xx, 5xx) whose body is not JSON
/// becomes one whose body is a JSON-RPC error with the same words; any
/// other response is unchanged.
pub async fn as_json_rpc(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match http_body_util::Limited::new(body, MAX_TEXT).collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_string()
    } else {
        text
    };
    let mut rewritten = Refusal::new(status, message).into_response();
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().append(name, value.clone());
        }
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(r: Response<Body>) -> serde_json::Value {
        let b = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&b).unwrap()
    }

    #[tokio::test]
    async fn a_refusal_is_a_status_and_a_json_rpc_error() {
        let r = Refusal::new(StatusCode::UNAUTHORIZED, "no token")
            .with_challenge("Bearer realm=\"x\"".into())
            .into_response();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer realm=\"x\"");
        let v = body_of(r).await;
        assert_eq!(v["error"]["code"], -32600);
        assert_eq!(v["error"]["message"], "no token");
        assert!(v["id"].is_null());
    }

    #[tokio::test]
    async fn plain_text_refusals_are_rewritten_and_others_kept() {
        let text = Response::builder()
            .status(StatusCode::NOT_ACCEPTABLE)
            .header("x-kept", "1")
            .body(Full::new(Bytes::from("Not Acceptable: use json")).boxed())
            .unwrap();
        let r = as_json_rpc(text).await;
        assert_eq!(
            (r.status(), &r.headers()["x-kept"]),
            (StatusCode::NOT_ACCEPTABLE, &HeaderValue::from_static("1"))
        );
        assert_eq!(
            body_of(r).await["error"]["message"],
            "Not Acceptable: use json"
        );
        let ok = Response::builder()
            .status(StatusCode::OK)
            .body(Full::new(Bytes::from("x")).boxed())
            .unwrap();
        let r = as_json_rpc(ok).await;
        let b = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&b[..], b"x");
    }
}
