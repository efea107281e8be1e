//! Connection workers: where client connections are served.
//!
//! Each worker is a thread running its own current-thread tokio runtime,
//! with its own I/O driver. An accepted connection is handed to the worker
//! serving the fewest connections and stays there with hyper's server for
//! it and its upstream connections (registered with that worker's driver,
//! driven by the connection's own task, [`super::upstream`]). So a proxied
//! request never waits for another thread: the worker that sleeps in
//! `epoll_wait` is the one whose connection became ready, as in a
//! worker-per-core proxy. On the daemon's multi-thread runtime one thread
//! at a time polls the I/O driver and wakes the others through a futex to
//! share the work (`docs/performance.md`).
//!
//! The control API's handlers (which may wait on launches and locks, or
//! do blocking work) run on the daemon's runtime; only proxied requests are
//! served on the worker.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};
use tracing::warn;

/// A stream that can leave one runtime's I/O driver for another's.
pub trait Movable: AsyncRead + AsyncWrite + Send + Unpin + Sized + 'static {
    /// The stream registered with no driver.
    type Std: Send + 'static;
    fn into_std(self) -> io::Result<Self::Std>;
    /// Registers the stream with the current runtime's driver.
    fn from_std(s: Self::Std) -> io::Result<Self>;
}

impl Movable for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    fn into_std(self) -> io::Result<Self::Std> {
        tokio::net::TcpStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> io::Result<Self> {
        tokio::net::TcpStream::from_std(s)
    }
}

impl Movable for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_std(self) -> io::Result<Self::Std> {
        tokio::net::UnixStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> io::Result<Self> {
        tokio::net::UnixStream::from_std(s)
    }
}

/// One worker: its runtime's handle and what belongs to it.
pub struct Worker {
    handle: Handle,
    /// Connections it serves now.
    conns: AtomicUsize,
    /// `true` once the server drains: what its connections watch between
    /// requests. One per worker, so that waiting for it (which locks the
    /// watch's list of waiters) is never shared between threads.
    drain: watch::Sender<bool>,
}

impl Worker {
    fn new(handle: Handle) -> Worker {
        Worker {
            handle,
            conns: AtomicUsize::new(0),
            drain: watch::channel(false).0,
        }
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

/// A connection's place on one worker: counted there while it lives.
pub struct Assigned {
    all: Arc<[Worker]>,
    index: usize,
}

impl Assigned {
    fn new(all: Arc<[Worker]>, index: usize) -> Assigned {
        all[index].conns.fetch_add(1, Ordering::Relaxed);
        Assigned { all, index }
    }

    pub fn worker(&self) -> &Worker {
        &self.all[self.index]
    }

    /// What says the server drains, for this worker's connections.
    pub fn drain_signal(&self) -> watch::Receiver<bool> {
        self.worker().drain.subscribe()
    }
}

impl Drop for Assigned {
    fn drop(&mut self) {
        self.worker().conns.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The workers of one server. Dropping it stops them: each runtime drops
/// the connections it still serves.
pub struct ConnWorkers {
    workers: Arc<[Worker]>,
    /// Dropped to stop the worker threads.
    _stop: Vec<oneshot::Sender<()>>,
}

impl ConnWorkers {
    /// Starts `n` workers (at least one).
    pub fn start(n: usize) -> io::Result<ConnWorkers> {
        let mut workers = Vec::new();
        let mut stops = Vec::new();
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            workers.push(Worker::new(rt.handle().clone()));
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("sandboxd-conn-{i}"))
                .spawn(move || {
                    // Runs the worker's tasks until the server drops its
                    // end; the runtime then goes with what it still holds.
                    rt.block_on(async {
                        tokio::select! {
                            _ = stopped => {}
                            () = keep_a_timer_pending() => {}
                        }
                    });
                })?;
            stops.push(stop);
        }
        Ok(ConnWorkers {
            workers: workers.into(),
            _stop: stops,
        })
    }

    /// The worker serving the fewest connections (the first of those),
    /// counted as serving one more until the returned guard drops.
    pub fn pick(&self) -> Assigned {
        let index = (0..self.workers.len())
            .min_by_key(|&i| self.workers[i].conns.load(Ordering::Relaxed))
            .expect("at least one worker");
        Assigned::new(self.workers.clone(), index)
    }

    /// Asks every worker's connections to finish their request and close.
    pub fn drain(&self) {
        for w in self.workers.iter() {
            w.drain.send_replace(true);
        }
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

/// Keeps a timer of the worker's runtime pending, one second ahead.
///
/// Every request registers timers (hyper's header read timeout, the
/// proxy's head timeout). tokio's timer wakes its own I/O driver (an
/// eventfd write, then an `epoll_wait` that returns at once) whenever a
/// timer is registered that is due before every pending one, as it is when
/// none is pending: about one extra pair of system calls per request on a
/// busy worker. With this tick always due first, no per-request timer
/// (all are a second or longer) ever is; the cost is one wake-up a second.
async fn keep_a_timer_pending() {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
    }
}

/// Moves `stream` to the runtime of `handle` and runs `serve` there with
/// it. A stream that cannot be moved (its driver refused it) is closed,
/// with a warning: the connection is lost, never served half.
pub fn move_to<S, F, Fut>(handle: &Handle, stream: S, serve: F)
where
    S: Movable,
    F: FnOnce(S) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let std = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot move a connection between runtimes; closing it");
            return;
        }
    };
    handle.spawn(async move {
        match S::from_std(std) {
            Ok(s) => serve(s).await,
            Err(e) => warn!(error = %e, "cannot move a connection between runtimes; closing it"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_go_to_the_least_busy_worker() {
        let w = ConnWorkers::start(2).unwrap();
        let a = w.pick();
        let b = w.pick();
        assert!(!std::ptr::eq(a.worker(), b.worker()), "one each");
        let a_worker: *const Worker = a.worker();
        drop(a);
        let c = w.pick();
        assert!(
            std::ptr::eq(c.worker(), a_worker),
            "the worker that lost its connection gets the next one"
        );
        let d = w.pick();
        let mut counts: Vec<usize> = w
            .workers
            .iter()
            .map(|w| w.conns.load(Ordering::Relaxed))
            .collect();
        counts.sort();
        assert_eq!(counts, vec![1, 2], "b, c and d are counted");
        drop((b, c, d));
        assert!(w
            .workers
            .iter()
            .all(|w| w.conns.load(Ordering::Relaxed) == 0));
    }

    #[tokio::test]
    async fn a_moved_stream_is_served_on_the_worker_thread() {
        let w = ConnWorkers::start(1).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut got = String::new();
            c.read_to_string(&mut got).await.unwrap();
            got
        });
        let (s, _) = l.accept().await.unwrap();
        let a = w.pick();
        let (tx, rx) = oneshot::channel();
        move_to(a.worker().handle(), s, move |mut s| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            let name = std::thread::current().name().map(str::to_owned);
            s.write_all(&b).await.unwrap();
            let _ = tx.send(name);
        });
        let name = rx.await.unwrap();
        assert_eq!(name.as_deref(), Some("sandboxd-conn-0"));
        assert_eq!(client.await.unwrap(), "ping");
    }

    #[tokio::test]
    async fn drain_reaches_every_worker_and_later_connections() {
        let w = ConnWorkers::start(2).unwrap();
        let (a, b) = (w.pick(), w.pick());
        let (mut sa, mut sb) = (a.drain_signal(), b.drain_signal());
        assert!(!*sa.borrow_and_update());
        w.drain();
        let ms = std::time::Duration::from_millis(1000);
        tokio::time::timeout(ms, sa.changed())
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(ms, sb.changed())
            .await
            .unwrap()
            .unwrap();
        assert!(*sa.borrow() && *sb.borrow());
        // A connection that comes after the drain sees it at once.
        assert!(*w.pick().drain_signal().borrow());
    }
}
