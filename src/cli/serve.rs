//! `sandboxd serve`: loads the configuration, builds the backend, adopts
//! existing sandboxes, then serves the API until SIGTERM/SIGINT.
//!
//! Under systemd (see `systemd/` and `docs/operations.md`) it also reports
//! readiness: `READY=1` only once reconciliation is done *and* the
//! listeners are bound, `WATCHDOG=1` while running, `STOPPING=1` when
//! shutdown starts; and it serves on socket-activated fds when given some.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, UnixListener};
use tracing::{info, warn};

use super::ServeArgs;
use crate::api::{self, auth, AppState, Listener};
#[cfg(feature = "kube")]
use crate::backend::kube::KubeBackend;
use crate::backend::memory::MemoryBackend;
use crate::backend::native::NativeBackend;
use crate::backend::Backend;
use crate::backend::BackendKind;
use crate::config::{parse_dotenv, Config, ProcessEnv};
use crate::lifecycle::{Lifecycle, Settings};
use crate::metrics::Metrics;
use crate::systemd::{ActivatedListener, Notifier, NotifyState, SystemdEnv};

/// The daemon's log format (`log_format`, `SANDBOXD_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// journald's native protocol when stderr is the journal stream systemd
    /// connected it to (`JOURNAL_STREAM` names stderr's device and inode),
    /// else JSON when stderr is not a terminal, text on a terminal.
    Auto,
    Text,
    Json,
    /// journald's native protocol (span and event fields become journal
    /// fields: `SANDBOX_ID`, `GENERATION`), JSON on stderr when the journal
    /// socket cannot be reached.
    Journald,
}

impl LogFormat {
    /// What `Auto` means for a process whose stderr is (not) a terminal and
    /// is (not) the journal stream named by `JOURNAL_STREAM`.
    pub fn resolve(self, stderr_is_tty: bool, stderr_is_journal: bool) -> LogFormat {
        match self {
            LogFormat::Auto if stderr_is_journal => LogFormat::Journald,
            LogFormat::Auto if !stderr_is_tty => LogFormat::Json,
            LogFormat::Auto => LogFormat::Text,
            other => other,
        }
    }
}

/// Sets up `tracing` (text or JSON on stderr, or journald's native
/// protocol; `RUST_LOG` filters). `auto`: journald when `JOURNAL_STREAM`
/// names stderr, else JSON when stderr is not a terminal, text on a
/// terminal.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let format = format.resolve(tty, super::logfmt::stderr_is_journal());
    let filter = || {
        let rust_log = std::env::var("RUST_LOG").ok();
        let spec = super::logfmt::filter_directives(rust_log.as_deref());
        tracing_subscriber::EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            let given = rust_log.unwrap_or_default();
            eprintln!("sandboxd: RUST_LOG={given:?} is not a valid filter ({e}); logging at info");
            tracing_subscriber::EnvFilter::new(super::logfmt::filter_directives(None))
        })
    };
    // Span and event fields as journal fields (SANDBOX_ID, GENERATION);
    // without a reachable journal socket, JSON lines on stderr and a warning.
    let mut no_journal = None;
    if format == LogFormat::Journald {
        match super::logfmt::journald_layer() {
            Ok(layer) => {
                let _ = tracing_subscriber::registry()
                    .with(filter())
                    .with(layer)
                    .try_init();
                return;
            }
            Err(e) => no_journal = Some(e),
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(tty);
    let _ = match format {
        // Span fields (sandbox_id, generation) at the top level of each line.
        LogFormat::Json | LogFormat::Auto | LogFormat::Journald => builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(super::logfmt::FlatJson)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    if let Some(e) = no_journal {
        warn!(
            socket = super::logfmt::JOURNAL_SOCKET,
            error = %e,
            "cannot reach journald: logging JSON lines to stderr instead"
        );
    }
}

pub fn load_config(args: &ServeArgs) -> anyhow::Result<Config> {
    let mut cfg = Config::load(args.config.as_deref(), &ProcessEnv)?;
    if let Some(l) = &args.listen {
        cfg.listen = l.clone();
    }
    if let Some(p) = &args.unix_socket {
        cfg.unix_socket = Some(p.clone());
    }
    if let Some(b) = &args.backend {
        cfg.backend = BackendKind::parse(b).map_err(anyhow::Error::msg)?.0;
    }
    if let Some(d) = &args.state_dir {
        cfg.state_dir = d.clone();
    }
    cfg.validate()?;
    Ok(cfg)
}

fn global_env(cfg: &Config) -> anyhow::Result<BTreeMap<String, String>> {
    let Some(path) = &cfg.sandbox_env_file else {
        return Ok(BTreeMap::new());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read sandbox env file {}", path.display()))?;
    let env = parse_dotenv(&text)
        .map_err(|e| anyhow::anyhow!("sandbox env file {}: {e}", path.display()))?;
    // The daemon's own secrets never reach a sandbox.
    for secret in ["SANDBOX_PROVISIONER_TOKEN", "KUBECONFIG", "KUBECONFIG_PATH"] {
        if env.contains_key(secret) {
            bail!(
                "sandbox env file {} sets {secret}: the daemon's secrets must not reach sandboxes",
                path.display()
            );
        }
    }
    info!(path = %path.display(), variables = env.len(), "loaded node-global sandbox env");
    Ok(env)
}

async fn build_backend(cfg: &Config) -> anyhow::Result<Arc<dyn Backend>> {
    if !cfg.proxy.relay {
        warn!(
            "[proxy] relay (SANDBOXD_PROXY_RELAY) is no longer used and is ignored: every proxied \
             request takes the one forwarding path since the relay was removed"
        );
    }
    match cfg.backend {
        BackendKind::Memory => {
            warn!("memory backend selected: for tests only, sandboxes are not isolated");
            Ok(Arc::new(MemoryBackend::new(
                &cfg.memory_url_template,
                Duration::from_millis(cfg.memory_create_delay_ms),
            )?))
        }
        BackendKind::Native => {
            let cfg = cfg.clone();
            let nb = tokio::task::spawn_blocking(move || NativeBackend::new(&cfg))
                .await
                .context("native backend set-up panicked")??;
            nb.start_image_pull();
            nb.refill_pool();
            Ok(Arc::new(nb))
        }
        #[cfg(not(feature = "kube"))]
        BackendKind::Kubernetes => bail!(crate::NO_KUBE),
        #[cfg(feature = "kube")]
        BackendKind::Kubernetes => {
            let backend = KubeBackend::from_config(cfg)
                .await
                .context("cannot start the kubernetes backend")?;
            info!(
                namespace = %cfg.kubernetes.namespace,
                connect_mode = %cfg.kubernetes.connect_mode,
                seccomp = %cfg.kubernetes.seccomp,
                "kubernetes backend ready"
            );
            Ok(Arc::new(backend))
        }
    }
}

async fn bind(cfg: &Config) -> anyhow::Result<Vec<Listener>> {
    let mut out = Vec::new();
    let addr = cfg.listen_addr()?;
    let tcp = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    out.push(Listener::Tcp(tcp));
    if let Some(path) = &cfg.unix_socket {
        if path.exists() {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
        }
        let l = UnixListener::bind(path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        out.push(Listener::Unix(l));
    }
    Ok(out)
}

/// Turns the sockets systemd passed into listeners (instead of binding
/// `listen`/`unix_socket`). A non-loopback TCP socket is the operator's
/// explicit choice in the `.socket` unit: accepted, and its address logged.
fn activated(sd: &mut SystemdEnv) -> anyhow::Result<Vec<Listener>> {
    let fds = std::mem::take(&mut sd.listen_fds);
    info!(
        sockets = fds.len(),
        "socket activation: serving on the sockets passed by systemd (listen and unix_socket are ignored)"
    );
    let mut out = Vec::new();
    for fd in fds {
        let name = fd.name.clone().unwrap_or_default();
        match fd.into_listener()? {
            ActivatedListener::Tcp(l) => {
                let addr = l.local_addr()?;
                if addr.ip().is_loopback() {
                    info!(%addr, name, "socket-activated TCP listener");
                } else {
                    warn!(%addr, name, "socket-activated TCP listener on a non-loopback address (set in the .socket unit): the API is reachable from the network");
                }
                out.push(Listener::Tcp(TcpListener::from_std(l)?));
            }
            ActivatedListener::Unix(l) => {
                info!(name, "socket-activated Unix listener");
                out.push(Listener::Unix(UnixListener::from_std(l)?));
            }
        }
    }
    Ok(out)
}

/// Sends a notification if systemd asked for them; a failure is logged,
/// never fatal.
fn notify(notifier: Option<&Notifier>, state: &[NotifyState<'_>]) {
    if let Some(n) = notifier {
        if let Err(e) = n.notify(state) {
            warn!(socket = n.target(), error = %e, "cannot notify systemd");
        }
    }
}

/// SIGTERM and SIGINT, caught from the moment this is made: a signal that
/// arrives before the shutdown future is first polled (say, right after
/// `READY=1`) is queued, not fatal.
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> anyhow::Result<ShutdownSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(ShutdownSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn received(mut self) {
        tokio::select! {
            _ = self.term.recv() => info!("SIGTERM received"),
            _ = self.int.recv() => info!("SIGINT received"),
        }
    }
}

async fn run_async(mut cfg: Config, mut sd: SystemdEnv) -> anyhow::Result<()> {
    // First: from here on a SIGTERM is a graceful stop (queued until the
    // daemon serves), never the default instant death.
    let signals = ShutdownSignals::install()?;
    let notifier = sd.notifier.clone();
    if let Some(n) = &notifier {
        info!(
            socket = n.target(),
            watchdog_interval_ms = sd.watchdog_interval.map(|d| d.as_millis() as u64),
            "systemd notification socket set"
        );
        // Pinged from the start: reconciliation may take a while and the
        // runtime stays free during it (it runs on a blocking thread).
        if let Some(every) = sd.watchdog_interval {
            let n = n.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    notify(Some(&n), &[NotifyState::Watchdog]);
                }
            });
        }
        notify(
            Some(n),
            &[NotifyState::Status("reconciling existing sandboxes")],
        );
    }
    if sd.listen_pid_mismatch {
        warn!("LISTEN_FDS is addressed to another process (LISTEN_PID is not ours): ignored");
    }
    // The required checks of `sandboxd doctor`, with the same words: a
    // node that cannot run a sandbox is refused before anything is made.
    let blocking = crate::cli::doctor::blocking(&cfg);
    if !blocking.is_empty() {
        anyhow::bail!(
            "this node cannot run sandboxes (`sandboxd doctor` shows every check):\n{}",
            blocking.join("\n")
        );
    }
    std::fs::create_dir_all(&cfg.state_dir)
        .with_context(|| format!("cannot create state dir {}", cfg.state_dir.display()))?;
    // Bundles, state and the token: root's business only.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cfg.state_dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict state dir {}", cfg.state_dir.display()))?;
    }
    if let Some(origin) = &cfg.token_origin {
        auth::check_secret_file(origin)?;
    }
    let token = auth::load_token(
        cfg.token.as_deref(),
        cfg.token_file.as_deref(),
        &cfg.state_dir,
    )?;
    let (idle_timeout, raised) = cfg.effective_idle_timeout();
    if raised {
        warn!(
            configured_s = cfg.idle_timeout_seconds,
            exec_timeout_s = cfg.exec_timeout_seconds,
            effective_s = idle_timeout.unwrap_or(0),
            "idle timeout is not above the exec timeout: raised to exec timeout + 30 s"
        );
    }
    let settings = Settings {
        health_timeout: Duration::from_secs(cfg.health_timeout_seconds),
        idle_timeout: idle_timeout.map(Duration::from_secs),
        idle_check_interval: Duration::from_secs(cfg.idle_check_interval_seconds),
        global_env: global_env(&cfg)?,
        limits: cfg.limits,
        delete_grace: Duration::from_secs(cfg.delete_grace_seconds),
        stop_timeout: Duration::from_secs(cfg.stop_timeout_seconds),
        ladder: cfg.idle.ladder(),
        allowed_images: cfg
            .images
            .allowed
            .iter()
            .map(|r| crate::images::normalize(r).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()
            .context("[images] allowed")?,
    };
    // systemd/sandboxd.service stops the daemon after TimeoutStopSec=90s.
    if cfg.stop_sandboxes_on_exit && cfg.shutdown_grace_seconds + cfg.stop_timeout_seconds >= 90 {
        warn!(
            shutdown_grace_s = cfg.shutdown_grace_seconds,
            stop_timeout_s = cfg.stop_timeout_seconds,
            "shutdown_grace_seconds + stop_timeout_seconds is not below the unit's TimeoutStopSec (90 s): raise it"
        );
    }
    let backend = build_backend(&cfg).await?;
    info!(backend = backend.name(), state_dir = %cfg.state_dir.display(), "starting sandboxd");
    let backend_handle = backend.clone();
    let lifecycle = Arc::new(Lifecycle::new(backend, settings, Arc::new(Metrics::new())));
    let adopted = lifecycle
        .adopt_existing()
        .await
        .context("cannot list existing sandboxes")?;
    info!(adopted, "start-up reconciliation done");
    let listeners = if sd.listen_fds.is_empty() {
        bind(&cfg).await?
    } else {
        let l = activated(&mut sd)?;
        // Sandbox URLs must name an address that is really served.
        if cfg.public_url.is_none() {
            if let Some(Listener::Tcp(t)) = l.iter().find(|l| matches!(l, Listener::Tcp(_))) {
                cfg.public_url = Some(format!("http://{}", t.local_addr()?));
            }
        }
        l
    };
    // Before READY=1: systemd may send SIGTERM right after it, and without
    // a handler the default action would kill the daemon without a
    // graceful stop.
    let _reaper = lifecycle.spawn_reaper();
    let proxy = api::proxy::ProxySettings::from_config(&cfg)?;
    let state = Arc::new(AppState::new(
        lifecycle.clone(),
        token,
        cfg.public_url(),
        proxy,
    ));
    // Ready only now: existing sandboxes are reconciled and adopted, and the
    // listeners are bound (connections queue in their backlog until the
    // accept loops, started right below, take them).
    notify(
        notifier.as_ref(),
        &[
            NotifyState::Ready,
            NotifyState::Status(&format!("serving ({adopted} sandboxes adopted at start)")),
            NotifyState::MainPid(std::process::id()),
        ],
    );
    let shutdown = async {
        signals.received().await;
        notify(
            notifier.as_ref(),
            &[NotifyState::Stopping, NotifyState::Status("stopping")],
        );
    };
    api::serve(
        state,
        listeners,
        shutdown,
        Duration::from_secs(cfg.shutdown_grace_seconds),
    )
    .await
    .context("cannot start the connection workers")?;
    backend_handle.shutdown().await;
    if cfg.stop_sandboxes_on_exit {
        info!(
            sandboxes = lifecycle.tracked_count(),
            "stopping every sandbox (stop_sandboxes_on_exit)"
        );
        let stopped = lifecycle.stop_all().await;
        info!(stopped, "sandboxes stopped");
    } else {
        info!(
            sandboxes = lifecycle.tracked_count(),
            "leaving sandboxes running"
        );
    }
    Ok(())
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // First, while the process is single-threaded: takes the activated fds
    // and removes NOTIFY_SOCKET/WATCHDOG_*/LISTEN_* from our environment so
    // no sandbox or launcher inherits them.
    let sd = SystemdEnv::take();
    // The config decides the log format (SANDBOXD_LOG_FORMAT wins over the
    // file's `log_format`), so it is read before logging starts; its errors
    // reach stderr through `main`.
    let cfg = load_config(&args)?;
    init_logging(cfg.log_format);
    if let Some(v) = &cfg.backend_alias {
        info!(value = %v, "PROVISIONER_BACKEND alias selects the native (node-local) backend");
    }
    let sd = sd.context("systemd environment")?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.worker_threads {
        rt.worker_threads(n);
    }
    rt.enable_all()
        .thread_name("sandboxd")
        .build()
        .context("cannot start the tokio runtime")?
        .block_on(run_async(cfg, sd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_log_format_is_journald_only_on_the_journal_stream() {
        use LogFormat::*;
        // (stderr is a tty, stderr is the journal stream) -> format
        for (tty, journal, want) in [
            (false, true, Journald),
            (true, true, Journald),
            (false, false, Json),
            (true, false, Text),
        ] {
            assert_eq!(
                Auto.resolve(tty, journal),
                want,
                "tty={tty} journal={journal}"
            );
        }
        for f in [Text, Json, Journald] {
            assert_eq!(f.resolve(false, true), f);
            assert_eq!(f.resolve(true, false), f);
        }
    }
}
