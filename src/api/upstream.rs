//! The upstream HTTP/1 connections of the proxy, driven by the client
//! connection's own task.
//!
//! Each client connection keeps the upstream connections it opened (one per
//! sandbox *incarnation*, at most [`PER_CONNECTION`]) in its
//! [`ConnUpstreams`]. A proxied request is written to the upstream
//! connection and its response read back in the task that serves the
//! client connection: [`Driven`] polls the server connection and the
//! upstream connections together, so a request crosses no task, takes no
//! lock shared with other connections and wakes no other worker. (A shared
//! pool drives every upstream connection in a task of its own: the request
//! goes there through a channel and the response comes back through
//! another, two cross-task wake-ups per request, and every checkout takes
//! the pool's lock.)
//!
//! A new incarnation never reuses a connection made for an older one: the
//! key is the sandbox id *and* its generation, and a connection to another
//! generation of the same id is closed when one to the new generation is
//! made. When a client connection closes, its idle upstream connections are
//! parked in the [`UpstreamPool`] shared by all client connections, so a
//! client that opens a connection per request still finds a kept-alive
//! upstream connection (taken from the pool only on a miss, so a client
//! that keeps its connection alive never touches the pool's lock). Parked
//! connections are not polled; they are closed after [`PARKED_IDLE`], and
//! one that the sandbox closed meanwhile is noticed on first use (the
//! request, not yet written, is sent again on a new connection).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::proxy::UpstreamBody;
use crate::lifecycle::Lifecycle;

/// Upstream connections one client connection keeps (different
/// incarnations; the least recently used goes when one more is needed).
pub const PER_CONNECTION: usize = 8;
/// Idle upstream connections parked per incarnation at most.
pub const PARKED_PER_INCARNATION: usize = 32;
/// Idle upstream connections parked in all at most.
pub const PARKED_TOTAL: usize = 1024;
/// How long a parked upstream connection is kept.
pub const PARKED_IDLE: Duration = Duration::from_secs(30);

type Sender = http1::SendRequest<UpstreamBody>;
type Connection = http1::Connection<TokioIo<TcpStream>, UpstreamBody>;

/// One upstream connection to a sandbox incarnation (`C`: a hyper client
/// connection, [`HyperConn`]).
pub struct Upstream<C> {
    pub id: String,
    pub generation: String,
    pub conn: C,
    /// When it was last used (parked: when it was parked).
    pub last_used: Instant,
    /// The thread it was made on: a connection worker, whose runtime's
    /// I/O driver its socket is registered with. Used on another worker,
    /// every readiness event of it would wake that worker's task from this
    /// one's driver (an eventfd write and a cross-thread wake-up per
    /// request), so the pool hands it out only on the thread it was made.
    pub thread: std::thread::ThreadId,
}

impl<C> Upstream<C> {
    pub fn new(id: &str, generation: &str, conn: C) -> Self {
        Upstream {
            id: id.to_string(),
            generation: generation.to_string(),
            conn,
            last_used: Instant::now(),
            thread: std::thread::current().id(),
        }
    }

    pub fn is(&self, id: &str, generation: &str) -> bool {
        self.id == id && self.generation == generation
    }
}

/// An upstream HTTP/1 client connection of hyper: the end requests are
/// sent on and the connection future that does the I/O.
pub struct HyperConn {
    sender: Sender,
    conn: Pin<Box<Connection>>,
}

/// Whether an idle upstream connection can still carry a request: one the
/// sandbox closed (deleted, or its server's keep-alive ran out) cannot, and
/// is not kept or parked.
pub trait Reusable {
    fn reusable(&mut self) -> bool;
}

impl Reusable for HyperConn {
    /// A parked connection is not driven: its connection future is polled
    /// once here (no system call unless its socket became ready), so one
    /// the sandbox closed is noticed now, not when it expires.
    fn reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        if self.conn.as_mut().poll(&mut cx).is_ready() {
            return false;
        }
        self.sender.is_ready()
    }
}

/// Adds `u` to the connections a client connection keeps: another
/// incarnation of the same id is over (its connection goes), and beyond
/// [`PER_CONNECTION`] the least recently used goes.
pub fn keep<C>(ups: &mut Vec<Upstream<C>>, u: Upstream<C>) {
    ups.retain(|o| o.id != u.id);
    if ups.len() >= PER_CONNECTION {
        if let Some(i) = (0..ups.len()).min_by_key(|&i| ups[i].last_used) {
            ups.remove(i);
        }
    }
    ups.push(u);
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why no response came from the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(transparent)]
    Connect(#[from] crate::backend::BackendError),
    #[error("{0}")]
    Http(String),
}

impl UpstreamError {
    fn http(e: &hyper::Error) -> Self {
        UpstreamError::Http(describe(e))
    }
}

/// A hyper error with its causes.
pub fn describe(e: &hyper::Error) -> String {
    let mut msg = e.to_string();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

/// Sends an upgrade request (`Upgrade` and `Connection: upgrade` set) to
/// the incarnation on a connection of its own, which an accepted upgrade
/// takes over (it is never kept or parked); the connection is driven by a
/// task of its own until then.
pub async fn send_upgrade(
    lifecycle: &Lifecycle,
    id: &str,
    generation: &str,
    req: Request<UpstreamBody>,
) -> Result<Response<Incoming>, UpstreamError> {
    let stream = lifecycle.connect(id, generation).await?.stream;
    let (mut sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| UpstreamError::http(&e))?;
    let id = id.to_string();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(sandbox_id = %id, error = %e, "upstream connection failed");
        }
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| UpstreamError::http(&e))
}

/// Idle upstream connections of closed client connections.
pub struct UpstreamPool<C> {
    parked: Mutex<Vec<Upstream<C>>>,
}

impl<C> Default for UpstreamPool<C> {
    fn default() -> Self {
        UpstreamPool {
            parked: Mutex::new(Vec::new()),
        }
    }
}

/// Whether a parked connection is still worth keeping.
fn worth_keeping<C: Reusable>(u: &mut Upstream<C>) -> bool {
    u.last_used.elapsed() < PARKED_IDLE && u.conn.reusable()
}

impl<C: Reusable> UpstreamPool<C> {
    /// A parked connection to this incarnation made on this thread (the
    /// connection worker asking), if one is left: one made on another
    /// worker stays for that worker (see [`Upstream::thread`]). Parked
    /// connections that expired or were closed by their sandbox (deleted
    /// meanwhile) go on the way.
    pub fn take(&self, id: &str, generation: &str) -> Option<Upstream<C>> {
        let here = std::thread::current().id();
        let mut parked = lock(&self.parked);
        parked.retain_mut(worth_keeping);
        let i = parked
            .iter()
            .rposition(|u| u.thread == here && u.is(id, generation))?;
        Some(parked.swap_remove(i))
    }

    /// Parks what of `ups` is worth keeping; returns how many it parked.
    pub fn park(&self, ups: impl Iterator<Item = Upstream<C>>) -> usize {
        let mut parked = lock(&self.parked);
        parked.retain_mut(worth_keeping);
        let mut n = 0;
        for mut u in ups {
            if !u.conn.reusable() {
                continue;
            }
            let same = parked.iter().filter(|p| p.is(&u.id, &u.generation)).count();
            if same >= PARKED_PER_INCARNATION {
                continue;
            }
            if parked.len() >= PARKED_TOTAL {
                // The oldest goes.
                if let Some(i) = (0..parked.len()).min_by_key(|&i| parked[i].last_used) {
                    parked.swap_remove(i);
                }
            }
            u.last_used = Instant::now();
            parked.push(u);
            n += 1;
        }
        n
    }

    /// Number of parked connections (tests).
    pub fn parked(&self) -> usize {
        lock(&self.parked).len()
    }
}

/// The upstream connections of one client connection. Its lock is taken by
/// that connection's task alone (the requests of an HTTP/1 connection are
/// served one after the other), so it is never contended.
pub struct ConnUpstreams {
    ups: Mutex<Vec<Upstream<HyperConn>>>,
    pool: Arc<UpstreamPool<HyperConn>>,
    /// The daemon's runtime, where the control API's handlers run (the
    /// connection itself is served on a connection worker).
    pub main: tokio::runtime::Handle,
    /// What admits the connection's next proxied request to the sandbox of
    /// its last one without a lock shared by all requests
    /// ([`Lifecycle::pin_cached`]).
    pub pins: Mutex<Option<crate::lifecycle::PinCache>>,
    /// What the requests forwarded to the last incarnation carry.
    pub incarnation: Mutex<Option<Arc<super::proxy::Incarnation>>>,
}

/// Whether [`ConnUpstreams::checkout`] found a ready connection.
enum Lookup {
    Ready,
    Missing,
}

impl ConnUpstreams {
    pub fn new(pool: Arc<UpstreamPool<HyperConn>>, main: tokio::runtime::Handle) -> Self {
        ConnUpstreams {
            ups: Mutex::new(Vec::new()),
            pool,
            main,
            pins: Mutex::new(None),
            incarnation: Mutex::new(None),
        }
    }

    /// Does the I/O of every upstream connection; drops the closed ones.
    /// Called by [`Driven`] each time the client connection's task runs.
    pub fn poll_connections(&self, cx: &mut Context<'_>) {
        let mut ups = lock(&self.ups);
        let before = ups.len();
        ups.retain_mut(|u| match u.conn.conn.as_mut().poll(cx) {
            Poll::Ready(r) => {
                if let Err(e) = r {
                    tracing::debug!(sandbox_id = %u.id, error = %e, "upstream connection failed");
                }
                false
            }
            Poll::Pending => true,
        });
        if ups.len() != before {
            // A request may be waiting for the one that went.
            cx.waker().wake_by_ref();
        }
    }

    /// Waits until the connection to this incarnation is ready for a
    /// request; `Missing` when there is none (or it closed).
    async fn ready(&self, id: &str, generation: &str) -> Lookup {
        std::future::poll_fn(|cx| {
            let mut ups = lock(&self.ups);
            let Some(i) = ups.iter().position(|u| u.is(id, generation)) else {
                return Poll::Ready(Lookup::Missing);
            };
            match ups[i].conn.sender.poll_ready(cx) {
                Poll::Ready(Ok(())) => Poll::Ready(Lookup::Ready),
                Poll::Ready(Err(_)) => {
                    ups.remove(i);
                    Poll::Ready(Lookup::Missing)
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    fn insert(&self, u: Upstream<HyperConn>) {
        keep(&mut lock(&self.ups), u);
    }

    fn remove(&self, id: &str, generation: &str) {
        lock(&self.ups).retain(|u| !u.is(id, generation));
    }

    /// Makes sure a ready connection to the incarnation is in the set:
    /// the kept one, else a parked one, else a new one.
    async fn checkout(
        &self,
        lifecycle: &Lifecycle,
        id: &str,
        generation: &str,
    ) -> Result<(), UpstreamError> {
        let mut dialed = false;
        loop {
            if let Lookup::Ready = self.ready(id, generation).await {
                return Ok(());
            }
            if dialed {
                return Err(UpstreamError::Http(
                    "the new connection closed before it was used".into(),
                ));
            }
            let up = match self.pool.take(id, generation) {
                Some(u) => u,
                None => {
                    dialed = true;
                    let stream = lifecycle.connect(id, generation).await?.stream;
                    let (sender, conn) = http1::Builder::new()
                        .handshake(TokioIo::new(stream))
                        .await
                        .map_err(|e| UpstreamError::http(&e))?;
                    Upstream::new(
                        id,
                        generation,
                        HyperConn {
                            sender,
                            conn: Box::pin(conn),
                        },
                    )
                }
            };
            self.insert(up);
        }
    }

    /// Sends `req` (origin-form URI, `Host` set) to the incarnation and
    /// returns the response head. A request the connection could not take
    /// (it closed before the request was written) is sent once more, on
    /// another connection.
    pub async fn send(
        &self,
        lifecycle: &Lifecycle,
        id: &str,
        generation: &str,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut retried = false;
        loop {
            self.checkout(lifecycle, id, generation).await?;
            let sent = {
                let mut ups = lock(&self.ups);
                let u = ups
                    .iter_mut()
                    .find(|u| u.is(id, generation))
                    .expect("checked out just now, in this task");
                u.last_used = Instant::now();
                u.conn.sender.try_send_request(req)
            };
            match sent.await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => {
                    self.remove(id, generation);
                    match e.take_message() {
                        Some(r) if !retried => {
                            retried = true;
                            req = r;
                        }
                        _ => return Err(UpstreamError::http(e.error())),
                    }
                }
            }
        }
    }
}

impl Drop for ConnUpstreams {
    fn drop(&mut self) {
        let ups = std::mem::take(&mut *lock(&self.ups));
        // Only idle connections can serve another request.
        let n = self
            .pool
            .park(ups.into_iter().filter(|u| u.conn.sender.is_ready()));
        if n > 0 {
            tracing::debug!(parked = n, "upstream connections parked");
        }
    }
}

/// A client connection together with its upstream connections: one
/// future, so one task does the I/O of both sides.
///
/// Both sides are polled with a waker of its own ([`TaskWaker`]): a wake-up
/// while they are being polled (the request handed to the upstream
/// connection, the response handed back, a body frame passed on) only
/// makes the poll go round once more, instead of scheduling the task again
/// (which may wake another worker thread to steal it); a wake-up from
/// outside (a socket became ready, a timer fired) wakes the task.
pub struct Driven<F> {
    server: Pin<Box<F>>,
    upstreams: Arc<ConnUpstreams>,
    wake: Arc<TaskWaker>,
    waker: Waker,
}

/// How many rounds one poll of [`Driven`] goes at most before it gives
/// other tasks their turn.
const ROUNDS: usize = 16;

/// The waker both sides of a [`Driven`] connection are polled with.
struct TaskWaker {
    /// Set while [`Driven::poll`] runs.
    polling: AtomicBool,
    /// Set by a wake-up; cleared at the start of each round.
    woken: AtomicBool,
    /// The task's own waker.
    task: AtomicWaker,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F> Driven<F> {
    pub fn new(server: F, upstreams: Arc<ConnUpstreams>) -> Self {
        let wake = Arc::new(TaskWaker {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        Driven {
            server: Box::pin(server),
            upstreams,
            waker: Waker::from(wake.clone()),
            wake,
        }
    }
}

impl<F: Future> Future for Driven<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.wake.task.register(cx.waker());
        this.wake.polling.store(true, Ordering::SeqCst);
        let mut inner = Context::from_waker(&this.waker);
        for _ in 0..ROUNDS {
            this.wake.woken.store(false, Ordering::SeqCst);
            // Upstream first (a response that arrived reaches the request
            // waiting for it), then the client side, then upstream again
            // (the request just handed over is written at once).
            this.upstreams.poll_connections(&mut inner);
            if let Poll::Ready(r) = this.server.as_mut().poll(&mut inner) {
                this.wake.polling.store(false, Ordering::SeqCst);
                return Poll::Ready(r);
            }
            this.upstreams.poll_connections(&mut inner);
            if !this.wake.woken.load(Ordering::SeqCst) {
                break;
            }
        }
        this.wake.polling.store(false, Ordering::SeqCst);
        // Woken since the last round (or out of rounds): go again later.
        if this.wake.woken.load(Ordering::SeqCst) {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A connection that is always still open.
    struct Open;

    impl Reusable for Open {
        fn reusable(&mut self) -> bool {
            true
        }
    }

    #[test]
    fn a_parked_connection_is_handed_out_only_on_the_thread_it_was_made() {
        let pool = Arc::new(UpstreamPool::<Open>::default());
        // Made and parked on another thread (another connection worker).
        let p = pool.clone();
        std::thread::spawn(move || p.park(std::iter::once(Upstream::new("a", "g1", Open))))
            .join()
            .unwrap();
        assert_eq!(pool.parked(), 1);
        assert!(pool.take("a", "g1").is_none(), "taken across threads");
        // Made here: handed out here, and only for its incarnation.
        pool.park(std::iter::once(Upstream::new("a", "g1", Open)));
        assert!(pool.take("a", "g2").is_none());
        let u = pool.take("a", "g1").expect("the one made on this thread");
        assert_eq!(u.thread, std::thread::current().id());
        assert_eq!(pool.parked(), 1, "the other thread's stays parked");
        // A third thread gets nothing either.
        let p = pool.clone();
        let other = std::thread::spawn(move || p.take("a", "g1").is_some())
            .join()
            .unwrap();
        assert!(!other);
    }

    /// Counts the wake-ups of the task (the outer waker).
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A server side that wakes itself while polled `inside` times, then
    /// keeps its waker for a wake-up from outside, then finishes.
    struct Side {
        inside: usize,
        polls: usize,
        kept: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Side {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.inside > 0 {
                self.inside -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut kept = self.kept.lock().unwrap();
            if kept.is_none() && self.polls < 100 {
                *kept = Some(cx.waker().clone());
                return Poll::Pending;
            }
            Poll::Ready(self.polls)
        }
    }

    /// `side` driven with no upstream connections, and a waker that
    /// counts the task's wake-ups (on a runtime: the connection's state
    /// keeps the daemon runtime's handle).
    fn driven(side: Side) -> (Pin<Box<Driven<Side>>>, Arc<Count>, Waker) {
        let ups = Arc::new(ConnUpstreams::new(
            Arc::new(UpstreamPool::default()),
            tokio::runtime::Handle::current(),
        ));
        let count = Arc::new(Count::default());
        let outer = Waker::from(count.clone());
        (Box::pin(Driven::new(side, ups)), count, outer)
    }

    #[tokio::test]
    async fn wake_ups_inside_a_poll_go_round_and_those_from_outside_wake_the_task() {
        let kept = Arc::new(Mutex::new(None));
        let side = Side {
            inside: 3,
            polls: 0,
            kept: kept.clone(),
        };
        let (mut driven, count, outer) = driven(side);
        let mut cx = Context::from_waker(&outer);
        // Three self wake-ups are served within one poll, without
        // scheduling the task again.
        assert!(driven.as_mut().poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        assert!(kept.lock().unwrap().is_some());
        // A wake-up from outside wakes the task once.
        let w = kept.lock().unwrap().clone().unwrap();
        w.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(driven.as_mut().poll(&mut cx), Poll::Ready(5));
    }

    #[tokio::test]
    async fn a_side_that_never_settles_yields_after_the_rounds() {
        let side = Side {
            inside: usize::MAX,
            polls: 0,
            kept: Arc::new(Mutex::new(None)),
        };
        let (mut driven, count, outer) = driven(side);
        let mut cx = Context::from_waker(&outer);
        assert!(driven.as_mut().poll(&mut cx).is_pending());
        // Out of rounds: the task is scheduled again rather than spinning.
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(driven.server.polls, ROUNDS);
    }
}
