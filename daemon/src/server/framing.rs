//! The stdio framing in front of rmcp. rmcp silently drops a line it cannot
//! parse and a line over its length limit, and answers a request of the
//! wrong shape with an error that carries no id; a client then waits for
//! its own timeout. Here every line from the client is read first, within
//! [`MAX_MESSAGE_BYTES`]: well-formed messages pass to rmcp unchanged, and a
//! request that is not gets its JSON-RPC error at once, with its id when the
//! id can be read. This is the only writer of stdout: rmcp's lines and ours
//! go out whole, never interleaved.

use serde::de::IgnoredAny;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The longest message a client may send: one line of JSON, newline included.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// How much of an oversized line is kept to find its id.
const HEAD_BYTES: usize = 4096;
const PIPE_BYTES: usize = 256 << 10;

/// JSON-RPC's codes for a line that is not JSON and for a message that is
/// not a valid request.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

/// The transport rmcp serves, and the task that writes stdout (await it
/// before exiting so the last replies are not lost).
pub struct Framed {
    pub transport:
        rmcp::transport::async_rw::AsyncRwTransport<rmcp::RoleServer, DuplexStream, DuplexStream>,
    pub writer: JoinHandle<()>,
}

/// Standard input and output, framed.
pub fn stdio() -> Framed {
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    frame(stdin, stdout)
}

fn frame<R, W>(input: R, output: W) -> Framed
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (rmcp_reads, feed) = tokio::io::duplex(PIPE_BYTES);
    let (rmcp_writes, drain) = tokio::io::duplex(PIPE_BYTES);
    let (errors, errors_out) = mpsc::channel(64);
    tokio::spawn(pump_in(input, feed, errors));
    let writer = tokio::spawn(pump_out(drain, errors_out, output));
    // rmcp never sees a line longer than ours, so its own limit never drops one.
    let transport =
        rmcp::transport::async_rw::AsyncRwTransport::new_server(rmcp_reads, rmcp_writes)
            .with_max_line_length(MAX_MESSAGE_BYTES + 1);
    Framed { transport, writer }
}

/// What the client sent in one line.
enum Line {
    /// A complete line (newline excluded).
    Whole(Vec<u8>),
    /// A line over the limit: its first [`HEAD_BYTES`].
    Oversized(Vec<u8>),
}

/// Reads lines from the client; forwards good ones to rmcp, answers bad ones.
async fn pump_in<R: AsyncRead + Unpin>(
    input: R,
    mut feed: DuplexStream,
    errors: mpsc::Sender<Vec<u8>>,
) {
    let mut input = BufReader::with_capacity(64 << 10, input);
    let mut buf = Vec::new();
    loop {
        let line = match read_line(&mut input, &mut buf).await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                tracing::error!("reading standard input: {e}");
                break;
            }
        };
        let verdict = match &line {
            Line::Whole(bytes) => judge(bytes),
            Line::Oversized(head) => Verdict::Refuse {
                envelope: Envelope::scan(head),
                code: INVALID_REQUEST,
                message: format!(
                    "the message is longer than {} MiB, the most this server reads in one message; send less (for example write large data to a file in the project and refer to it)",
                    MAX_MESSAGE_BYTES >> 20
                ),
            },
        };
        match verdict {
            Verdict::Skip => {}
            Verdict::Forward => {
                let Line::Whole(bytes) = line else {
                    unreachable!("only whole lines are forwarded")
                };
                if feed.write_all(&bytes).await.is_err() || feed.write_all(b"\n").await.is_err() {
                    break;
                }
            }
            Verdict::Refuse {
                envelope,
                code,
                message,
            } => {
                let reply = json!({
                    "jsonrpc": "2.0",
                    "id": envelope.id.clone().unwrap_or(Value::Null),
                    "error": {"code": code, "message": message},
                });
                if envelope.is_request() || envelope.is_unknown() {
                    tracing::warn!("refused a message from the client: {message}");
                    if errors.send(line_of(&reply)).await.is_err() {
                        break;
                    }
                } else if envelope.is_response() {
                    // An answer to one of our own requests (an elicitation, a
                    // roots listing) that cannot be read: rmcp gets it as an
                    // error, so the request waiting for it ends now.
                    tracing::warn!("a response from the client could not be read: {message}");
                    if feed.write_all(&line_of(&reply)).await.is_err() {
                        break;
                    }
                } else {
                    tracing::warn!("dropped a notification from the client: {message}");
                }
            }
        }
    }
    let _ = feed.shutdown().await;
}

/// One line of JSON, newline included.
fn line_of(v: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(v).expect("a Value serialises");
    bytes.push(b'\n');
    bytes
}

/// Reads one line within [`MAX_MESSAGE_BYTES`]; of a longer line, keeps the
/// first [`HEAD_BYTES`] and skips the rest. `None` at the end of input.
async fn read_line<R: AsyncRead + Unpin>(
    input: &mut BufReader<R>,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Line>> {
    buf.clear();
    let mut length = 0usize;
    let mut oversized = false;
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            // A last line without a newline is incomplete: nothing to answer.
            return Ok(None);
        }
        let newline = available.iter().position(|b| *b == b'\n');
        let take = newline.map_or(available.len(), |i| i + 1);
        length = length.saturating_add(take);
        if length > MAX_MESSAGE_BYTES {
            oversized = true;
        }
        let room = if oversized {
            HEAD_BYTES.saturating_sub(buf.len())
        } else {
            take
        };
        buf.extend_from_slice(&available[..take.min(room)]);
        input.consume(take);
        if newline.is_some() {
            break;
        }
    }
    if oversized {
        buf.truncate(HEAD_BYTES);
        return Ok(Some(Line::Oversized(std::mem::take(buf))));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(Line::Whole(std::mem::take(buf))))
}

enum Verdict {
    /// Nothing to do (a blank line).
    Skip,
    /// A well-formed message: rmcp handles it.
    Forward,
    Refuse {
        envelope: Envelope,
        code: i64,
        message: String,
    },
}

/// Whether a line is a JSON-RPC 2.0 message rmcp can take.
fn judge(line: &[u8]) -> Verdict {
    let text = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if text.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Skip;
    }
    let refuse = |code, message: String| Verdict::Refuse {
        envelope: Envelope::scan(text),
        code,
        message,
    };
    let value: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(e) => {
            return refuse(
                PARSE_ERROR,
                format!(
                    "the message is not valid JSON ({e}); strings must be valid UTF-8 without lone surrogates"
                ),
            );
        }
    };
    let Some(object) = value.as_object() else {
        return refuse(
            INVALID_REQUEST,
            "a message must be one JSON object (batches are not supported)".into(),
        );
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return refuse(
            INVALID_REQUEST,
            r#"the message needs "jsonrpc": "2.0""#.into(),
        );
    }
    if let Some(id) = object.get("id")
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return refuse(
            INVALID_REQUEST,
            "a message's id must be a string or an integer".into(),
        );
    }
    match object.get("method") {
        Some(Value::String(_)) => {}
        Some(_) => return refuse(INVALID_REQUEST, "a method must be a string".into()),
        None if object.contains_key("result") || object.contains_key("error") => {
            return Verdict::Forward;
        }
        None => {
            return refuse(
                INVALID_REQUEST,
                "the message has no method (a request or notification) and no result or error (a response)".into(),
            );
        }
    }
    if let Some(params) = object.get("params")
        && !params.is_object()
    {
        return refuse(INVALID_REQUEST, "params must be an object".into());
    }
    Verdict::Forward
}

/// The top-level members of a message that say what it is, read from its
/// start even when the rest cannot be parsed or was cut off.
#[derive(Debug, Default, PartialEq)]
struct Envelope {
    /// A string or integer id.
    id: Option<Value>,
    has_method: bool,
    has_outcome: bool,
}

impl Envelope {
    /// Reads members in order until one cannot be read. Values other than
    /// the id are skipped without being checked (their strings may hold
    /// invalid escapes or bytes).
    fn scan(text: &[u8]) -> Envelope {
        let mut found = Envelope::default();
        let mut at = skip_space(text, 0);
        if text.get(at) != Some(&b'{') {
            return found;
        }
        at += 1;
        loop {
            at = skip_space(text, at);
            let Some((key, next)) = parse_one::<String>(text, at) else {
                return found;
            };
            at = skip_space(text, next);
            if text.get(at) != Some(&b':') {
                return found;
            }
            at = skip_space(text, at + 1);
            at = match key.as_str() {
                "id" => match parse_one::<Value>(text, at) {
                    Some((id, next)) => {
                        if id.is_string() || id.is_i64() || id.is_u64() {
                            found.id = Some(id);
                        }
                        next
                    }
                    None => return found,
                },
                other => {
                    match other {
                        "method" => found.has_method = true,
                        "result" | "error" => found.has_outcome = true,
                        _ => {}
                    }
                    match parse_one::<IgnoredAny>(text, at) {
                        Some((_, next)) => next,
                        None => return found,
                    }
                }
            };
            at = skip_space(text, at);
            if text.get(at) != Some(&b',') {
                return found;
            }
            at += 1;
        }
    }

    fn is_request(&self) -> bool {
        self.has_method && self.id.is_some()
    }

    fn is_response(&self) -> bool {
        !self.has_method && self.has_outcome && self.id.is_some()
    }

    /// Nothing says what the line is: it is answered, with the id if known.
    fn is_unknown(&self) -> bool {
        !self.has_method && !self.has_outcome
    }
}

fn skip_space(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// One JSON value at `at`, and where it ends.
fn parse_one<T: serde::de::DeserializeOwned>(text: &[u8], at: usize) -> Option<(T, usize)> {
    let rest = text.get(at..)?;
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, at + values.byte_offset()))
}

/// Writes rmcp's lines and the framing's own replies to stdout, whole.
async fn pump_out<W: AsyncWrite + Unpin>(
    drain: DuplexStream,
    mut errors: mpsc::Receiver<Vec<u8>>,
    mut output: W,
) {
    let mut drain = BufReader::new(drain);
    let mut line = Vec::new();
    let mut errors_open = true;
    loop {
        tokio::select! {
            // `read_until` keeps what it read in `line` when the other branch
            // wins, so a reply is never written into the middle of a line.
            n = drain.read_until(b'\n', &mut line) => match n {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if write_line(&mut output, &line).await.is_err() {
                        return;
                    }
                    line.clear();
                }
            },
            reply = errors.recv(), if errors_open => match reply {
                Some(reply) => {
                    if write_line(&mut output, &reply).await.is_err() {
                        return;
                    }
                }
                None => errors_open = false,
            },
        }
    }
    while let Ok(reply) = errors.try_recv() {
        if write_line(&mut output, &reply).await.is_err() {
            return;
        }
    }
}

async fn write_line<W: AsyncWrite + Unpin>(output: &mut W, line: &[u8]) -> std::io::Result<()> {
    output.write_all(line).await?;
    output.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &[u8]) -> (Option<Value>, i64) {
        match judge(line) {
            Verdict::Refuse { envelope, code, .. } => (envelope.id, code),
            Verdict::Forward => panic!("forwarded: {}", String::from_utf8_lossy(line)),
            Verdict::Skip => panic!("skipped"),
        }
    }

    #[test]
    fn well_formed_messages_pass_and_blank_lines_are_skipped() {
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#[..],
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            br#"{"jsonrpc":"2.0","id":"a","result":{}}"#,
            b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{}}",
        ] {
            assert!(matches!(judge(line), Verdict::Forward));
        }
        assert!(matches!(judge(b"  \t"), Verdict::Skip));
    }

    #[test]
    fn broken_requests_are_refused_with_their_id() {
        let cases: [(&[u8], Option<Value>, i64); 8] = [
            (b"{this is not json", None, PARSE_ERROR),
            (
                br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"code":"\ud800"}}"#,
                Some(json!(7)),
                PARSE_ERROR,
            ),
            (
                b"{\"jsonrpc\":\"2.0\",\"params\":{\"code\":\"\xff\"},\"id\":\"x\",\"method\":\"m\"}",
                Some(json!("x")),
                PARSE_ERROR,
            ),
            (
                br#"{"jsonrpc":"2.0","id":3,"method":"m","params":{}} trailing"#,
                Some(json!(3)),
                PARSE_ERROR,
            ),
            (
                br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                None,
                INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#,
                Some(json!(4)),
                INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":"x"}"#,
                Some(json!(5)),
                INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                None,
                INVALID_REQUEST,
            ),
        ];
        for (line, id, code) in cases {
            assert_eq!(
                refused(line),
                (id, code),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn the_envelope_is_read_from_a_cut_off_head() {
        let head = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"arguments":{"code":"xxxxxxxx"#;
        let e = Envelope::scan(head);
        assert_eq!(e.id, Some(json!(42)));
        assert!(e.is_request());
        let nested = br#"{"params":{"id":9},"method":"m","id":10}"#;
        assert_eq!(Envelope::scan(nested).id, Some(json!(10)));
        let response = br#"{"jsonrpc":"2.0","id":3,"result":{"content":"\ud800"}}"#;
        assert!(Envelope::scan(response).is_response());
    }

    async fn exchange(input: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
        let (mut client, server_in) = tokio::io::duplex(1 << 20);
        let (server_out, mut client_out) = tokio::io::duplex(1 << 20);
        let (rmcp_reads, feed) = tokio::io::duplex(1 << 20);
        let (rmcp_writes, drain) = tokio::io::duplex(1 << 20);
        let (errors, errors_out) = mpsc::channel(64);
        let reader = tokio::spawn(pump_in(server_in, feed, errors));
        let writer = tokio::spawn(pump_out(drain, errors_out, server_out));
        client.write_all(&input).await.unwrap();
        drop(client);
        reader.await.unwrap();
        let mut forwarded = Vec::new();
        let mut rmcp_reads = rmcp_reads;
        tokio::io::AsyncReadExt::read_to_end(&mut rmcp_reads, &mut forwarded)
            .await
            .unwrap();
        drop(rmcp_writes);
        writer.await.unwrap();
        let mut replies = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut client_out, &mut replies)
            .await
            .unwrap();
        (forwarded, replies)
    }

    #[tokio::test]
    async fn an_oversized_line_is_answered_and_the_next_one_passes() {
        let mut input =
            br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"code":""#.to_vec();
        input.resize(MAX_MESSAGE_BYTES + 10, b'x');
        input.extend_from_slice(b"\"}}\n");
        let next = br#"{"jsonrpc":"2.0","id":10,"method":"ping"}"#;
        input.extend_from_slice(next);
        input.push(b'\n');
        let (forwarded, replies) = exchange(input).await;
        assert_eq!(forwarded, [&next[..], b"\n"].concat());
        let reply: Value = serde_json::from_slice(&replies).unwrap();
        assert_eq!(reply["id"], 9);
        assert_eq!(reply["error"]["code"], INVALID_REQUEST);
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains("16 MiB")
        );
    }

    #[tokio::test]
    async fn a_broken_response_reaches_rmcp_as_an_error_and_notifications_are_dropped() {
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"x\":\"\\ud800\"}}\n{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":{\"x\":\"\\ud800\"}}\n".to_vec();
        let (forwarded, replies) = exchange(input).await;
        assert!(replies.is_empty(), "{}", String::from_utf8_lossy(&replies));
        let error: Value = serde_json::from_slice(&forwarded).unwrap();
        assert_eq!(
            (error["id"].clone(), error["error"]["code"].clone()),
            (json!(3), json!(PARSE_ERROR))
        );
    }
}
