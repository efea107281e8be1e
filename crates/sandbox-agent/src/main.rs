//! `sandbox-agent [--listen ADDR]`: parses arguments and runs
//! [`sandbox_agent::serve`]. See `spec/agent-api.md`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use sandbox_agent::{self as agent, exec, exec::ExecConfig, exec::READY_FD_ENV, AgentConfig};

/// The longest exec cap accepted (a day): anything longer is a mistake.
const MAX_EXEC_CAP_SECONDS: f64 = 86_400.0;

/// The in-sandbox agent: HTTP API on loopback, PID 1 of the sandbox.
#[derive(Debug, Parser)]
#[command(name = "sandbox-agent", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SANDBOX_AGENT_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Longest a command may run, in (0, 86400] seconds. The daemon passes
    /// its exec timeout minus a margin (default 180 - 10).
    #[arg(long, env = "SANDBOX_AGENT_EXEC_CAP_SECONDS", default_value_t = 170.0)]
    exec_cap_seconds: f64,
    /// Output kept per command when `truncate` is true.
    #[arg(long, env = "SANDBOX_AGENT_OUTPUT_LIMIT_BYTES", default_value_t = 1024 * 1024)]
    output_limit_bytes: usize,
    /// Output kept per command when `truncate` is false (guards PID 1's memory).
    #[arg(long, env = "SANDBOX_AGENT_OUTPUT_HARD_LIMIT_BYTES", default_value_t = 256 * 1024 * 1024)]
    output_hard_limit_bytes: usize,
    /// Seconds children get between SIGTERM and SIGKILL at shutdown.
    #[arg(long, env = "SANDBOX_AGENT_TERM_GRACE_SECONDS", default_value_t = 3.0)]
    term_grace_seconds: f64,
    /// The environment of every command: a file of NUL-terminated
    /// `KEY=VALUE` entries (the native backend binds it in). Without it,
    /// commands inherit the agent's environment.
    #[arg(long)]
    command_env: Option<std::path::PathBuf>,
    /// Refuse to start unless `SANDBOX_AGENT_CREDENTIAL` is set (the
    /// Kubernetes backend passes it). With the variable set, every request
    /// must carry the credential whether or not this flag is given.
    #[arg(long)]
    require_credential: bool,
    /// A warm-pool member: answer only the daemon's one
    /// `POST /internal/claim` (which sets the command environment and the
    /// working directory) until claimed.
    #[arg(long)]
    pooled: bool,
}

fn main() -> anyhow::Result<()> {
    // First of all: not dumpable, so no process of the sandbox (same uid)
    // can ptrace PID 1, read or write its memory through /proc/1/mem, or
    // read /proc/1/environ: those files become root's. Commands are
    // dumpable again after their exec.
    nix::sys::prctl::set_dumpable(false).context("PR_SET_DUMPABLE")?;
    // Still single-threaded: take the readiness fd and remove the variable so
    // no command ever sees it.
    let ready_fd = match std::env::var(READY_FD_ENV) {
        Ok(raw) => {
            std::env::remove_var(READY_FD_ENV);
            let fd = raw
                .trim()
                .parse()
                .with_context(|| format!("{READY_FD_ENV} is not a number"))?;
            Some(agent::adopt_ready_fd(fd)?)
        }
        Err(_) => None,
    };
    // Also while single-threaded: the credential leaves the environment
    // (wiped in place, then removed) before anything can copy it.
    let credential = agent::credential::Credential::take_from_env()?;
    agent::seal_inherited_fds();
    agent::reset_ignored_signals();
    let args = Args::parse();
    if args.require_credential && credential.is_none() {
        bail!(agent::credential::CredentialError::Missing);
    }
    if !(args.exec_cap_seconds > 0.0 && args.exec_cap_seconds <= MAX_EXEC_CAP_SECONDS) {
        bail!(
            "exec cap must be in (0, {MAX_EXEC_CAP_SECONDS}] seconds, got {}",
            args.exec_cap_seconds
        );
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SANDBOX_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A failed write (EPIPE while no daemon reads the output FIFO, e.g.
        // a daemon restart) is dropped: by default tracing-subscriber
        // reports it with `eprintln!`, which panics on that same broken
        // stderr and took the agent down with it.
        .log_internal_errors(false)
        .init();

    let term_grace = Duration::try_from_secs_f64(args.term_grace_seconds)
        .context("the SIGTERM grace must be a non-negative number of seconds")?;
    let config = AgentConfig {
        listen: args.listen,
        ready_fd,
        exec: ExecConfig {
            shell: agent::find_shell(),
            cap: Duration::from_secs_f64(args.exec_cap_seconds),
            output_limit: args.output_limit_bytes,
            output_hard_limit: args.output_hard_limit_bytes.max(args.output_limit_bytes),
            command_env: args
                .command_env
                .as_deref()
                .map(exec::read_command_env)
                .transpose()
                .context("reading the command environment")?,
        },
        base: agent::path_base(),
        term_grace,
        credential,
        pooled: args.pooled,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(agent::serve(config))?;
    Ok(())
}
