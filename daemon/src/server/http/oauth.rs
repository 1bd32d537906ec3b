//! OAuth 2.1 resource server: JWT access tokens checked against the
//! configured issuer's keys (JWKS): the signature (asymmetric algorithms
//! only, `none` and shared secrets refused), `iss`, `aud` (this server's
//! resource URI, RFC 8707), `exp` and `nbf` with a clock skew, a key id the
//! JWKS holds; the token's scopes become the request's grants. The keys
//! are fetched with bounds (time, size), cached, fetched again at most
//! every [`REFETCH_AFTER`] for an unknown key id; with no keys the server
//! fails closed. Also the protected resource metadata (RFC 9728).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::http::{DEFAULT_SCOPES, OAuthSettings};

/// Keys older than this are fetched again before use.
const KEYS_FRESH: Duration = Duration::from_secs(300);
/// Keys this old are still used when the issuer cannot be reached.
const KEYS_STALE: Duration = Duration::from_secs(3600);
/// An unknown key id fetches the keys again, at most this often.
const REFETCH_AFTER: Duration = Duration::from_secs(30);
/// Time and size bounds of a fetch from the issuer.
const FETCH_TIME: Duration = Duration::from_secs(10);
const FETCH_BYTES: usize = 1024 * 1024;
/// A subject longer than this is refused.
const MAX_SUBJECT: usize = 256;

/// The algorithms an access token may be signed with.
const ASYMMETRIC: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Why an access token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// Not a valid token for this server (401, `invalid_token`).
    Invalid(String),
    /// The issuer's keys cannot be had: nothing is accepted (503).
    Unavailable(String),
}

/// An accepted access token.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub subject: String,
    pub scopes: Vec<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    /// RFC 9068: space-separated.
    #[serde(default)]
    scope: Option<String>,
    /// A common alternative: an array.
    #[serde(default)]
    scp: Option<Vec<String>>,
}

struct Keys {
    set: JwkSet,
    fetched: Instant,
}

pub struct OAuth {
    issuer: String,
    audience: String,
    resource: String,
    jwks_uri: Option<String>,
    skew: u64,
    keys: tokio::sync::Mutex<Option<Keys>>,
    tls: Arc<tokio_rustls::rustls::ClientConfig>,
    /// Where the metadata is, and the paths it is served at (made once).
    metadata_url: String,
    metadata_paths: [String; 2],
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// Where the metadata of `resource` is: its origin, the well-known name,
/// then the resource's path (RFC 9728 §3.1); and the paths it is served at
/// (that one, and the well-known name alone).
fn metadata_location(resource: &str) -> (String, [String; 2]) {
    let uri: http::Uri = resource.parse().expect("checked when the config was read");
    let path = format!(
        "/.well-known/oauth-protected-resource{}",
        uri.path().trim_end_matches('/')
    );
    let url = format!(
        "{}://{}{path}",
        uri.scheme_str().unwrap_or("https"),
        uri.authority().map(|a| a.as_str()).unwrap_or_default()
    );
    (
        url,
        ["/.well-known/oauth-protected-resource".to_string(), path],
    )
}

impl OAuth {
    pub fn new(settings: &OAuthSettings, resource: &str) -> OAuth {
        let (metadata_url, metadata_paths) = metadata_location(resource);
        OAuth {
            issuer: settings.issuer.clone(),
            audience: settings
                .audience
                .clone()
                .unwrap_or_else(|| resource.to_string()),
            resource: resource.to_string(),
            jwks_uri: settings.jwks_uri.clone(),
            skew: settings.clock_skew_seconds.unwrap_or(60),
            keys: tokio::sync::Mutex::new(None),
            // TLS to the issuer, trusting the system's CA certificates.
            tls: Arc::new(crate::trust::client_config(&[])),
            metadata_url,
            metadata_paths,
        }
    }

    /// RFC 9728's document for this server.
    pub fn resource_metadata(&self) -> Value {
        let mut scopes: Vec<&str> = DEFAULT_SCOPES.to_vec();
        scopes.extend(["sandbox:env:NAME", "sandbox:project:NAME"]);
        json!({
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "scopes_supported": scopes,
            "bearer_methods_supported": ["header"],
            "resource_name": "nix-sandbox-mcp",
        })
    }

    /// Where the metadata is (see [`metadata_location`]).
    pub fn resource_metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// The paths the metadata is served at.
    pub fn resource_metadata_paths(&self) -> &[String; 2] {
        &self.metadata_paths
    }

    /// Checks `token`; with it accepted, its subject and scopes.
    pub async fn accept(&self, token: &str) -> Result<Accepted, Rejected> {
        let invalid = |m: &str| Rejected::Invalid(m.to_string());
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| invalid("the access token is not a signed JWT this server accepts"))?;
        if !ASYMMETRIC.contains(&header.alg) {
            return Err(invalid(
                "the access token is signed with a shared secret; only the issuer's public keys are accepted",
            ));
        }
        let kid = header
            .kid
            .as_deref()
            .ok_or_else(|| invalid("the access token names no key (kid)"))?;
        let jwk = self.key(kid).await?;
        if let Some(alg) = jwk.common.key_algorithm
            && alg.to_string() != format!("{:?}", header.alg)
        {
            return Err(invalid("the access token's algorithm is not its key's"));
        }
        let key = DecodingKey::from_jwk(&jwk)
            .map_err(|_| invalid("the issuer's key for this token cannot verify it"))?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.leeway = self.skew;
        validation.validate_nbf = true;
        validation.required_spec_claims = ["exp", "iss", "aud", "sub"]
            .into_iter()
            .map(String::from)
            .collect();
        let data = jsonwebtoken::decode::<Claims>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            Rejected::Invalid(
                match e.kind() {
                    K::ExpiredSignature => "the access token has expired",
                    K::ImmatureSignature => "the access token is not valid yet (nbf)",
                    K::InvalidIssuer => "the access token is from another issuer",
                    K::InvalidAudience => "the access token is for another resource (aud)",
                    K::InvalidSignature => "the access token's signature does not verify",
                    K::MissingRequiredClaim(_) => "the access token lacks exp, iss, aud or sub",
                    _ => "the access token is not valid",
                }
                .to_string(),
            )
        })?;
        let claims = data.claims;
        // The subject names the principal in logs and the audit log.
        if claims.sub.is_empty()
            || claims.sub.len() > MAX_SUBJECT
            || claims.sub.chars().any(char::is_control)
        {
            return Err(invalid(
                "the access token's subject is empty, too long, or holds control characters",
            ));
        }
        let mut scopes: Vec<String> = claims
            .scope
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(String::from)
            .collect();
        scopes.extend(claims.scp.unwrap_or_default());
        Ok(Accepted {
            subject: claims.sub,
            scopes,
        })
    }

    /// The issuer's key `kid`, from the cache or fetched.
    async fn key(&self, kid: &str) -> Result<jsonwebtoken::jwk::Jwk, Rejected> {
        let mut keys = self.keys.lock().await;
        let age = keys.as_ref().map(|k| k.fetched.elapsed());
        let known = keys.as_ref().and_then(|k| k.set.find(kid).cloned());
        let fetch = match (&known, age) {
            (_, None) => true,
            (Some(_), Some(age)) => age > KEYS_FRESH,
            (None, Some(age)) => age > REFETCH_AFTER,
        };
        if fetch {
            match self.fetch_keys().await {
                Ok(set) => {
                    *keys = Some(Keys {
                        set,
                        fetched: Instant::now(),
                    })
                }
                Err(why) => {
                    tracing::warn!("cannot fetch the OAuth issuer's keys: {why}");
                    let usable = age.is_some_and(|a| a < KEYS_STALE);
                    if !usable {
                        *keys = None;
                        return Err(Rejected::Unavailable(format!(
                            "the OAuth issuer's keys cannot be fetched ({why}); no access token is accepted until they can"
                        )));
                    }
                }
            }
        }
        keys.as_ref()
            .and_then(|k| k.set.find(kid).cloned())
            .ok_or_else(|| {
                Rejected::Invalid("the access token's key is not one of the issuer's".into())
            })
    }

    async fn fetch_keys(&self) -> Result<JwkSet, String> {
        let uri = match &self.jwks_uri {
            Some(u) => u.clone(),
            None => self.discover_jwks_uri().await?,
        };
        let v = self.fetch_json(&uri).await?;
        serde_json::from_value(v).map_err(|e| format!("{uri} is not a JWK set: {e}"))
    }

    /// RFC 8414's metadata, else OpenID Connect's: its `jwks_uri`, once its
    /// `issuer` is the one configured.
    async fn discover_jwks_uri(&self) -> Result<String, String> {
        let uri: http::Uri = self.issuer.parse().map_err(|e| format!("{e}"))?;
        let origin = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("https"),
            uri.authority().map(|a| a.as_str()).unwrap_or_default()
        );
        let path = uri.path().trim_end_matches('/');
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!(
                "{}/.well-known/openid-configuration",
                self.issuer.trim_end_matches('/')
            ),
        ];
        let mut why = Vec::new();
        for c in candidates {
            match self.fetch_json(&c).await {
                Ok(meta) if meta["issuer"] == self.issuer.as_str() => {
                    if let Some(j) = meta["jwks_uri"].as_str() {
                        crate::config::http::check_url(j)?;
                        return Ok(j.to_string());
                    }
                    why.push(format!("{c} has no jwks_uri"));
                }
                Ok(_) => why.push(format!("{c} is another issuer's")),
                Err(e) => why.push(e),
            }
        }
        Err(why.join("; "))
    }

    /// GETs `url` (https, or http to loopback), bounded in time and size.
    async fn fetch_json(&self, url: &str) -> Result<Value, String> {
        crate::config::http::check_url(url)?;
        tokio::time::timeout(FETCH_TIME, self.get(url))
            .await
            .map_err(|_| format!("{url} did not answer within {} s", FETCH_TIME.as_secs()))?
    }

    async fn get(&self, url: &str) -> Result<Value, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let host = uri.host().unwrap_or_default().to_string();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let connect_to = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tcp = tokio::net::TcpStream::connect((connect_to.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let request = http::Request::get(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .header(
                http::header::HOST,
                uri.authority().map(|a| a.as_str()).unwrap_or_default(),
            )
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = if https {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(connect_to.clone())
                .map_err(|e| format!("{url}: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {url}: {e}"))?;
            send(TokioIo::new(tls), request).await
        } else {
            send(TokioIo::new(tcp), request).await
        }
        .map_err(|e| format!("{url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let body = Limited::new(response.into_body(), FETCH_BYTES)
            .collect()
            .await
            .map_err(|e| format!("{url}: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("{url} is not JSON: {e}"))
    }
}

async fn send<I>(
    io: I,
    request: http::Request<Empty<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())
}
