//! One HTTP request, from arrival to the MCP service: Host and Origin, the
//! endpoint (`/mcp`; `/healthz`, `/readyz` and `/metrics` for a fleet's
//! balancer and monitoring), the caller's credentials, its share of connections and
//! streams, the body (bounded in size and time), the scope a tool call
//! needs, and the principal's MCP sessions; then the principal's own rmcp
//! service, whose refusals are rewritten as JSON-RPC errors. What the
//! request holds (its stream, its call) is given back when its response
//! ends.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::auth::Auth;
use super::hosts::Allowed;
use super::principals::{Counter, Principal, Principals, Taken};
use super::refusal::{Body, Refusal, as_json_rpc};
use crate::server::caller::{Grants, missing_scope};
use crate::sync::Recover;

/// The one endpoint.
pub const ENDPOINT: &str = "/mcp";

pub struct Gate {
    pub auth: Auth,
    pub allowed: Allowed,
    pub principals: Principals,
    pub max_body: usize,
    pub body_timeout: Duration,
    /// Cancelled when the server shuts down: requests are refused from then.
    pub quitting: CancellationToken,
    /// Calls in flight (requests but `subscriptions/listen` streams), which
    /// shutting down waits for.
    pub calls: Counter,
    /// Whether `/metrics` is served (to callers with credentials, when the
    /// server requires them).
    pub metrics: bool,
}

/// What a connection holds: its place among its principal's connections,
/// taken on its first authenticated request.
#[derive(Default)]
pub struct Connection {
    held: std::sync::Mutex<Option<Taken>>,
}

impl Gate {
    pub async fn handle(
        self: Arc<Self>,
        connection: Arc<Connection>,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        Ok(match self.admit(&connection, request).await {
            Ok(response) => response,
            Err(refusal) => {
                self.server().shared.metrics.refused(reason(refusal.status));
                let mut r = refusal.into_response();
                if self.quitting.is_cancelled() {
                    r.headers_mut().insert(
                        header::CONNECTION,
                        header::HeaderValue::from_static("close"),
                    );
                }
                r
            }
        })
    }

    async fn admit(
        &self,
        connection: &Connection,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Refusal> {
        if self.quitting.is_cancelled() {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            )
            .retry_after(5));
        }
        let path = request.uri().path();
        // A balancer's probes (HTTP/1.0, no Host, say) learn nothing a page
        // could use: they come before the Host check.
        match path {
            "/healthz" => return Ok(json_response(StatusCode::OK, &json!({"status": "live"}))),
            "/readyz" => return Ok(self.readiness()),
            _ => {}
        }
        self.allowed.check(request.headers())?;
        if let Some(oauth) = self.auth.oauth()
            && oauth.resource_metadata_paths().iter().any(|p| p == path)
        {
            return Ok(json_response(StatusCode::OK, &oauth.resource_metadata()));
        }
        match path {
            "/metrics" if self.metrics => {
                self.auth.authenticate(request.headers()).await?;
                let executor = &self.server().shared.executor;
                let text = self.server().shared.metrics.render(
                    executor.sandboxes_ready(),
                    executor.memory_budget_used_mib(),
                    executor.memory_budget_mib(),
                );
                return Ok(Response::builder()
                    .header(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)
                    .body(Full::new(Bytes::from(text)).boxed())
                    .expect("a content type makes a response"));
            }
            _ => {}
        }
        if path != ENDPOINT {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("there is nothing at {path:?}; MCP is served at {ENDPOINT}"),
            ));
        }
        let caller = self.auth.authenticate(request.headers()).await?;
        let principal = self.principals.get(&caller.principal)?;
        let shares = self.principals.shares;
        self.hold_connection(connection, &principal, shares.connections)?;
        let stream = principal.streams.take(shares.streams).ok_or_else(|| {
            Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this caller already has {} requests in flight, its share of the server",
                    shares.streams
                ),
            )
            .retry_after(1)
        })?;
        let (mut parts, body) = request.into_parts();
        let body = if parts.method == Method::POST {
            self.read_body(body).await?
        } else {
            Bytes::new()
        };
        let message: Option<Value> = serde_json::from_slice(&body).ok();
        let method = message.as_ref().and_then(|m| m["method"].as_str());
        if method == Some("tools/call") {
            let tool = message
                .as_ref()
                .and_then(|m| m["params"]["name"].as_str())
                .unwrap_or("");
            if let Some(scope) = missing_scope(tool, &caller.grants) {
                return Err(self.auth.insufficient_scope(
                    scope,
                    format!("calling {tool} needs the scope {scope}, which this caller's credentials do not give"),
                ));
            }
        }
        if method == Some("initialize") && principal.mcp_sessions().await >= shares.mcp_sessions {
            return Err(Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this caller already has {} MCP sessions open, its share of the server; end one (DELETE with its Mcp-Session-Id)",
                    shares.mcp_sessions
                ),
            )
            .retry_after(10));
        }
        let mut held = vec![stream];
        if parts.method == Method::POST && method != Some("subscriptions/listen") {
            held.extend(self.calls.take(usize::MAX));
        }
        parts.extensions.insert::<Grants>(caller.grants);
        tracing::debug!(principal = %principal.name, method = ?method, "HTTP request");
        let response = principal
            .service
            .handle(Request::from_parts(parts, Full::new(body)))
            .await;
        let (parts, body) = as_json_rpc(response).await.into_parts();
        Ok(Response::from_parts(
            parts,
            Held { body, _held: held }.boxed(),
        ))
    }

    /// Counts the connection among its principal's, on its first request.
    fn hold_connection(
        &self,
        connection: &Connection,
        principal: &Principal,
        max: usize,
    ) -> Result<(), Refusal> {
        let mut held = connection.held.lock().recover();
        if held.is_some() {
            return Ok(());
        }
        let taken = principal.connections.take(max).ok_or_else(|| {
            Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("this caller already has {max} connections open, its share of the server"),
            )
            .retry_after(1)
        })?;
        *held = Some(taken);
        Ok(())
    }

    /// The request's body, at most `max_body` bytes, within `body_timeout`.
    async fn read_body(&self, body: Incoming) -> Result<Bytes, Refusal> {
        let read = Limited::new(body, self.max_body).collect();
        match tokio::time::timeout(self.body_timeout, read).await {
            Err(_) => Err(Refusal::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request's body did not arrive within {} s",
                    self.body_timeout.as_secs()
                ),
            )),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request's body is larger than {} bytes", self.max_body),
            )),
            Ok(Err(e)) => Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("the request's body could not be read: {e}"),
            )),
            Ok(Ok(c)) => Ok(c.to_bytes()),
        }
    }
}

impl Gate {
    fn server(&self) -> &crate::server::SandboxServer {
        self.principals.base()
    }

    /// 200 when a call can be served now: the environments' start checks
    /// done, their Nix builds ended, at least one environment, not
    /// shutting down; else 503, saying what is missing.
    fn readiness(&self) -> Response<Body> {
        let server = self.server();
        let registry = server.shared.registry();
        let mut waiting = Vec::new();
        if !*server.checked.borrow() {
            waiting.push("the environments' start checks are running".to_string());
        }
        if !registry.building.is_empty() {
            waiting.push(format!(
                "Nix is building: {}",
                registry
                    .building
                    .iter()
                    .map(|b| b.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if registry.is_empty() {
            waiting.push("no environment can be served".to_string());
        }
        if self.quitting.is_cancelled() {
            waiting.push("the server is shutting down".to_string());
        }
        match waiting.is_empty() {
            true => json_response(
                StatusCode::OK,
                &json!({"status": "ready", "environments": registry.names()}),
            ),
            false => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "not ready", "waiting": waiting}),
            ),
        }
    }
}

/// A refusal's reason, as the metrics count it.
fn reason(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "malformed",
        401 => "unauthenticated",
        403 => "forbidden",
        404 => "not_found",
        408 => "body_timeout",
        413 => "body_too_large",
        429 => "over_share",
        503 => "unavailable",
        _ => "other",
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("a content type makes a response")
}

/// A response body that holds places (a stream, a call) until it ends.
struct Held {
    body: Body,
    _held: Vec<Taken>,
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
