//! A WebSocket through the proxy other than in a tunnel: as plain HTTP
//! (`ws://`), or on an intercepted host (see `intercept.rs`). The
//! sandbox's handshake is a request like any other there: decided by the
//! host's rules and, on an intercepted host, sent with its credentials and
//! without an offer of compression (a compressed echo of a credential could
//! not be starred). Once the host switches protocols, the two connections
//! are joined as a tunnel is (the connection slot, the transfer budget, the
//! idle timeout), and the host's frames pass through [`FrameRedactor`],
//! which stars the credentials' values in their payloads as in response
//! bodies, also where a value is cut across frames.

use std::borrow::Cow;

use hyper::upgrade::OnUpgrade;

use super::flow::{Filter, Flow, both_ways};
use super::intercept::{holds_secret, partial_secret_at_end, redact, redact_headers};
use super::*;

/// Whether a request opens a WebSocket. Other upgrades (`h2c`) are
/// dropped with the other one-hop headers: a host may always answer a
/// request that offers one over the protocol it came in, and clients
/// expect that; a WebSocket has no such answer.
pub(super) fn opens_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|protocol| {
            let name = protocol.split(|b| *b == b'/').next().unwrap_or_default();
            name.trim_ascii().eq_ignore_ascii_case(b"websocket")
        })
}

/// Whether a WebSocket may be compressed: not where the proxy stars
/// credentials in the host's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compression {
    Allowed,
    Refused,
}

impl Compression {
    /// Refused when there are `secrets` to star.
    pub(super) fn starring(secrets: &[Vec<u8>]) -> Compression {
        match secrets.is_empty() {
            true => Compression::Allowed,
            false => Compression::Refused,
        }
    }
}

/// The handshake's head as the host gets it (or the host's 101 as the
/// sandbox does): the upgrade asked again (the one-hop headers are gone),
/// compression taken out where refused.
pub(super) fn ask_host(headers: &mut HeaderMap, compression: Compression) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if compression == Compression::Refused {
        headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    }
}

/// Answers the sandbox with the host's 101 and joins the two connections
/// once both have switched, starring `secrets` in the host's messages;
/// `hold` (the client connection's slot) is kept until the WebSocket
/// closes.
pub(super) fn switch(
    mut response: Response<Incoming>,
    sandbox: OnUpgrade,
    secrets: Vec<Vec<u8>>,
    flow: Arc<Flow>,
    run: Arc<Run>,
    hold: impl Send + 'static,
) -> Response<ProxyBody> {
    let host = hyper::upgrade::on(&mut response);
    let (mut parts, _) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // Compression the sandbox did not offer fails its handshake rather
    // than hide a credential from the redactor.
    ask_host(&mut parts.headers, Compression::starring(&secrets));
    redact_headers(&mut parts.headers, &secrets);
    let relay = run.clone();
    run.spawn(async move {
        let _hold = hold;
        let (sandbox, host) = match tokio::join!(sandbox, host) {
            (Ok(sandbox), Ok(host)) => (sandbox, host),
            (Err(e), _) | (_, Err(e)) => return tracing::debug!("proxy WebSocket: {e}"),
        };
        let (sandbox, host) = (TokioIo::new(sandbox), TokioIo::new(host));
        both_ways(
            tokio::io::split(sandbox),
            tokio::io::split(host),
            FrameRedactor::new(secrets),
            flow,
            &relay,
        )
        .await;
    });
    Response::from_parts(parts, Empty::new().map_err(|never| match never {}).boxed())
}

/// What of the host's bytes may be held back at most, frame headers
/// included, before they go as they are: more than a value's start and
/// the headers of a few empty frames (a host that sends the value in
/// pieces that small wants the sandbox to have it, and could as well
/// send it encoded).
const MOST_HELD: usize = 64 * 1024;

/// Stars each secret in the payloads of the frames a host sends (RFC 6455,
/// 5.2: a host's frames are not masked), taking the payloads as one stream
/// across frames: a value cut across frames, or across reads, is starred
/// too. What could be the start of one is held back, with any frame
/// header after it, until the next bytes show it is not.
pub(super) struct FrameRedactor {
    secrets: Vec<Vec<u8>>,
    /// The header of the frame being read, as far as it has come.
    header: Vec<u8>,
    /// Payload bytes the frame being read still has.
    payload_left: u64,
    /// Bytes read and not yet passed on, each marked as payload or not.
    held: Vec<u8>,
    is_payload: Vec<bool>,
}

impl FrameRedactor {
    pub(super) fn new(secrets: Vec<Vec<u8>>) -> FrameRedactor {
        FrameRedactor {
            secrets: secrets.into_iter().filter(|s| !s.is_empty()).collect(),
            header: Vec::with_capacity(14),
            payload_left: 0,
            held: Vec::new(),
            is_payload: Vec::new(),
        }
    }

    /// Takes `data` into what is held, marking the payload bytes.
    fn read(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let n = data
                    .len()
                    .min(usize::try_from(self.payload_left).unwrap_or(usize::MAX));
                self.hold(&data[..n], true);
                self.payload_left -= n as u64;
                data = &data[n..];
                continue;
            }
            self.header.push(data[0]);
            self.hold(&data[..1], false);
            data = &data[1..];
            if let Some(length) = self.frame_length()? {
                self.payload_left = length;
                self.header.clear();
            }
        }
        Ok(())
    }

    fn hold(&mut self, bytes: &[u8], payload: bool) {
        self.held.extend_from_slice(bytes);
        self.is_payload.resize(self.held.len(), payload);
    }

    /// The payload length once the header is whole.
    fn frame_length(&self) -> io::Result<Option<u64>> {
        let h = &self.header;
        if h.len() < 2 {
            return Ok(None);
        }
        if h[1] & 0x80 != 0 {
            // A client must close on a masked frame from the host; the
            // redactor could not read it.
            return Err(io::Error::other("the host sent a masked WebSocket frame"));
        }
        let extended = match h[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        if h.len() < 2 + extended {
            return Ok(None);
        }
        Ok(Some(match extended {
            0 => u64::from(h[1] & 0x7f),
            _ => h[2..].iter().fold(0, |n, b| n << 8 | u64::from(*b)),
        }))
    }
}

impl Filter for FrameRedactor {
    fn pass<'a>(&mut self, data: &'a [u8]) -> io::Result<Cow<'a, [u8]>> {
        if self.secrets.is_empty() {
            return Ok(Cow::Borrowed(data));
        }
        self.read(data)?;
        let at: Vec<usize> = (0..self.held.len())
            .filter(|&i| self.is_payload[i])
            .collect();
        let mut payload: Vec<u8> = at.iter().map(|&i| self.held[i]).collect();
        if holds_secret(&payload, &self.secrets) {
            redact(&mut payload, &self.secrets);
            for (&i, &b) in at.iter().zip(&payload) {
                self.held[i] = b;
            }
        }
        let keep = partial_secret_at_end(&payload, &self.secrets);
        let mut upto = match keep {
            0 => self.held.len(),
            keep => at[payload.len() - keep],
        };
        if self.held.len() - upto > MOST_HELD {
            upto = self.held.len();
        }
        self.is_payload.drain(..upto);
        Ok(Cow::Owned(self.held.drain(..upto).collect()))
    }

    fn end(&mut self) -> Vec<u8> {
        // What is held is no whole secret: it goes as it is.
        self.is_payload.clear();
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame from a host: FIN and opcode, then the payload.
    fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![first];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n < 65536 => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    /// The stream through a redactor, fed in pieces of `piece` bytes.
    fn through(stream: &[u8], piece: usize) -> Vec<u8> {
        let mut r = FrameRedactor::new(vec![b"Bearer s3cr3t-token".to_vec()]);
        let mut out = Vec::new();
        for chunk in stream.chunks(piece) {
            out.extend_from_slice(&r.pass(chunk).unwrap());
        }
        out.extend(r.end());
        out
    }

    #[test]
    fn a_value_is_starred_in_a_frame_across_frames_and_across_reads() {
        let text = 0x81;
        let (start, more, last) = (0x01, 0x00, 0x80);
        let long = [b"x".repeat(300), b"Bearer s3cr3t-token".to_vec()].concat();
        let stream = [
            frame(text, b"{\"authorization\":\"Bearer s3cr3t-token\"}"),
            // Cut across a fragmented message, a ping in between.
            frame(start, b"Bearer s3c"),
            frame(0x89, b""),
            frame(more, b"r3t-to"),
            frame(last, b"ken!"),
            frame(text, &long),
            frame(0x88, b""),
        ]
        .concat();
        let starred = |s: &[u8]| {
            let mut s = s.to_vec();
            redact(&mut s, &[b"Bearer s3cr3t-token".to_vec()]);
            s
        };
        let expected = [
            frame(
                text,
                &starred(b"{\"authorization\":\"Bearer s3cr3t-token\"}"),
            ),
            frame(start, b"**********"),
            frame(0x89, b""),
            frame(more, b"******"),
            frame(last, b"***!"),
            frame(text, &starred(&long)),
            frame(0x88, b""),
        ]
        .concat();
        for piece in [1, 2, 3, 7, 64, stream.len()] {
            assert_eq!(through(&stream, piece), expected, "pieces of {piece}");
        }
    }

    #[test]
    fn frames_without_a_value_pass_as_they_are_and_nothing_waits_for_long() {
        let stream = [frame(0x82, &vec![7; 70_000]), frame(0x81, b"Bear")].concat();
        assert_eq!(through(&stream, 4096), stream);
        // A possible start is held back only until the next bytes.
        let mut r = FrameRedactor::new(vec![b"Bearer s3cr3t-token".to_vec()]);
        let first = frame(0x81, b"Bear");
        assert_eq!(&r.pass(&first).unwrap()[..], &first[..2]);
        let next = frame(0x81, b"d");
        assert_eq!(
            [&r.pass(&next).unwrap()[..], &r.end()[..]].concat(),
            [&b"Bear"[..], &next].concat()
        );
    }

    #[test]
    fn a_masked_frame_from_the_host_ends_the_websocket() {
        let mut r = FrameRedactor::new(vec![b"s3cr3t".to_vec()]);
        assert!(r.pass(&[0x81, 0x86, 1, 2, 3, 4]).is_err());
    }

    #[test]
    fn only_a_websocket_counts_as_one() {
        let asks = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::UPGRADE, HeaderValue::from_str(v).unwrap());
            }
            opens_websocket(&h)
        };
        for yes in [
            &["websocket"][..],
            &["WebSocket"],
            &["h2c, websocket/13"],
            &["h2c", " websocket "],
        ] {
            assert!(asks(yes), "{yes:?}");
        }
        for no in [&[][..], &["h2c"], &["websockets"], &["TLS/1.2, h2c"]] {
            assert!(!asks(no), "{no:?}");
        }
    }
}
