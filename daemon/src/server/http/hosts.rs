//! DNS rebinding protection: the `Host` a request names must be one this
//! server is reached by, and a browser's `Origin`, when there is one, one
//! the operator allowed.

use http::HeaderMap;
use http::header::{HOST, ORIGIN};

use super::refusal::Refusal;
use http::StatusCode;

/// The accepted `Host` and `Origin` values.
#[derive(Debug, Clone)]
pub struct Allowed {
    /// `host` (any port) or `host:port`, lower case.
    pub hosts: Vec<String>,
    /// `scheme://host[:port|:*]`, lower case, or `null`.
    pub origins: Vec<String>,
}

/// The names every server accepts: the loopback ones.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl Allowed {
    /// Checks a request's `Host` and `Origin`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let host = match headers.get_all(HOST).iter().collect::<Vec<_>>()[..] {
            [one] => one.to_str().ok(),
            [] => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "the request has no Host header",
                ));
            }
            _ => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "the request has more than one Host header",
                ));
            }
        };
        let host = host
            .and_then(|h| h.parse::<http::uri::Authority>().ok())
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "the Host header is not a host name",
                )
            })?;
        if !self.host_allowed(host.host(), host.port_u16()) {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the Host {:?} is not one this server is reached by (it may be a DNS rebinding attack); the operator can allow it in [http] allowed_hosts",
                    host.as_str()
                ),
            ));
        }
        let origins: Vec<_> = headers.get_all(ORIGIN).iter().collect();
        match origins[..] {
            [] => Ok(()),
            [one] if one.to_str().is_ok_and(|o| self.origin_allowed(o)) => Ok(()),
            _ => Err(Refusal::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the Origin {:?} is not allowed; the operator can allow it in [http] allowed_origins",
                    origins.first().and_then(|o| o.to_str().ok()).unwrap_or("?")
                ),
            )),
        }
    }

    fn host_allowed(&self, host: &str, port: Option<u16>) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        self.hosts.iter().any(|entry| match split_host_port(entry) {
            Some((h, None)) => h == host,
            Some((h, Some(p))) => h == host && Some(p) == port,
            None => false,
        })
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        if origin == "null" {
            return self.origins.iter().any(|o| o == "null");
        }
        let Some((scheme, host, port)) = parse_origin(&origin) else {
            return false;
        };
        self.origins.iter().any(|entry| {
            if let Some(base) = entry.strip_suffix(":*") {
                return parse_origin(base).is_some_and(|(s, h, _)| s == scheme && h == host);
            }
            parse_origin(entry).is_some_and(|e| e == (scheme.clone(), host.clone(), port))
        })
    }
}

/// `host` or `host:port` (brackets around IPv6 taken off), lower case.
fn split_host_port(entry: &str) -> Option<(String, Option<u16>)> {
    let entry = entry.to_ascii_lowercase();
    if let Ok(ip) = entry
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        return Some((ip.to_string(), None));
    }
    let a: http::uri::Authority = entry.parse().ok()?;
    let host = a
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Some((host, a.port_u16()))
}

/// An origin's scheme, host and port (the scheme's default when none).
fn parse_origin(origin: &str) -> Option<(String, String, u16)> {
    let uri: http::Uri = origin.parse().ok()?;
    let scheme = uri.scheme_str()?.to_string();
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().or(match scheme.as_str() {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    })?;
    Some((scheme, host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Allowed {
        Allowed {
            hosts: ["localhost", "127.0.0.1", "::1", "sandbox.example.com:8443"]
                .map(String::from)
                .to_vec(),
            origins: ["http://localhost:*", "https://app.example.com"]
                .map(String::from)
                .to_vec(),
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn loopback_and_configured_hosts_pass_and_others_are_refused() {
        let a = allowed();
        for ok in [
            "localhost:8765",
            "127.0.0.1",
            "[::1]:9",
            "LOCALHOST",
            "sandbox.example.com:8443",
        ] {
            assert!(a.check(&headers(&[("host", ok)])).is_ok(), "{ok}");
        }
        for (bad, status) in [
            ("evil.example", 403),
            ("sandbox.example.com", 403),
            ("sandbox.example.com:8444", 403),
            ("127.0.0.2", 403),
            ("a b", 400),
        ] {
            let e = a.check(&headers(&[("host", bad)])).unwrap_err();
            assert_eq!(e.status.as_u16(), status, "{bad}: {e:?}");
        }
        assert_eq!(a.check(&headers(&[])).unwrap_err().status, 400);
        let two = headers(&[("host", "localhost"), ("host", "evil.example")]);
        assert_eq!(a.check(&two).unwrap_err().status, 400);
    }

    #[test]
    fn origins_pass_only_when_allowed_and_absent_ones_pass() {
        let a = allowed();
        let with = |o: &str| a.check(&headers(&[("host", "localhost"), ("origin", o)]));
        for ok in [
            "http://localhost:3000",
            "http://localhost",
            "https://app.example.com",
            "https://app.example.com:443",
        ] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        for bad in [
            "https://evil.example",
            "http://app.example.com",
            "https://app.example.com:444",
            "null",
            "https://localhost:3000",
            "garbage",
        ] {
            assert_eq!(with(bad).unwrap_err().status, 403, "{bad}");
        }
    }
}
