//! Where `serve --http` listens: `HOST:PORT` (an IP address or
//! `localhost`) or `unix:PATH`, and whether that is reachable only from
//! this machine.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp(SocketAddr),
    /// A Unix socket (its permissions say who may connect).
    Unix(PathBuf),
}

impl FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Address, String> {
        const FORMS: &str = "expected HOST:PORT, such as 127.0.0.1:8765, [::1]:8765 or localhost:8765, or unix:PATH";
        if let Some(path) = s.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("{s:?}: a socket's path must be absolute ({FORMS})"));
            }
            return Ok(Address::Unix(path));
        }
        if let Some(port) = s.strip_prefix("localhost:") {
            let port: u16 = port
                .parse()
                .map_err(|_| format!("{s:?}: {port:?} is not a port ({FORMS})"))?;
            return Ok(Address::Tcp(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            )));
        }
        s.parse::<SocketAddr>()
            .map(Address::Tcp)
            .map_err(|_| format!("{s:?} is not an address to listen on ({FORMS})"))
    }
}

impl Address {
    /// Only this machine can connect: a loopback address or a Unix socket.
    pub fn is_local(&self) -> bool {
        match self {
            Address::Tcp(a) => a.ip().is_loopback(),
            Address::Unix(_) => true,
        }
    }

    /// `Host` values a client of this address sends besides the loopback
    /// names: the IP address itself, when it is a specific one.
    pub fn host_names(&self) -> Vec<String> {
        match self {
            Address::Tcp(a) if !a.ip().is_unspecified() => vec![a.ip().to_string()],
            _ => vec![],
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(a) => write!(f, "{a}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_say_whether_they_are_local() {
        let local = [
            "127.0.0.1:8765",
            "[::1]:1",
            "localhost:8765",
            "unix:/run/x.sock",
        ];
        for a in local {
            assert!(a.parse::<Address>().unwrap().is_local(), "{a}");
        }
        for a in ["0.0.0.0:8765", "[::]:8765", "192.0.2.1:80"] {
            assert!(!a.parse::<Address>().unwrap().is_local(), "{a}");
        }
        for bad in [
            "8765",
            "unix:relative.sock",
            "localhost:x",
            "example.com:80",
            "",
        ] {
            let e = bad.parse::<Address>().unwrap_err();
            assert!(e.contains("expected HOST:PORT"), "{bad}: {e}");
        }
        assert_eq!(
            "0.0.0.0:1".parse::<Address>().unwrap().host_names(),
            Vec::<String>::new()
        );
        assert_eq!(
            "192.0.2.1:1".parse::<Address>().unwrap().host_names(),
            vec!["192.0.2.1".to_string()]
        );
    }
}
