//! Percent-encoding in the URIs the server reads (RFC 3986): a client's
//! `file://` roots and the query of a patch resource.

/// `text` with its `%XX` escapes decoded; `None` for a malformed escape.
pub fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut input = text.bytes();
    while let Some(b) = input.next() {
        if b != b'%' {
            bytes.push(b);
            continue;
        }
        let hex = [input.next()?, input.next()?];
        bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
    }
    Some(bytes)
}

/// `text` with every byte but unreserved ones escaped, for a query value.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_round_trip_and_bad_ones_are_refused() {
        for s in ["sub/.git", "a b/é", "%", "plain"] {
            assert_eq!(percent_decode(&percent_encode(s)).unwrap(), s.as_bytes());
        }
        assert_eq!(percent_encode("sub/.git"), "sub%2F.git");
        assert_eq!(percent_decode("a%2"), None);
        assert_eq!(percent_decode("a%zz"), None);
    }
}
