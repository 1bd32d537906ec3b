//! The handles this server mints for what lives on it (a session, a task):
//! a prefix, the replica's name when it is one of several (so that a load
//! balancer routes a handle back to the replica holding it), and 128 random
//! bits from the operating system: `s_` + 32 hex digits, or
//! `s_a_` + 32 hex digits on replica `a`.

/// The random part's length, in hex digits.
const RANDOM_HEX: usize = 32;

/// A replica's name: 1 to 16 lower-case letters and digits.
pub fn check_replica(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 16
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    match ok {
        true => Ok(()),
        false => Err(format!(
            "a replica's name is 1 to 16 lower-case letters and digits, not {name:?}"
        )),
    }
}

/// A new handle: `prefix`, the replica's name and `_` when there is one,
/// and 128 random bits in hex; `None` when the system gives no randomness.
pub fn mint(prefix: &str, replica: Option<&str>) -> Option<String> {
    let mut bytes = [0u8; RANDOM_HEX / 2];
    getrandom::fill(&mut bytes).ok()?;
    let random: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Some(match replica {
        Some(r) => format!("{prefix}{r}_{random}"),
        None => format!("{prefix}{random}"),
    })
}

/// Whether `given` has the form of a handle with `prefix`; if so, the
/// replica it names (`None`: one minted by a server that is no replica).
pub fn replica_of<'a>(prefix: &str, given: &'a str) -> Option<Option<&'a str>> {
    let rest = given.strip_prefix(prefix)?;
    let (replica, random) = match rest.rsplit_once('_') {
        Some((r, random)) => (Some(Some(r).filter(|r| check_replica(r).is_ok())?), random),
        None => (None, rest),
    };
    let hex = random.len() == RANDOM_HEX
        && random
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then_some(replica)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_their_replica_and_nothing_else_passes_for_one() {
        let plain = mint("s_", None).unwrap();
        let on_a = mint("s_", Some("a1")).unwrap();
        assert_eq!((plain.len(), on_a.len()), (34, 37));
        assert_eq!(replica_of("s_", &plain), Some(None));
        assert_eq!(replica_of("s_", &on_a), Some(Some("a1")));
        assert_ne!(mint("s_", None), mint("s_", None));
        let zeros = "0".repeat(32);
        for not_a_handle in [
            "work".to_string(),
            format!("t_{zeros}"),
            format!("s_{}", "A".repeat(32)),
            format!("s_{}", "0".repeat(31)),
            format!("s_Bad_{zeros}"),
            format!("s__{zeros}"),
            format!("s_{}_{zeros}", "a".repeat(17)),
        ] {
            assert_eq!(replica_of("s_", &not_a_handle), None, "{not_a_handle}");
        }
        assert!(check_replica("a").is_ok() && check_replica("replica7").is_ok());
        assert!(
            check_replica("").is_err()
                && check_replica("A").is_err()
                && check_replica("a-b").is_err()
        );
    }
}
