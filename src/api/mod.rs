//! The HTTP layer: listeners, connections, routing, auth and the streaming
//! proxy. It knows HTTP and the [`Lifecycle`] API, never which backend runs
//! the sandboxes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::lifecycle::Lifecycle;

pub mod auth;
pub mod conns;
pub mod error;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod list_tests;
pub mod openapi;
pub mod proxy;
pub mod routes;
pub mod upstream;
pub mod workers;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every response (JSON or a streamed upstream body).
pub type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// Everything a request handler needs.
pub struct AppState {
    pub lifecycle: Arc<Lifecycle>,
    pub token: auth::Token,
    /// `PROVISIONER_PUBLIC_URL` without trailing slash.
    pub public_url: String,
    /// Idle upstream connections of closed client connections: the
    /// proxy's one pool.
    pub upstream_pool: Arc<upstream::UpstreamPool<upstream::HyperConn>>,
    /// Connections that have not authenticated yet (capped, see [`conns`]).
    pub unauth: conns::UnauthConns,
    pub proxy: proxy::ProxySettings,
}

impl AppState {
    /// The state of a daemon over `backend` with test settings and `token`
    /// (the API's unit tests).
    #[cfg(test)]
    pub(crate) fn for_tests(backend: Arc<dyn crate::backend::Backend>, token: &str) -> Arc<Self> {
        let settings = crate::lifecycle::Settings {
            health_timeout: Duration::from_secs(5),
            idle_timeout: None,
            idle_check_interval: Duration::from_secs(10),
            global_env: Default::default(),
            limits: Default::default(),
            delete_grace: Duration::from_secs(1),
            stop_timeout: Duration::from_secs(1),
            allowed_images: Vec::new(),
            ladder: crate::lifecycle::Ladder::OFF,
        };
        let lc = Arc::new(Lifecycle::new(
            backend,
            settings,
            Arc::new(crate::metrics::Metrics::new()),
        ));
        Arc::new(AppState::new(
            lc,
            auth::Token::new(token.into()).unwrap(),
            "http://127.0.0.1:8002".into(),
            proxy::ProxySettings::default(),
        ))
    }

    pub fn new(
        lifecycle: Arc<Lifecycle>,
        token: auth::Token,
        public_url: String,
        proxy: proxy::ProxySettings,
    ) -> Self {
        AppState {
            lifecycle,
            token,
            public_url,
            upstream_pool: Arc::new(upstream::UpstreamPool::default()),
            unauth: conns::UnauthConns::new(conns::DEFAULT_CAP),
            proxy,
        }
    }
}

/// A bound listening socket.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| format!("http://{a}"))
                .unwrap_or_else(|_| "tcp".into()),
            Listener::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_else(|| "unix".into()),
        }
    }
}

/// Serves `listeners` until `shutdown` resolves, then stops accepting and
/// gives in-flight requests up to `grace` to finish. Fails only when the
/// connection workers cannot be started.
pub async fn serve(
    state: Arc<AppState>,
    listeners: Vec<Listener>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()> {
    // `true` asks every connection to finish its request and close; each
    // holds a receiver until it is gone.
    let (drain_tx, drain_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = Arc::new(workers::ConnWorkers::start(state.proxy.workers)?);
    debug!(workers = workers.len(), "connection workers started");
    let server = Arc::new(Server {
        state,
        drain: drain_rx,
        workers: workers.clone(),
        main: tokio::runtime::Handle::current(),
    });
    let mut accept_tasks = Vec::new();
    for l in listeners {
        info!(address = %l.describe(), "listening");
        let server = server.clone();
        let mut stop = stop_rx.clone();
        accept_tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    r = accept(&l) => match r {
                        Ok(Conn::Tcp(s)) => {
                            let _ = s.set_nodelay(true);
                            server.spawn_conn(s);
                        }
                        Ok(Conn::Unix(s)) => server.spawn_conn(s),
                        Err(e) => {
                            warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                }
            }
        }));
    }
    shutdown.await;
    info!("shutting down: no longer accepting connections");
    let _ = stop_tx.send(true);
    for t in accept_tasks {
        let _ = t.await;
    }
    // Only the connections hold drain receivers now (the accept loops are
    // gone, and with them their clones of the server).
    drop(server);
    workers.drain();
    let _ = drain_tx.send(true);
    tokio::select! {
        _ = drain_tx.closed() => info!("in-flight requests finished"),
        _ = tokio::time::sleep(grace) => warn!(grace_s = grace.as_secs(), "in-flight requests cut at the shutdown deadline"),
    }
    // Stops the workers: what they still serve is cut.
    drop(workers);
    Ok(())
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(l: &Listener) -> std::io::Result<Conn> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
    }
}

/// What the connections of one server share.
struct Server {
    state: Arc<AppState>,
    drain: watch::Receiver<bool>,
    /// Where connections are served.
    workers: Arc<workers::ConnWorkers>,
    /// The daemon's runtime: the control API's handlers.
    main: tokio::runtime::Handle,
}

/// One accepted connection.
struct ConnTask {
    state: Arc<AppState>,
    conn_id: u64,
    eviction: conns::Eviction,
    /// The server's drain signal: held while the connection lives, so the
    /// server sees when every connection is gone.
    _drain: watch::Receiver<bool>,
}

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.state.unauth.forget(self.conn_id);
    }
}

impl Server {
    /// Moves the connection to the least busy connection worker and
    /// serves it there.
    fn spawn_conn<S: workers::Movable>(&self, stream: S) {
        let task = ConnTask::new(&self.state, &self.drain);
        let worker = self.workers.pick();
        let main = self.main.clone();
        let handle = worker.worker().handle().clone();
        workers::move_to(&handle, stream, move |s| async move {
            let shutdown = worker.drain_signal();
            task.serve(s, main, shutdown).await;
            drop(worker);
        });
    }
}

/// Serves a connection on the current runtime, which also serves the
/// control API (tests: any stream, e.g. an in-memory duplex).
#[cfg(test)]
fn spawn_conn<S>(state: &Arc<AppState>, drain: &watch::Receiver<bool>, stream: S)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let task = ConnTask::new(state, drain);
    let shutdown = drain.clone();
    tokio::spawn(task.serve(stream, tokio::runtime::Handle::current(), shutdown));
}

impl ConnTask {
    /// Registers an accepted connection (unauthenticated until its first
    /// authenticated request).
    fn new(state: &Arc<AppState>, drain: &watch::Receiver<bool>) -> ConnTask {
        let (conn_id, eviction, evicted) = state.unauth.register();
        if evicted > 0 {
            debug!(
                evicted,
                cap = state.unauth.cap(),
                "closed the oldest unauthenticated connection(s) to make room"
            );
        }
        ConnTask {
            state: state.clone(),
            conn_id,
            eviction,
            _drain: drain.clone(),
        }
    }

    /// Serves the connection with hyper on the current runtime (a
    /// connection worker's) until it closes, is evicted, or `shutdown`
    /// becomes `true` (then the request in progress finishes first).
    /// Control requests run on `main`.
    async fn serve<S>(mut self, stream: S, main: Handle, mut shutdown: watch::Receiver<bool>)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (id, state) = (self.conn_id, &self.state);
        tokio::select! {
            () = serve_hyper(state, stream, main, id, &mut shutdown) => {}
            () = self.eviction.wait() => {}
        }
    }
}

/// How long a connection may take to send a request head, and sit idle
/// between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves one connection with hyper.
async fn serve_hyper<S>(
    state: &Arc<AppState>,
    stream: S,
    main: Handle,
    conn_id: u64,
    drain: &mut watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let svc_state = state.clone();
    // This connection's upstream connections, driven by its own task, and
    // what it keeps of the sandbox it talks to.
    let upstreams = Arc::new(upstream::ConnUpstreams::new(
        state.upstream_pool.clone(),
        main,
    ));
    let svc_upstreams = upstreams.clone();
    // Set once the connection made an authenticated request: it left the
    // unauthenticated set, and later requests need not look again.
    let authenticated = AtomicBool::new(false);
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true)
        .serve_connection(
            TokioIo::new(stream),
            service_fn(move |req| {
                if !authenticated.load(Ordering::Relaxed)
                    && svc_state.token.check(
                        req.headers()
                            .get(http::header::AUTHORIZATION)
                            .map(|v| v.as_bytes()),
                    )
                {
                    authenticated.store(true, Ordering::Relaxed);
                    svc_state.unauth.forget(conn_id);
                }
                routes::handle(svc_state.clone(), svc_upstreams.clone(), req)
            }),
        )
        .with_upgrades();
    // Graceful shutdown: the request in progress finishes, then the
    // connection closes.
    let conn = async move {
        let mut conn = std::pin::pin!(conn);
        if !*drain.borrow_and_update() {
            tokio::select! {
                biased;
                r = conn.as_mut() => return r,
                _ = drain.changed() => {}
            }
        }
        conn.as_mut().graceful_shutdown();
        conn.await
    };
    if let Err(e) = upstream::Driven::new(conn, upstreams).await {
        debug!(error = %e, "connection ended with an error");
    }
}
