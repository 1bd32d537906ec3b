//! The one loop that watches a sandbox through a call, for one-shot runs,
//! background jobs and session calls alike: it sends the call's request (if
//! the protocol has one), reads every channel the daemon reads (stdout,
//! stderr and a session's reply channel) into bounded buffers, enforces the
//! time limit, cancellation and the output and reply caps, kills the whole
//! sandbox when one of them ends the call, and drains what the program wrote
//! before it ended. What differs between callers is a [`Protocol`]: how code
//! goes in and how the end of a call is recognised.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::capture::{Capture, Captured};
use super::outcome::LimitKind;
use super::process::Exit;
use super::sandbox::{Channel, Sandbox};
use super::{Observer, Stream};
use crate::limits::Limits;

/// Bytes a reply line may have before the call is ended: replies are a few
/// dozen bytes of JSON, so anything longer is not a reply.
pub const REPLY_LINE_CAP: usize = 4096;
/// Bytes the reply channel may carry during one call.
pub const REPLY_CALL_CAP: u64 = 1 << 20;
/// How long the output of an ended sandbox may take to drain.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long a sandbox whose reply channel closed may take to exit.
const EXIT_GRACE: Duration = Duration::from_secs(1);
const READ_CHUNK: usize = 64 * 1024;
/// Bounds on how often a call's CPU time is read from its cgroup.
const CPU_CHECK_MIN: Duration = Duration::from_millis(100);
const CPU_CHECK_MAX: Duration = Duration::from_secs(2);

/// How a call talks to its sandbox.
pub trait Protocol {
    type Reply;
    /// Written on the sandbox's request channel as the call starts; `None`
    /// when the program runs its code file once and the call ends with it.
    fn request(&self) -> Option<&[u8]>;
    /// Judges one complete line of the reply channel: a reply ends the call.
    fn reply(&mut self, line: &[u8]) -> Option<Self::Reply>;
}

/// The protocol of a one-shot run: the code is already in its file; the call
/// ends when the sandbox does.
pub struct RunOnce;

impl Protocol for RunOnce {
    type Reply = std::convert::Infallible;
    fn request(&self) -> Option<&[u8]> {
        None
    }
    fn reply(&mut self, _: &[u8]) -> Option<Self::Reply> {
        None
    }
}

/// What ended a call.
#[derive(Debug)]
pub enum End<R> {
    /// The sandbox's program ended (bubblewrap reported its exit code, or
    /// exited).
    Exited(Exit),
    /// The program answered the call; the sandbox lives on.
    Replied(R),
    Timeout,
    Cancelled,
    /// The program wrote more output than the run may; the sandbox was killed.
    Output,
    /// The reply channel carried more than a reply can be; the sandbox was killed.
    ReplyOverflow,
    /// The reply channel closed or failed while the sandbox still ran; killed.
    Broken,
    /// The call used more CPU time than it may (all its processes together,
    /// as the cgroup counts it); the sandbox was killed.
    Cpu,
}

impl<R> End<R> {
    /// True when the sandbox is gone (ended by itself or killed).
    pub fn sandbox_ended(&self) -> bool {
        !matches!(self, End::Replied(_))
    }

    /// The limit the supervisor itself enforced to end the call, if it did.
    pub fn limit(&self) -> Option<LimitKind> {
        match self {
            End::Timeout => Some(LimitKind::Timeout),
            End::Output => Some(LimitKind::Output),
            End::Cpu => Some(LimitKind::Cpu),
            _ => None,
        }
    }
}

/// A supervised call: how it ended and what the program wrote.
#[derive(Debug)]
pub struct Supervised<R> {
    pub end: End<R>,
    pub stdout: Captured,
    pub stderr: Captured,
    /// bubblewrap's exit, when the sandbox ended during the call.
    pub exit: Option<Exit>,
}

/// The bounds of one call.
pub struct Watch<'a> {
    pub limits: &'a Limits,
    pub cancel: &'a CancellationToken,
    pub observer: Option<&'a Arc<dyn Observer>>,
}

/// Both output streams of a call, their captures and the running total.
struct Output<'a> {
    stdout: Capture,
    stderr: Capture,
    total: u64,
    observer: Option<&'a Arc<dyn Observer>>,
}

impl Output<'_> {
    fn record(&mut self, stream: Stream, data: &[u8]) {
        match stream {
            Stream::Stdout => self.stdout.push(data),
            Stream::Stderr => self.stderr.push(data),
        }
        self.total += data.len() as u64;
        if let Some(o) = self.observer {
            o.output(stream, data);
        }
    }
}

/// Watches `sandbox` through one call of `protocol`.
pub async fn supervise<P: Protocol>(
    sandbox: &mut Sandbox,
    protocol: &mut P,
    watch: Watch<'_>,
) -> Supervised<P::Reply> {
    let limits = watch.limits;
    let mut out = Output {
        stdout: Capture::new(limits.output_bytes),
        stderr: Capture::new(limits.output_bytes),
        total: 0,
        observer: watch.observer,
    };
    let end = run_until_end(sandbox, protocol, &watch, &mut out).await;
    let end = match end {
        // A reply channel that closed means the interpreter is ending: say how it ended.
        End::Broken => match tokio::time::timeout(EXIT_GRACE, sandbox.process.exit()).await {
            Ok(exit) => End::Exited(exit),
            Err(_) => End::Broken,
        },
        other => other,
    };
    let exit = match &end {
        End::Exited(e) => {
            // Background processes die with the sandbox, before the result.
            sandbox.emptied().await;
            Some(*e)
        }
        End::Replied(_) => None,
        _ => Some(sandbox.kill().await),
    };
    if end.sandbox_ended() {
        drain(sandbox, &mut out).await;
    } else {
        // Everything the code wrote before it replied is in the pipes now.
        read_ready(&mut sandbox.stdout, Stream::Stdout, &mut out);
        read_ready(&mut sandbox.stderr, Stream::Stderr, &mut out);
    }
    Supervised {
        end,
        stdout: out.stdout.finish(),
        stderr: out.stderr.finish(),
        exit,
    }
}

async fn run_until_end<P: Protocol>(
    sandbox: &mut Sandbox,
    protocol: &mut P,
    watch: &Watch<'_>,
    out: &mut Output<'_>,
) -> End<P::Reply> {
    let cpu_budget = Duration::from_secs(watch.limits.cpu_seconds);
    let counts_cpu = sandbox.counts_cpu();
    let cores = cores();
    let Sandbox {
        process,
        status,
        stdout,
        stderr,
        control,
        lease,
        ..
    } = sandbox;
    let (mut requests, mut replies, mut partial) = match control.as_mut() {
        Some(c) => (
            Some(&mut c.requests),
            Some(&mut c.replies),
            Some(&mut c.partial),
        ),
        None => (None, None, None),
    };
    let request = protocol.request().map(<[u8]>::to_vec).unwrap_or_default();
    let mut sent = 0;
    let mut reply_bytes = 0u64;
    let mut buf_out = vec![0u8; READ_CHUNK];
    let mut buf_err = vec![0u8; READ_CHUNK];
    let mut buf_reply = vec![0u8; REPLY_LINE_CAP];
    let deadline = tokio::time::sleep(watch.limits.timeout);
    tokio::pin!(deadline);
    // The earliest the CPU budget could run out: the rest of it spread over
    // every core the host has.
    let cpu_check_after = |used: Duration| {
        (cpu_budget.saturating_sub(used) / cores).clamp(CPU_CHECK_MIN, CPU_CHECK_MAX)
    };
    let cpu_check = tokio::time::sleep(cpu_check_after(Duration::ZERO));
    tokio::pin!(cpu_check);
    loop {
        tokio::select! {
            exit = process.exit() => return End::Exited(exit),
            // Sooner than bubblewrap's exit, which waits for its namespaces
            // to be torn down; the streams still drain to their end.
            code = status.exit_reported() => return End::Exited(Exit::reported(code)),
            // The code may close its own stdout or stderr; the call goes on.
            n = stdout.pipe.read(&mut buf_out), if stdout.open => match n {
                Ok(n) if n > 0 => out.record(Stream::Stdout, &buf_out[..n]),
                _ => stdout.open = false,
            },
            n = stderr.pipe.read(&mut buf_err), if stderr.open => match n {
                Ok(n) if n > 0 => out.record(Stream::Stderr, &buf_err[..n]),
                _ => stderr.open = false,
            },
            n = async { replies.as_mut().expect("guarded").read(&mut buf_reply).await },
                if replies.is_some() => {
                let partial = partial.as_mut().expect("with the reply channel");
                let n = match n {
                    Ok(n) if n > 0 => n,
                    _ => return End::Broken,
                };
                reply_bytes += n as u64;
                if reply_bytes > REPLY_CALL_CAP {
                    return End::ReplyOverflow;
                }
                let mut data = &buf_reply[..n];
                while let Some(i) = data.iter().position(|b| *b == b'\n') {
                    partial.extend_from_slice(&data[..i]);
                    data = &data[i + 1..];
                    let line = std::mem::take(&mut **partial);
                    if let Some(reply) = protocol.reply(&line) {
                        return End::Replied(reply);
                    }
                }
                partial.extend_from_slice(data);
                if partial.len() > REPLY_LINE_CAP {
                    return End::ReplyOverflow;
                }
            },
            n = async { requests.as_mut().expect("guarded").write(&request[sent..]).await },
                if requests.is_some() && sent < request.len() => match n {
                Ok(n) if n > 0 => sent += n,
                _ => return End::Broken,
            },
            _ = &mut cpu_check, if counts_cpu => {
                let used = lease.call_cpu().unwrap_or_default();
                if used >= cpu_budget {
                    return End::Cpu;
                }
                cpu_check.as_mut().reset(tokio::time::Instant::now() + cpu_check_after(used));
            }
            _ = &mut deadline => return End::Timeout,
            _ = watch.cancel.cancelled() => return End::Cancelled,
        }
        if out.total > watch.limits.output_limit_bytes {
            return End::Output;
        }
    }
}

/// The host's cores, looked up once (the lookup reads cgroup files).
fn cores() -> u32 {
    static CORES: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as u32)
}

/// Reads both streams of an ended sandbox to their end. Nothing inside can
/// hold them open any more, so this is quick; if they stay open past the
/// grace anyway, what was read is kept and the rest is counted as unread.
async fn drain(sandbox: &mut Sandbox, out: &mut Output<'_>) {
    let Sandbox { stdout, stderr, .. } = sandbox;
    let mut buf_out = vec![0u8; READ_CHUNK];
    let mut buf_err = vec![0u8; READ_CHUNK];
    let grace = tokio::time::sleep(DRAIN_GRACE);
    tokio::pin!(grace);
    while stdout.open || stderr.open {
        tokio::select! {
            n = stdout.pipe.read(&mut buf_out), if stdout.open => match n {
                Ok(n) if n > 0 => out.record(Stream::Stdout, &buf_out[..n]),
                _ => stdout.open = false,
            },
            n = stderr.pipe.read(&mut buf_err), if stderr.open => match n {
                Ok(n) if n > 0 => out.record(Stream::Stderr, &buf_err[..n]),
                _ => stderr.open = false,
            },
            _ = &mut grace => break,
        }
    }
    let why = format!(
        "the stream was still open {} s after the sandbox ended; its remaining bytes were not read",
        DRAIN_GRACE.as_secs()
    );
    for (channel, capture) in [(stdout, &mut out.stdout), (stderr, &mut out.stderr)] {
        if channel.open {
            let unread = rustix::io::ioctl_fionread(&channel.pipe).unwrap_or(0);
            capture.mark_incomplete(unread, &why);
            channel.open = false;
        }
    }
}

/// Hands `out` what a stream holds right now, without waiting for more.
/// Reads the descriptor itself (it is non-blocking): tokio's `try_read`
/// answers from the reactor's last readiness event, which may not have
/// arrived yet for bytes written just before the reply, and would lose them.
fn read_ready(channel: &mut Channel, stream: Stream, out: &mut Output<'_>) {
    let mut buf = vec![0u8; READ_CHUNK];
    while channel.open {
        match rustix::io::read(&channel.pipe, &mut buf) {
            Ok(0) => channel.open = false,
            Ok(n) => out.record(stream, &buf[..n]),
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
}
