//! Name resolution for the proxy: the host's own resolver (through tokio,
//! so `/etc/hosts`, nsswitch and the configured DNS servers all apply), and
//! a fixed map of names to addresses that takes precedence over it.
//!
//! The map is how tests without internet point real names at servers on
//! this machine: `NIX_SANDBOX_TEST_RESOLVE` (`name=address,name=address,…`;
//! repeat a name for several addresses), honoured only by builds with the
//! `test-knobs` feature (see `config::knobs`), never by a release. Even
//! there every address, mapped or resolved, still goes through the
//! address filter, so a map entry can never reach loopback or the LAN
//! unless the allowlist names the range; the daemon warns on stderr when
//! the map is in use.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

/// Resolves names for the proxy. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    fixed: Arc<HashMap<String, Vec<IpAddr>>>,
}

impl Resolver {
    /// The host's resolver only.
    pub fn system() -> Resolver {
        Resolver::default()
    }

    /// The host's resolver, except for the names in `fixed`.
    pub fn with_fixed(fixed: impl IntoIterator<Item = (String, IpAddr)>) -> Resolver {
        let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (name, addr) in fixed {
            let key = name.trim_end_matches('.').to_ascii_lowercase();
            let addrs = map.entry(key).or_default();
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        Resolver {
            fixed: Arc::new(map),
        }
    }

    /// The addresses of `name` (already normalised), without duplicates.
    pub async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        if let Some(addrs) = self.fixed.get(name) {
            return Ok(addrs.clone());
        }
        let mut addrs: Vec<IpAddr> = Vec::new();
        for sa in tokio::net::lookup_host((name, 0)).await? {
            if !addrs.contains(&sa.ip()) {
                addrs.push(sa.ip());
            }
        }
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the name has no addresses",
            ));
        }
        Ok(addrs)
    }
}

/// Parses `name=address,name=address,…`.
pub fn parse_fixed(spec: &str) -> Result<Vec<(String, IpAddr)>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, addr) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not name=address"))?;
            let addr: IpAddr = addr
                .trim()
                .parse()
                .map_err(|_| format!("{addr:?} in {pair:?} is not an IP address"))?;
            Ok((name.trim().to_string(), addr))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fixed_names_take_precedence_and_collect_addresses() {
        let fixed = parse_fixed("PyPI.org.=127.0.0.1, pypi.org=::1,other.test=127.0.0.2").unwrap();
        let r = Resolver::with_fixed(fixed);
        assert_eq!(
            r.resolve("pypi.org").await.unwrap(),
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(
            r.resolve("other.test").await.unwrap(),
            vec!["127.0.0.2".parse::<IpAddr>().unwrap()]
        );
        // Names outside the map go to the host's resolver (/etc/hosts here).
        assert!(
            r.resolve("localhost")
                .await
                .unwrap()
                .iter()
                .all(|a| a.is_loopback())
        );
    }

    #[test]
    fn malformed_maps_are_rejected() {
        assert!(
            parse_fixed("pypi.org")
                .unwrap_err()
                .contains("name=address")
        );
        assert!(
            parse_fixed("pypi.org=localhost")
                .unwrap_err()
                .contains("not an IP address")
        );
        assert_eq!(parse_fixed("").unwrap(), vec![]);
    }
}
