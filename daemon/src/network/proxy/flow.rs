//! The bytes a proxy moves: tunnels and forwarded bodies, counted against
//! the run's transfer budget and ended when nothing moves for the idle
//! timeout.

use std::borrow::Cow;

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) enum Direction {
    /// From the sandbox to the host.
    Sent,
    /// From the host to the sandbox.
    Received,
}

/// The bytes of one tunnel or forwarded request, added to the record when
/// the last part of it ends.
pub(super) struct Flow {
    record: RunRecord,
    host: String,
    port: u16,
    sent: AtomicU64,
    received: AtomicU64,
}

impl Flow {
    pub(super) fn new(run: &Run, target: &Target) -> Arc<Flow> {
        Arc::new(Flow {
            record: run.record.clone(),
            host: target.host.to_string(),
            port: target.port,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
        })
    }

    fn add(&self, direction: Direction, n: u64) {
        match direction {
            Direction::Sent => self.sent.fetch_add(n, Ordering::Relaxed),
            Direction::Received => self.received.fetch_add(n, Ordering::Relaxed),
        };
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.record.traffic(
            &self.host,
            self.port,
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        );
    }
}

/// A forwarded body: counted against the transfer budget, and failed when
/// nothing arrives for the idle timeout.
pub(super) struct Metered<B> {
    inner: B,
    flow: Arc<Flow>,
    direction: Direction,
    run: Arc<Run>,
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl<B> Metered<B> {
    pub(super) fn new(
        inner: B,
        flow: Arc<Flow>,
        direction: Direction,
        run: Arc<Run>,
    ) -> Metered<B> {
        let idle = Box::pin(tokio::time::sleep(run.policy.bounds.idle_timeout));
        Metered {
            inner,
            flow,
            direction,
            run,
            idle,
        }
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if !this.run.record.spend(n, this.run.max_transfer()) {
                        return Poll::Ready(Some(Err(
                            "the run's network transfer budget is used up".into(),
                        )));
                    }
                    this.flow.add(this.direction, n);
                }
                let next = Instant::now() + this.run.policy.bounds.idle_timeout;
                this.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err("no data within the idle timeout".into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a tunnel does to the bytes it passes one way.
pub(super) trait Filter {
    /// What to pass on for `data` (what it holds back goes with a later
    /// call), or why the tunnel must close.
    fn pass<'a>(&mut self, data: &'a [u8]) -> io::Result<Cow<'a, [u8]>>;
    /// What it still holds, once the side it reads has ended.
    fn end(&mut self) -> Vec<u8>;
}

/// Bytes as they come.
struct Untouched;

impl Filter for Untouched {
    fn pass<'a>(&mut self, data: &'a [u8]) -> io::Result<Cow<'a, [u8]>> {
        Ok(Cow::Borrowed(data))
    }

    fn end(&mut self) -> Vec<u8> {
        Vec::new()
    }
}

/// Copies bytes both ways between the sandbox and the host (see
/// [`both_ways`]), as they come.
pub(super) async fn tunnel<C>(client: C, upstream: TcpStream, flow: Arc<Flow>, run: &Run)
where
    C: AsyncRead + AsyncWrite,
{
    both_ways(
        tokio::io::split(client),
        upstream.into_split(),
        Untouched,
        flow,
        run,
    )
    .await;
}

/// Copies bytes both ways between the sandbox and the host, the host's
/// through `received`, until both sides have finished, either side fails,
/// the budget runs out, or nothing moves for the idle timeout.
pub(super) async fn both_ways<CR, CW, UR, UW>(
    (mut client_read, mut client_write): (CR, CW),
    (mut upstream_read, mut upstream_write): (UR, UW),
    mut received: impl Filter,
    flow: Arc<Flow>,
    run: &Run,
) where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    UR: AsyncRead + Unpin,
    UW: AsyncWrite + Unpin,
{
    let clock = Activity::new();
    let mut sent = Untouched;
    let up = pump(
        &mut client_read,
        &mut upstream_write,
        &mut sent,
        &flow,
        Direction::Sent,
        run,
        &clock,
    );
    let down = pump(
        &mut upstream_read,
        &mut client_write,
        &mut received,
        &flow,
        Direction::Received,
        run,
        &clock,
    );
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => {
            if let Err(e) = r {
                tracing::debug!("proxy tunnel: {e}");
            }
        }
        () = clock.idle(run.policy.bounds.idle_timeout) => {
            tracing::debug!("proxy tunnel idle, closed");
        }
    }
}

async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    filter: &mut impl Filter,
    flow: &Flow,
    direction: Direction,
    run: &Run,
    clock: &Activity,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; TUNNEL_BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            to.write_all(&filter.end()).await?;
            // Pass the end on; the other direction may still have data.
            let _ = to.shutdown().await;
            return Ok(());
        }
        if !run.record.spend(n as u64, run.max_transfer()) {
            return Err(io::Error::other(
                "the run's network transfer budget is used up",
            ));
        }
        flow.add(direction, n as u64);
        clock.touch();
        to.write_all(&filter.pass(&buf[..n])?).await?;
    }
}

/// When a tunnel last moved a byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing has moved for `limit`.
    async fn idle(&self, limit: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = self.start.elapsed().saturating_sub(last);
            if quiet >= limit {
                return;
            }
            tokio::time::sleep(limit - quiet).await;
        }
    }
}
