//! The allowlist of one environment and the configuration value it is read
//! from: `network = false | true | { allow = [...] }`.
//!
//! An entry is an exact host name (`pypi.org`), a suffix wildcard
//! (`*.pythonhosted.org`: any name ending in `.pythonhosted.org`, not
//! `pythonhosted.org` itself), an IP address or a CIDR range, or `*` (any
//! host name). Names match case-insensitively with a trailing dot ignored.
//! Internationalised names must be written in their ASCII (`xn--`) form:
//! HTTP clients send that form, and rejecting other spellings keeps one
//! way of writing each name (no Unicode normalisation crate needed).
//! Ports are not part of an entry: every port of an allowed host is open.
//!
//! A request passes in two steps. First the host as the client wrote it:
//! a name must match a name entry; an IP literal must lie in a listed
//! address or range, or, under `*`, be public. Then every address the
//! proxy resolved: an address in a refused range (loopback, private,
//! link-local, metadata…, see `address.rs`) fails the request unless a
//! listed range contains it. So listed ranges do two things: they make IP
//! literals reachable, and they let allowed names resolve into otherwise
//! refused space (an internal registry on 10.1.2.0/24, say).
//!
//! `network = true` is `{ allow = ["*"] }`: any public host, still through
//! the proxy, still refusing loopback, private, link-local and metadata
//! addresses. Opening the sandbox to the host's own network is never what
//! "network on" should mean, and one path out is simpler to reason about
//! than two.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, de::value::MapAccessDeserializer};

use super::address::{Refused, refused_range};
use super::credentials::{CredentialTable, Interception, RequestRefusal, RequestTable};

/// Connections a run may have open through the proxy at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 32;
/// Bytes a run may move through the proxy (both ways), by default: 1 GiB.
pub const DEFAULT_TRANSFER_MB: u64 = 1024;
/// The largest `max_connections` accepted: beyond it the bound bounds little.
const MAX_CONNECTIONS_CEILING: u32 = 1024;

/// An environment's `network` setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NetworkSetting {
    /// `false`: no network at all (no proxy either).
    #[default]
    Off,
    /// `true` or a table: traffic through the proxy under this policy.
    Proxied(Policy),
}

impl NetworkSetting {
    pub fn policy(&self) -> Option<&Policy> {
        match self {
            NetworkSetting::Off => None,
            NetworkSetting::Proxied(p) => Some(p),
        }
    }
}

/// What one sandbox may reach, and how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// In the order written (the summary shows them so).
    rules: Vec<Rule>,
    pub bounds: Bounds,
    /// Credentials added and rules on requests, for the hosts they name.
    pub interception: Interception,
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// `*`: any host name (and any public IP literal).
    AnyName,
    /// An exact name, normalised.
    Name(String),
    /// `*.suffix`: names ending in `.suffix` (stored without the `*.`).
    Suffix(String),
    /// An address or range, reachable even where the filter refuses.
    Addresses(IpNet),
}

impl Rule {
    /// Whether a host name (normalised) matches this entry.
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            Rule::AnyName => true,
            Rule::Name(n) => n == name,
            Rule::Suffix(s) => {
                name.len() > s.len() + 1
                    && name.ends_with(s.as_str())
                    && name.as_bytes()[name.len() - s.len() - 1] == b'.'
            }
            Rule::Addresses(_) => false,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::AnyName => f.write_str("*"),
            Rule::Name(n) => f.write_str(n),
            Rule::Suffix(s) => write!(f, "*.{s}"),
            Rule::Addresses(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{}", net.addr())
            }
            Rule::Addresses(net) => write!(f, "{net}"),
        }
    }
}

/// Per-run bounds of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Client connections open at once (a CONNECT tunnel or a keep-alive
    /// HTTP connection is one).
    pub max_connections: u32,
    /// Bytes moved through the proxy, both ways together, per run.
    pub max_transfer_bytes: u64,
    /// Resolving a name and connecting to it, together.
    pub connect_timeout: Duration,
    /// A connection with no bytes either way for this long is closed; an
    /// upstream that sends no response head for this long gets a 504.
    pub idle_timeout: Duration,
    /// Time a client has to send a request's head (also between requests
    /// on a kept-alive connection).
    pub header_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_transfer_bytes: DEFAULT_TRANSFER_MB << 20,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            header_timeout: Duration::from_secs(30),
        }
    }
}

/// A request's host as the client wrote it, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// Parses the host part of a request target (`[::1]` for IPv6).
    pub fn parse(s: &str) -> Result<Host, String> {
        let bare = s
            .strip_prefix('[')
            .and_then(|v| v.strip_suffix(']'))
            .unwrap_or(s);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Host::Ip(ip.to_canonical()));
        }
        normalise_name(s).map(Host::Name)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why the proxy refused a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// The name, or the IP literal, is not on the allowlist.
    NotListed { host: Host, allowed: String },
    /// The host is (or resolved to) an address in a refused range that the
    /// allowlist does not name.
    Address {
        host: Host,
        addr: IpAddr,
        refused: Refused,
    },
    /// A request to an intercepted host that its rules refuse.
    Request {
        host: Host,
        method: String,
        path: String,
        refusal: RequestRefusal,
    },
}

impl Denial {
    pub fn host(&self) -> &Host {
        match self {
            Denial::NotListed { host, .. }
            | Denial::Address { host, .. }
            | Denial::Request { host, .. } => host,
        }
    }

    /// A short, stable name of the rule that refused (for logs and results).
    pub fn rule(&self) -> &'static str {
        match self {
            Denial::NotListed { .. } => "not-on-allowlist",
            Denial::Address { .. } => "refused-address",
            Denial::Request { .. } => "request-rule",
        }
    }

    /// How the result lists what was refused: the host, or for a request
    /// the method, host and path ("POST api.example.com/v1/x").
    pub fn subject(&self) -> String {
        match self {
            Denial::Request {
                host, method, path, ..
            } => format!("{method} {host}{path}"),
            other => other.host().to_string(),
        }
    }

    /// What would let this through.
    pub fn remedy(&self) -> String {
        let listed = |entry: String| {
            format!(
                "To allow it, add \"{entry}\" to this environment's network allowlist \
                 (network = {{ allow = [...] }} in the server's configuration)"
            )
        };
        match self {
            Denial::NotListed { host, .. } => listed(host.to_string()),
            Denial::Address { refused, .. } => listed(refused.range.to_string()),
            Denial::Request {
                refusal:
                    RequestRefusal::OtherHost(_) | RequestRefusal::OtherName(_) | RequestRefusal::Tunnel,
                ..
            } => "Send requests for another host on a connection to that host (clients do \
                  this for each URL on their own)"
                .to_string(),
            Denial::Request { host, .. } => format!(
                "Only the user can change the request rules for {host} (the environment's \
                 network requests in the server's configuration)"
            ),
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotListed {
                host: Host::Name(n),
                allowed,
            } => write!(
                f,
                "{n} is not on this environment's network allowlist (allowed: {allowed})"
            ),
            Denial::NotListed {
                host: Host::Ip(ip),
                allowed,
            } => write!(
                f,
                "{ip} is an IP address that this environment's network allowlist does not name \
                 (allowed: {allowed}); addresses are reachable only when the allowlist lists \
                 them or their range"
            ),
            Denial::Address {
                host,
                addr,
                refused,
            } => {
                match host {
                    Host::Name(n) => write!(f, "{n} resolves to {addr}, ")?,
                    Host::Ip(_) => write!(f, "{addr} is ")?,
                }
                write!(
                    f,
                    "{refused}; the proxy refuses loopback, private, link-local and metadata \
                     addresses unless the allowlist names the range"
                )
            }
            Denial::Request {
                host,
                method,
                path,
                refusal,
            } => write!(
                f,
                "{method} {path} on {host} is refused by this environment's request rules: {refusal}"
            ),
        }
    }
}

impl Policy {
    /// Any public host (`network = true`).
    pub fn any_public() -> Policy {
        Policy {
            rules: vec![Rule::AnyName],
            bounds: Bounds::default(),
            interception: Interception::default(),
        }
    }

    /// A policy from allowlist entries as written in the configuration.
    pub fn from_entries<S: AsRef<str>>(entries: &[S], bounds: Bounds) -> Result<Policy, String> {
        let mut rules: Vec<Rule> = Vec::new();
        for e in entries {
            let rule = parse_entry(e.as_ref())?;
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
        Ok(Policy {
            rules,
            bounds,
            interception: Interception::default(),
        })
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// One line for the tool description: "pypi.org, *.pythonhosted.org",
    /// with `*` written as "any public host".
    pub fn summary(&self) -> String {
        if self.rules.is_empty() {
            return "no hosts".to_string();
        }
        self.rules
            .iter()
            .map(|r| match r {
                Rule::AnyName => "any public host".to_string(),
                r => r.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The summary, and the hosts the proxy adds credentials for or holds
    /// to request rules: what the agent reads about an environment.
    pub fn described(&self) -> String {
        let mut text = self.summary();
        let credentials = self.interception.credential_hosts();
        if !credentials.is_empty() {
            text += &format!(
                "; the proxy adds credentials for {} (the sandbox holds none)",
                credentials.join(", ")
            );
        }
        let ruled = self.interception.ruled_hosts();
        if !ruled.is_empty() {
            text += &format!("; requests to {} are limited by rules", ruled.join(", "));
        }
        text
    }

    /// What of this policy `bound` does not allow: the first entry no
    /// entry of `bound` covers, or a per-run bound above `bound`'s; `None`
    /// when this policy is within it (a declared command of the project
    /// may never reach further than the operator lets it).
    pub fn exceeds(&self, bound: &Policy) -> Option<String> {
        if let Some(rule) = self.rules.iter().find(|r| !bound.covers(r)) {
            return Some(match rule {
                Rule::AnyName => "any public host".to_string(),
                r => r.to_string(),
            });
        }
        let (mine, most) = (self.bounds, bound.bounds);
        if mine.max_connections > most.max_connections {
            return Some(format!(
                "max_connections = {} (at most {})",
                mine.max_connections, most.max_connections
            ));
        }
        if mine.max_transfer_bytes > most.max_transfer_bytes {
            return Some(format!(
                "transfer_mb = {} (at most {})",
                mine.max_transfer_bytes >> 20,
                most.max_transfer_bytes >> 20
            ));
        }
        None
    }

    /// Whether every host `rule` matches is one this policy lists.
    fn covers(&self, rule: &Rule) -> bool {
        self.rules.iter().any(|b| match (rule, b) {
            (_, Rule::AnyName) => !matches!(rule, Rule::Addresses(_)),
            (Rule::Name(n), _) => self.admits(&Host::Name(n.clone())).is_ok(),
            (Rule::Suffix(s), Rule::Suffix(t)) => {
                s == t || (s.len() > t.len() + 1 && s.ends_with(&format!(".{t}")))
            }
            (Rule::Addresses(net), Rule::Addresses(b)) => b.contains(net),
            _ => false,
        })
    }

    /// Whether requests to `host` are looked at one by one (it has
    /// credentials or request rules).
    pub fn intercepts(&self, host: &Host) -> bool {
        matches!(host, Host::Name(n) if self.interception.intercepts(n))
    }

    /// First step: may a request for `host` go ahead (to resolution)?
    pub fn admits(&self, host: &Host) -> Result<(), Denial> {
        let listed = match host {
            Host::Name(name) => self.rules.iter().any(|r| r.matches_name(name)),
            Host::Ip(ip) if self.lists_address(*ip) => true,
            Host::Ip(ip) if self.rules.contains(&Rule::AnyName) => {
                return self.check_addresses(host, &[*ip]);
            }
            Host::Ip(_) => false,
        };
        if listed {
            Ok(())
        } else {
            Err(Denial::NotListed {
                host: host.clone(),
                allowed: self.summary(),
            })
        }
    }

    /// Second step: may the proxy connect to these addresses of `host`?
    /// Every one is checked; one refused address refuses the host, since a
    /// name that mixes public and internal addresses is a rebinding attempt
    /// or a misconfiguration, and neither should depend on which is tried first.
    pub fn check_addresses(&self, host: &Host, addrs: &[IpAddr]) -> Result<(), Denial> {
        for addr in addrs {
            let addr = addr.to_canonical();
            if self.lists_address(addr) {
                continue;
            }
            if let Some(refused) = refused_range(addr) {
                return Err(Denial::Address {
                    host: host.clone(),
                    addr,
                    refused,
                });
            }
        }
        Ok(())
    }

    fn lists_address(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.rules
            .iter()
            .any(|r| matches!(r, Rule::Addresses(net) if net.contains(&ip)))
    }
}

/// Parses one allowlist entry; the error says what is wrong and how to write it.
fn parse_entry(entry: &str) -> Result<Rule, String> {
    let problem = |why: &str| Err(format!("allowlist entry {entry:?}: {why}"));
    if entry == "*" {
        return Ok(Rule::AnyName);
    }
    if entry.trim() != entry || entry.is_empty() {
        return problem("write the entry without spaces");
    }
    if entry.contains("://") {
        return problem("write a host name without a scheme or path, e.g. \"pypi.org\"");
    }
    if entry.contains('/') {
        let Ok(net) = entry.parse::<IpNet>() else {
            return problem("not a host name, an address or a CIDR range such as \"10.0.0.0/8\"");
        };
        if net.trunc() != net {
            return problem(&format!(
                "the range has host bits set; did you mean \"{}\"?",
                net.trunc()
            ));
        }
        return Ok(Rule::Addresses(canonical_net(net)));
    }
    let bare = entry
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(entry);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(Rule::Addresses(IpNet::from(ip.to_canonical())));
    }
    if let Some(suffix) = entry.strip_prefix("*.") {
        return match normalise_name(suffix) {
            Ok(s) => Ok(Rule::Suffix(s)),
            Err(why) => problem(&why),
        };
    }
    if entry.contains('*') {
        return problem(
            "`*` may only be a whole first label, as in \"*.example.com\", or the whole entry \
             (any public host)",
        );
    }
    if entry.contains(':') {
        return problem("ports are not part of an entry; every port of an allowed host is open");
    }
    normalise_name(entry)
        .map(Rule::Name)
        .or_else(|why| problem(&why))
}

/// A host name or `*.suffix`, as credentials and request rules name hosts
/// (the proxy presents a certificate for the name, so never an address).
pub(super) fn parse_host_pattern(entry: &str) -> Result<Rule, String> {
    match parse_entry(entry)? {
        Rule::Addresses(_) => Err(format!(
            "{entry:?}: name a host, not an address (the proxy shows the sandbox a certificate \
             for the host's name)"
        )),
        Rule::AnyName => Err("name a host or \"*.suffix\", not every host".to_string()),
        rule => Ok(rule),
    }
}

/// An IPv4-mapped IPv6 range as the IPv4 range it is, so it matches the
/// canonical addresses the proxy checks.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && v6.prefix_len() >= 96
        && let IpAddr::V4(v4) = IpAddr::V6(v6.network()).to_canonical()
    {
        return IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net);
    }
    net
}

/// A host name in the one form the policy compares: ASCII, lower case, no
/// trailing dot, labels of letters, digits, `-` and `_`. Names whose last
/// label is numeric are refused: resolvers read `127.1` or `0x7f000001` as
/// addresses, and such spellings are only ever used to slip past filters.
fn normalise_name(name: &str) -> Result<String, String> {
    if !name.is_ascii() {
        return Err(
            "write internationalised names in their ASCII form (xn--…), as HTTP clients send them"
                .to_string(),
        );
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name.is_empty() || name.len() > 253 {
        return Err("not a host name (empty or longer than 253 characters)".to_string());
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("not a host name (an empty or over-long label)".to_string());
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(
                "not a host name (only letters, digits, '-' and '_' between dots)".to_string(),
            );
        }
    }
    let last = name.rsplit('.').next().unwrap_or_default();
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if last.bytes().all(|b| b.is_ascii_digit()) || hex {
        return Err(
            "looks like a numeric address; write addresses in standard form, e.g. 127.0.0.1"
                .to_string(),
        );
    }
    Ok(name)
}

/// The shape of an allowlist entry, for the schema (the Nix side checks
/// with it; the daemon parses each entry fully): a name, a `*.` suffix, `*`,
/// or an address or range, without scheme, port or path.
const ALLOW_ENTRY_PATTERN: &str = "^([*]|([*][.])?[A-Za-z0-9_-]+([.][A-Za-z0-9_-]+)*[.]?|[0-9.]+(/[0-9]+)?|[0-9A-Fa-f:.]+(/[0-9]+)?)$";

/// Only the listed hosts, through the daemon's proxy (the table form).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AllowTable {
    /// Hosts the sandbox may reach through the proxy: exact names
    /// ("pypi.org"), suffix wildcards ("*.pythonhosted.org", which does not
    /// match "pythonhosted.org" itself), IP addresses or CIDR ranges
    /// ("10.1.2.0/24"), or "*" for any public host. Loopback, private,
    /// link-local and metadata addresses stay refused unless a listed range
    /// contains them.
    #[schemars(length(min = 1), inner(regex(pattern = ALLOW_ENTRY_PATTERN)))]
    allow: Vec<String>,
    /// Connections a run may have open through the proxy at once (default 32).
    #[schemars(range(min = 1, max = 1024))]
    max_connections: Option<u32>,
    /// MiB a run may move through the proxy, both ways together (default 1024).
    #[schemars(range(min = 1, max = 1_048_576))]
    transfer_mb: Option<u64>,
    /// Headers the proxy adds to requests for a host, with values the
    /// sandbox never sees (the proxy ends TLS for that host with its own
    /// certificate authority, which the sandbox trusts).
    #[serde(default)]
    credentials: Vec<CredentialTable>,
    /// Which requests to a host pass, by method and path prefix: each
    /// host's first matching rule decides, and a request none matches is
    /// refused (the proxy ends TLS for that host too).
    #[serde(default)]
    requests: Vec<RequestTable>,
}

impl AllowTable {
    fn into_policy(self) -> Result<Policy, String> {
        let mut bounds = Bounds::default();
        if let Some(n) = self.max_connections {
            if !(1..=MAX_CONNECTIONS_CEILING).contains(&n) {
                return Err(format!(
                    "max_connections: {n} is out of range (expected 1 to {MAX_CONNECTIONS_CEILING})"
                ));
            }
            bounds.max_connections = n;
        }
        if let Some(mb) = self.transfer_mb {
            if mb == 0 || mb > 1 << 20 {
                return Err(format!(
                    "transfer_mb: {mb} is out of range (expected 1 to 1048576)"
                ));
            }
            bounds.max_transfer_bytes = mb << 20;
        }
        if self.allow.is_empty() {
            return Err(
                "allow is empty: list the hosts, write `network = true` for any public host, \
                 or `network = false` for none"
                    .to_string(),
            );
        }
        let mut policy = Policy::from_entries(&self.allow, bounds)?;
        policy.interception =
            Interception::from_tables(self.credentials, self.requests, |r| policy.covers(r))?;
        Ok(policy)
    }
}

const EXPECTING: &str =
    "false, true, or a table such as { allow = [\"pypi.org\", \"*.pythonhosted.org\"] }";

impl<'de> Deserialize<'de> for NetworkSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SettingVisitor;
        impl<'de> Visitor<'de> for SettingVisitor {
            type Value = NetworkSetting;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTING)
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<NetworkSetting, E> {
                Ok(if on {
                    NetworkSetting::Proxied(Policy::any_public())
                } else {
                    NetworkSetting::Off
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NetworkSetting, A::Error> {
                let table = AllowTable::deserialize(MapAccessDeserializer::new(map))?;
                table
                    .into_policy()
                    .map(NetworkSetting::Proxied)
                    .map_err(de::Error::custom)
            }
        }
        d.deserialize_any(SettingVisitor)
    }
}

impl JsonSchema for NetworkSetting {
    fn schema_name() -> Cow<'static, str> {
        "NetworkSetting".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let table = generator.subschema_for::<AllowTable>();
        json_schema!({
            "description": "Network access: false (none), true (any public host, through the \
                daemon's proxy), or { allow = [...] } (only the listed hosts, through the proxy).",
            "x-expected": EXPECTING,
            // anyOf, not oneOf: the two forms cannot overlap, and the Nix
            // side's checker (nix/lib/schema.nix) understands anyOf.
            "anyOf": [{ "type": "boolean" }, table],
        })
    }
}

#[cfg(test)]
mod tests;
