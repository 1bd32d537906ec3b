//! Credentials the proxy adds to requests for named hosts, and rules on the
//! requests themselves: `credentials = [...]` and `requests = [...]` in an
//! environment's `network` table. A host named by either is *intercepted*:
//! the proxy ends the sandbox's TLS with a certificate of its own
//! authority (`ca.rs`), looks at each request, and makes its own TLS
//! connection to the host (`proxy/intercept.rs`).
//!
//! Values are the daemon's: read from a file (again whenever the file
//! changes), the daemon's environment or a command's output, held in
//! [`SecretSource`], whose `Debug` shows where the value comes from and
//! never the value. Only the operator's configuration may name them: an
//! artifact's manifest and a project's commands file are refused one
//! (their authors could point a credential at any file the server reads).
//!
//! Requests to an intercepted host pass when the host has no request
//! rules, or when the first rule matching their method and path allows
//! them; a credential is added to the requests its own `methods` and
//! `paths` cover. A path with dot segments or encoded separators is
//! refused outright on such a host, since the upstream could resolve it to
//! a path no prefix names.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, header};
use schemars::JsonSchema;
use serde::Deserialize;

use super::policy::{Rule, parse_host_pattern};
use crate::stamp::Stamp;

/// How long a `value_from = { command = [...] }` may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of a value (a header this long is already unusual).
const MAX_VALUE_BYTES: u64 = 16 * 1024;

/// Credentials and request rules of one environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interception {
    credentials: Vec<Credential>,
    requests: Vec<RequestRule>,
}

/// A header the proxy adds to requests for a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    host: Rule,
    header: HeaderName,
    scheme: Option<String>,
    source: Arc<SecretSource>,
    scope: Scope,
}

/// An allow or deny rule on an intercepted host's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestRule {
    host: Rule,
    scope: Scope,
    allow: bool,
}

/// Methods and path prefixes; empty lists cover every method or path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Scope {
    methods: Vec<Method>,
    paths: Vec<String>,
}

impl Scope {
    fn covers(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && (self.paths.is_empty() || self.paths.iter().any(|p| path.starts_with(p.as_str())))
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let methods = if self.methods.is_empty() {
            "any method".to_string()
        } else {
            self.methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join("/")
        };
        let paths = if self.paths.is_empty() {
            "any path".to_string()
        } else {
            self.paths.join(", ")
        };
        write!(f, "{methods} on {paths}")
    }
}

/// Why a request to an intercepted host was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestRefusal {
    /// The first rule matching it denies it.
    DeniedBy(String),
    /// The host has rules and none matches.
    NoRule(String),
    /// Its path has dot segments or encoded separators.
    AmbiguousPath,
    /// It names another host than the one the connection is for.
    OtherHost(String),
    /// The sandbox's TLS asked for another name than the connection's host.
    OtherName(String),
    /// A CONNECT inside the intercepted connection.
    Tunnel,
}

impl fmt::Display for RequestRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestRefusal::DeniedBy(rule) => write!(f, "a rule denies {rule}"),
            RequestRefusal::NoRule(allowed) => {
                write!(f, "no rule allows it (allowed: {allowed})")
            }
            RequestRefusal::AmbiguousPath => f.write_str(
                "its path has '.' or '..' segments or encoded '/', '\\' or '.', which the \
                 host could read as another path than the rules see",
            ),
            RequestRefusal::OtherHost(other) => write!(
                f,
                "it names {other:?}, not the host the connection is for (credentials are only \
                 ever sent to the host they are for)"
            ),
            RequestRefusal::OtherName(other) => write!(
                f,
                "the TLS handshake asked for {other:?}, not the host the connection is for"
            ),
            RequestRefusal::Tunnel => f.write_str("a tunnel inside a tunnel is not allowed"),
        }
    }
}

impl Interception {
    pub fn is_empty(&self) -> bool {
        self.credentials.is_empty() && self.requests.is_empty()
    }

    pub fn has_credentials(&self) -> bool {
        !self.credentials.is_empty()
    }

    /// Whether requests to `name` are looked at one by one.
    pub fn intercepts(&self, name: &str) -> bool {
        self.credentials.iter().any(|c| c.host.matches_name(name))
            || self.requests.iter().any(|r| r.host.matches_name(name))
    }

    /// The host patterns named, as written in the configuration (`*.x` for
    /// a suffix): what the certificate authority may vouch for.
    pub fn hosts(&self) -> Vec<String> {
        let mut hosts = self.credential_hosts();
        hosts.extend(self.ruled_hosts());
        hosts.sort();
        hosts.dedup();
        hosts
    }

    /// The host patterns credentials are added for, each once.
    pub fn credential_hosts(&self) -> Vec<String> {
        unique(self.credentials.iter().map(|c| c.host.to_string()))
    }

    /// The host patterns whose requests rules decide, each once.
    pub fn ruled_hosts(&self) -> Vec<String> {
        unique(self.requests.iter().map(|r| r.host.to_string()))
    }

    /// Where this environment's values come from.
    pub fn sources(&self) -> impl Iterator<Item = &SecretSource> {
        self.credentials.iter().map(|c| c.source.as_ref())
    }

    /// Whether a request to `name` passes, and the credentials it carries.
    pub fn decide(
        &self,
        name: &str,
        method: &Method,
        path: &str,
    ) -> Result<Vec<&Credential>, RequestRefusal> {
        let scoped = self
            .credentials
            .iter()
            .any(|c| c.host.matches_name(name) && !c.scope.paths.is_empty());
        let rules: Vec<&RequestRule> = self
            .requests
            .iter()
            .filter(|r| r.host.matches_name(name))
            .collect();
        if (scoped || rules.iter().any(|r| !r.scope.paths.is_empty())) && ambiguous(path) {
            return Err(RequestRefusal::AmbiguousPath);
        }
        if !rules.is_empty() {
            match rules.iter().find(|r| r.scope.covers(method, path)) {
                Some(r) if !r.allow => return Err(RequestRefusal::DeniedBy(r.scope.to_string())),
                Some(_) => {}
                None => {
                    let allowed: Vec<String> = rules
                        .iter()
                        .filter(|r| r.allow)
                        .map(|r| r.scope.to_string())
                        .collect();
                    let allowed = if allowed.is_empty() {
                        "nothing".to_string()
                    } else {
                        allowed.join("; ")
                    };
                    return Err(RequestRefusal::NoRule(allowed));
                }
            }
        }
        Ok(self
            .credentials
            .iter()
            .filter(|c| c.host.matches_name(name) && c.scope.covers(method, path))
            .collect())
    }
}

/// Each once, in the order first written.
fn unique(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// A path a server might read differently from its bytes: `.` or `..`
/// segments, or `/`, `\` or `.` percent-encoded.
fn ambiguous(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c", "\\"]
        .iter()
        .any(|s| lower.contains(s))
    {
        return true;
    }
    path.split('/')
        .any(|segment| segment == "." || segment == "..")
}

impl Credential {
    /// The header's name and value, read now (a file's value as it is now).
    pub fn header(&self) -> Result<(HeaderName, HeaderValue), String> {
        let secret = self.source.value()?;
        let mut bytes = Vec::with_capacity(secret.0.len() + 16);
        if let Some(scheme) = &self.scheme {
            bytes.extend_from_slice(scheme.as_bytes());
            bytes.push(b' ');
        }
        bytes.extend_from_slice(&secret.0);
        let mut value = HeaderValue::from_bytes(&bytes)
            .map_err(|_| format!("{}: not a valid header value", self.source))?;
        value.set_sensitive(true);
        Ok((self.header.clone(), value))
    }

    pub fn host(&self) -> String {
        self.host.to_string()
    }
}

/// A credential's value; prints as `<secret>`.
#[derive(Clone, PartialEq, Eq)]
struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// Where a credential's value comes from, and the value last read.
pub struct SecretSource {
    from: ValueFrom,
    loaded: Mutex<Option<Loaded>>,
}

struct Loaded {
    secret: Secret,
    /// The file's identity and change time when it was read.
    stamp: Option<Stamp>,
}

impl PartialEq for SecretSource {
    fn eq(&self, other: &Self) -> bool {
        self.from == other.from
    }
}

impl Eq for SecretSource {}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretSource({self})")
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.from {
            ValueFrom::File(p) => write!(f, "the credential file {}", p.display()),
            ValueFrom::Env(v) => write!(f, "the credential variable {v}"),
            ValueFrom::Command(argv) => write!(f, "the credential command {argv:?}"),
        }
    }
}

impl SecretSource {
    fn new(from: ValueFrom) -> SecretSource {
        SecretSource {
            from,
            loaded: Mutex::new(None),
        }
    }

    /// The file the value is read from, links followed (as written when
    /// it cannot be resolved): where it really is, for the checks of who
    /// else can read it.
    pub fn file(&self) -> Option<PathBuf> {
        match &self.from {
            ValueFrom::File(p) => Some(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())),
            _ => None,
        }
    }

    /// The server's variable the value is read from.
    pub fn variable(&self) -> Option<&str> {
        match &self.from {
            ValueFrom::Env(v) => Some(v),
            _ => None,
        }
    }

    /// Reads the value now (at start: a failure stops the server, saying
    /// which source failed and why, never the value).
    pub fn load(&self) -> Result<(), String> {
        let loaded = self.read()?;
        *self.lock() = Some(loaded);
        Ok(())
    }

    /// The value: a file's is read again when the file has changed; a
    /// variable's and a command's are those read at start.
    fn value(&self) -> Result<Secret, String> {
        let mut loaded = self.lock();
        if let ValueFrom::File(path) = &self.from {
            let now = Stamp::of(path).map_err(|e| format!("{self}: {e}"))?;
            if loaded.as_ref().and_then(|l| l.stamp) != Some(now) {
                *loaded = Some(self.read()?);
            }
        }
        match loaded.as_ref() {
            Some(l) => Ok(l.secret.clone()),
            None => Err(format!("{self} was not read at start")),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Loaded>> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> Result<Loaded, String> {
        let fail = |why: String| format!("{self}: {why}");
        let (raw, stamp) = match &self.from {
            ValueFrom::File(path) => {
                use std::io::Read;
                let stamp = Stamp::of(path).map_err(|e| fail(e.to_string()))?;
                let mut bytes = Vec::new();
                std::fs::File::open(path)
                    .and_then(|f| f.take(MAX_VALUE_BYTES + 1).read_to_end(&mut bytes))
                    .map_err(|e| fail(e.to_string()))?;
                (bytes, Some(stamp))
            }
            ValueFrom::Env(name) => match std::env::var_os(name) {
                Some(v) => (v.into_encoded_bytes(), None),
                None => return Err(fail("the server's environment does not set it".into())),
            },
            ValueFrom::Command(argv) => (run_command(argv).map_err(fail)?, None),
        };
        let value = trim_line_end(raw);
        if value.is_empty() {
            return Err(fail("the value is empty".into()));
        }
        if value.len() as u64 > MAX_VALUE_BYTES {
            return Err(fail(format!("the value is over {MAX_VALUE_BYTES} bytes")));
        }
        if HeaderValue::from_bytes(&value).is_err() {
            return Err(fail(
                "the value holds a line break or a control character, which a header cannot".into(),
            ));
        }
        Ok(Loaded {
            secret: Secret(value),
            stamp,
        })
    }
}

/// Without the trailing newline a file or a command's output usually ends with.
fn trim_line_end(mut v: Vec<u8>) -> Vec<u8> {
    while v.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        v.pop();
    }
    v
}

/// A command's standard output, if it exits with 0 within the timeout.
fn run_command(argv: &[String]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let (program, args) = argv.split_first().ok_or("the command is empty")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no output pipe")?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout)
            .take(MAX_VALUE_BYTES + 1)
            .read_to_end(&mut out);
        out
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < COMMAND_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "it did not finish within {}s",
                    COMMAND_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let out = reader.join().map_err(|_| "reading its output failed")?;
    if !status.success() {
        return Err(format!("it failed ({status})"));
    }
    Ok(out)
}

/// Where a value comes from, as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub(super) enum ValueFrom {
    /// A file the server reads (again whenever it changes); an absolute
    /// path, not under the project or any directory a sandbox sees.
    File(PathBuf),
    /// A variable of the server's environment, read at start; not one
    /// that `[project.inherit_env]` passes to sandboxes.
    Env(String),
    /// A program and its arguments, run at start without a shell; its
    /// standard output is the value.
    Command(Vec<String>),
}

/// One `credentials` entry as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CredentialTable {
    /// The host it is sent to: an exact name, or "*.suffix"; the
    /// allowlist must admit it.
    host: String,
    /// The header the proxy adds (default "Authorization").
    header: Option<String>,
    /// Written before the value and a space, e.g. "Bearer" or "token".
    scheme: Option<String>,
    /// Where the server reads the value: { file = "/run/secrets/gh" },
    /// { env = "GH_TOKEN" } or { command = ["pass", "show", "gh"] }.
    value_from: ValueFrom,
    /// Only requests with these methods carry it (default: any).
    #[serde(default)]
    methods: Vec<String>,
    /// Only requests whose path starts with one of these carry it (default: any).
    #[serde(default)]
    paths: Vec<String>,
}

/// One `requests` entry as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RequestTable {
    /// The host whose requests it decides: an exact name, or "*.suffix".
    host: String,
    /// The methods it matches (default: any).
    #[serde(default)]
    methods: Vec<String>,
    /// The path prefixes it matches (default: any).
    #[serde(default)]
    paths: Vec<String>,
    /// "allow" (default) or "deny". A host's first matching rule decides;
    /// a request no rule matches is denied.
    #[serde(default)]
    action: Action,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Action {
    #[default]
    Allow,
    Deny,
}

/// Headers a credential may not set: the proxy's and the connection's own.
const RESERVED_HEADERS: [HeaderName; 10] = [
    header::HOST,
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::EXPECT,
];

impl Interception {
    /// Checks the tables as written; `admitted` says whether the allowlist
    /// admits a host pattern.
    pub(super) fn from_tables(
        credentials: Vec<CredentialTable>,
        requests: Vec<RequestTable>,
        admitted: impl Fn(&Rule) -> bool,
    ) -> Result<Interception, String> {
        let host = |which: &str, i: usize, written: &str| -> Result<Rule, String> {
            let rule =
                parse_host_pattern(written).map_err(|why| format!("{which}[{i}].host: {why}"))?;
            if !admitted(&rule) {
                return Err(format!(
                    "{which}[{i}].host: {written} is not admitted by the allowlist; add it to allow"
                ));
            }
            Ok(rule)
        };
        let mut out = Interception::default();
        for (i, c) in credentials.into_iter().enumerate() {
            let at = |what: &str| format!("credentials[{i}].{what}");
            let header = c.header.as_deref().unwrap_or("authorization");
            let header = HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| format!("{}: {header:?} is not a header name", at("header")))?;
            if RESERVED_HEADERS.contains(&header) {
                return Err(format!(
                    "{}: the proxy cannot add {header}; it belongs to the connection",
                    at("header")
                ));
            }
            if let Some(s) = &c.scheme
                && (s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic()))
            {
                return Err(format!(
                    "{}: write one word, such as \"Bearer\"",
                    at("scheme")
                ));
            }
            let from = match c.value_from {
                ValueFrom::File(p) if !p.is_absolute() => {
                    return Err(format!(
                        "{}: the file must be an absolute path",
                        at("value_from")
                    ));
                }
                ValueFrom::Env(v) if v.is_empty() || v.contains('=') => {
                    return Err(format!("{}: not a variable name: {v:?}", at("value_from")));
                }
                ValueFrom::Command(argv) if argv.is_empty() => {
                    return Err(format!(
                        "{}: the command is empty; write [\"program\", \"arg\", ...]",
                        at("value_from")
                    ));
                }
                from => from,
            };
            out.credentials.push(Credential {
                host: host("credentials", i, &c.host)?,
                header,
                scheme: c.scheme,
                source: Arc::new(SecretSource::new(from)),
                scope: scope(&at(""), c.methods, c.paths)?,
            });
        }
        for (i, r) in requests.into_iter().enumerate() {
            out.requests.push(RequestRule {
                host: host("requests", i, &r.host)?,
                scope: scope(&format!("requests[{i}]."), r.methods, r.paths)?,
                allow: r.action == Action::Allow,
            });
        }
        Ok(out)
    }
}

/// A scope from methods and paths as written; `at` names the entry.
fn scope(at: &str, methods: Vec<String>, paths: Vec<String>) -> Result<Scope, String> {
    let mut scope = Scope::default();
    for m in methods {
        let upper = m.to_ascii_uppercase();
        let method = Method::from_bytes(upper.as_bytes())
            .map_err(|_| format!("{at}methods: {m:?} is not an HTTP method"))?;
        scope.methods.push(method);
    }
    for p in paths {
        if !p.starts_with('/') || ambiguous(&p) || p.contains(['?', '#']) {
            return Err(format!(
                "{at}paths: {p:?}: write a path prefix starting with '/', without '.' or '..' \
                 segments, encoded characters, a query or a fragment"
            ));
        }
        scope.paths.push(p);
    }
    Ok(scope)
}

#[cfg(test)]
mod tests;
