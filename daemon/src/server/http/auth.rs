//! Who a request comes from: a bearer token of the tokens file, an OAuth
//! access token, or, when the server is reached only from this machine
//! and neither is configured, the one local principal. Gives the
//! principal's name and grants, or the refusal with its challenge.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use http::{HeaderMap, StatusCode, header};

use super::oauth::{OAuth, Rejected};
use super::refusal::Refusal;
use super::tokens::{Tokens, TokensError};
use crate::config::http::{DEFAULT_SCOPES, HttpSettings};
use crate::server::caller::Grants;
use crate::sync::Recover;

/// The principal of a server that asks for no credentials.
pub const LOCAL_PRINCIPAL: &str = "local";
/// What OAuth principals' names start with, so that none is taken for a
/// principal of the tokens file.
const OAUTH_PREFIX: &str = "oauth:";

/// A request's caller.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub principal: String,
    pub grants: Grants,
}

pub struct Auth {
    tokens: Option<(PathBuf, RwLock<Arc<Tokens>>)>,
    oauth: Option<OAuth>,
    /// `[http.principals.NAME] scopes`.
    scopes: BTreeMap<String, Vec<String>>,
}

impl Auth {
    /// From `[http]`, reading the tokens file.
    pub fn new(settings: &HttpSettings) -> Result<Auth, TokensError> {
        let tokens = match settings.tokens_path() {
            Some(path) => {
                let t = Tokens::load(&path)?;
                if t.is_empty() {
                    tracing::warn!(
                        "the tokens file {} names no principal: no token is accepted",
                        path.display()
                    );
                }
                Some((path, RwLock::new(Arc::new(t))))
            }
            None => None,
        };
        let oauth = match (&settings.oauth, &settings.resource) {
            (Some(o), Some(resource)) => Some(OAuth::new(o, resource)),
            _ => None,
        };
        Ok(Auth {
            tokens,
            oauth,
            scopes: settings
                .principals
                .iter()
                .map(|(k, v)| (k.clone(), v.scopes.clone()))
                .collect(),
        })
    }

    /// Whether callers must present credentials.
    pub fn required(&self) -> bool {
        self.tokens.is_some() || self.oauth.is_some()
    }

    pub fn oauth(&self) -> Option<&OAuth> {
        self.oauth.as_ref()
    }

    /// Reads the tokens file again (SIGHUP); on failure the principals
    /// stay as they were. The number of principals it names.
    pub fn reload(&self) -> Option<Result<usize, TokensError>> {
        let (path, current) = self.tokens.as_ref()?;
        Some(Tokens::load(path).map(|t| {
            let n = t.len();
            *current.write().recover() = Arc::new(t);
            n
        }))
    }

    /// The request's caller, or why it is refused.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Authenticated, Refusal> {
        if !self.required() {
            return Ok(Authenticated {
                principal: LOCAL_PRINCIPAL.to_string(),
                grants: Grants::all(),
            });
        }
        let presented = match headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .collect::<Vec<_>>()[..]
        {
            [] => {
                return Err(self.unauthorized(
                    None,
                    "this server needs a bearer token (Authorization: Bearer TOKEN)",
                ));
            }
            [one] => one.to_str().ok().and_then(bearer),
            _ => None,
        };
        let Some(token) = presented else {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "the Authorization header is not one `Bearer TOKEN`",
            ));
        };
        // A JWT has two dots; a token of the file has none.
        if token.matches('.').count() == 2 {
            let Some(oauth) = &self.oauth else {
                return Err(self.unauthorized(Some("invalid_token"), "the token is not valid"));
            };
            return match oauth.accept(token).await {
                Ok(a) => Ok(Authenticated {
                    principal: format!("{OAUTH_PREFIX}{}", a.subject),
                    grants: Grants::from_scopes(a.scopes.iter().map(String::as_str)),
                }),
                Err(Rejected::Invalid(why)) => Err(self.unauthorized(Some("invalid_token"), &why)),
                Err(Rejected::Unavailable(why)) => {
                    Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, why).retry_after(30))
                }
            };
        }
        let tokens = self
            .tokens
            .as_ref()
            .map(|(_, t)| t.read().recover().clone());
        match tokens.as_deref().and_then(|t| t.principal(token)) {
            Some(name) => {
                let grants = match self.scopes.get(name) {
                    Some(s) => Grants::from_scopes(s.iter().map(String::as_str)),
                    None => Grants::from_scopes(DEFAULT_SCOPES),
                };
                Ok(Authenticated {
                    principal: name.to_string(),
                    grants,
                })
            }
            None => Err(self.unauthorized(Some("invalid_token"), "the token is not valid")),
        }
    }

    /// 401, with the challenge that tells a client how to authenticate.
    fn unauthorized(&self, error: Option<&str>, message: &str) -> Refusal {
        Refusal::new(StatusCode::UNAUTHORIZED, message)
            .with_challenge(self.challenge(error, None, message))
    }

    /// 403 for a scope the request's credentials lack.
    pub fn insufficient_scope(&self, scope: &str, message: String) -> Refusal {
        let challenge = self.challenge(Some("insufficient_scope"), Some(scope), &message);
        Refusal::new(StatusCode::FORBIDDEN, message).with_challenge(challenge)
    }

    fn challenge(&self, error: Option<&str>, scope: Option<&str>, description: &str) -> String {
        let mut params = Vec::new();
        match &self.oauth {
            Some(o) => params.push(format!(
                "resource_metadata=\"{}\"",
                o.resource_metadata_url()
            )),
            None => params.push("realm=\"nix-sandbox-mcp\"".to_string()),
        }
        if let Some(e) = error {
            params.push(format!("error=\"{e}\""));
            let d: String = description
                .chars()
                .filter(|c| *c != '"' && *c != '\\' && !c.is_control())
                .collect();
            params.push(format!("error_description=\"{d}\""));
        }
        if let Some(s) = scope {
            params.push(format!("scope=\"{s}\""));
        }
        format!("Bearer {}", params.join(", "))
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_in_any_case_and_nothing_else_is() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        for bad in ["Basic abc", "Bearer", "Bearer ", "Bearer a b", "abc"] {
            assert_eq!(bearer(bad), None, "{bad}");
        }
    }
}
