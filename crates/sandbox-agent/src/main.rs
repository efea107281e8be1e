//! `sandbox-agent [--listen ADDR]`: parses arguments and runs
//! [`sandbox_agent::serve`]. See `docs/agent.md`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use sandbox_agent::{self as agent, exec, exec::ExecConfig, exec::READY_FD_ENV, AgentConfig};
use tracing_subscriber::filter::{LevelFilter, Targets};

/// The longest exec cap accepted (a day): anything longer is a mistake.
const MAX_EXEC_CAP_SECONDS: f64 = 86_400.0;

const USAGE: &str = "\
The in-sandbox agent: HTTP API on loopback, PID 1 of the sandbox.

Usage: sandbox-agent [OPTIONS]

Options:
  --listen ADDR                    Address to listen on
                                   [env: SANDBOX_AGENT_LISTEN] [default: 127.0.0.1:8080]
  --exec-cap-seconds S             Longest a command may run, in (0, 86400] seconds; the
                                   daemon passes its exec timeout minus a margin
                                   [env: SANDBOX_AGENT_EXEC_CAP_SECONDS] [default: 170]
  --output-limit-bytes N           Output kept per command when `truncate` is true
                                   [env: SANDBOX_AGENT_OUTPUT_LIMIT_BYTES] [default: 1048576]
  --output-hard-limit-bytes N      Output kept per command when `truncate` is false
                                   [env: SANDBOX_AGENT_OUTPUT_HARD_LIMIT_BYTES] [default: 268435456]
  --term-grace-seconds S           Seconds children get between SIGTERM and SIGKILL at shutdown
                                   [env: SANDBOX_AGENT_TERM_GRACE_SECONDS] [default: 3]
  --command-env FILE               The environment of every command: NUL-terminated KEY=VALUE
                                   entries (without it, commands inherit the agent's)
  --require-credential             Refuse to start unless SANDBOX_AGENT_CREDENTIAL is set
  --pooled                         A warm-pool member: answer only the daemon's one
                                   POST /internal/claim until claimed
  -h, --help                       Print this help
  -V, --version                    Print the version

Logging: SANDBOX_AGENT_LOG, a level (error, warn, info, debug, trace, off) or
per-target levels (`info,sandbox_agent::exec=debug`); default info.
";

/// Why the agent did not start: printed as `sandbox-agent: <reason>`.
type StartError = String;

/// `Err(format!(...))`, for start-up checks.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(format!($($arg)*))
    };
}

/// Adds what was being done to an error, as `what: error`.
trait Context<T> {
    fn context(self, what: &str) -> Result<T, StartError>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: &str) -> Result<T, StartError> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// The command line (flags win over their environment variables).
#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    exec_cap_seconds: f64,
    output_limit_bytes: usize,
    output_hard_limit_bytes: usize,
    term_grace_seconds: f64,
    command_env: Option<PathBuf>,
    require_credential: bool,
    pooled: bool,
}

/// Parses `raw` (a flag's value or its environment variable) for `name`.
fn parse_value<T>(name: &str, raw: OsString) -> Result<T, StartError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text = raw
        .into_string()
        .map_err(|raw| format!("invalid value {raw:?} for {name}: not UTF-8"))?;
    text.parse()
        .map_err(|e| format!("invalid value {text:?} for {name}: {e}"))
}

/// The value of `--name`, else of the variable `env`, else `default`.
fn value_or_env<T>(
    flag: Option<OsString>,
    name: &str,
    env: &str,
    default: T,
) -> Result<T, StartError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match flag.or_else(|| std::env::var_os(env)) {
        Some(raw) => parse_value(name, raw),
        None => Ok(default),
    }
}

impl Args {
    /// Parses the process's arguments; prints help or the version and exits
    /// when asked.
    fn parse() -> Result<Self, StartError> {
        Self::parse_from(lexopt::Parser::from_env())
    }

    fn parse_from(mut parser: lexopt::Parser) -> Result<Self, StartError> {
        use lexopt::Arg::{Long, Short};
        let mut listen = None;
        let mut exec_cap = None;
        let mut output_limit = None;
        let mut output_hard_limit = None;
        let mut term_grace = None;
        let mut command_env = None;
        let mut require_credential = false;
        let mut pooled = false;
        while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
            match arg {
                Long("listen") => listen = Some(parser.value().map_err(|e| e.to_string())?),
                Long("exec-cap-seconds") => {
                    exec_cap = Some(parser.value().map_err(|e| e.to_string())?)
                }
                Long("output-limit-bytes") => {
                    output_limit = Some(parser.value().map_err(|e| e.to_string())?)
                }
                Long("output-hard-limit-bytes") => {
                    output_hard_limit = Some(parser.value().map_err(|e| e.to_string())?)
                }
                Long("term-grace-seconds") => {
                    term_grace = Some(parser.value().map_err(|e| e.to_string())?)
                }
                Long("command-env") => {
                    command_env = Some(PathBuf::from(parser.value().map_err(|e| e.to_string())?))
                }
                Long("require-credential") => require_credential = true,
                Long("pooled") => pooled = true,
                Short('h') | Long("help") => {
                    print!("{USAGE}");
                    std::process::exit(0);
                }
                Short('V') | Long("version") => {
                    println!("sandbox-agent {}", env!("CARGO_PKG_VERSION"));
                    std::process::exit(0);
                }
                other => bail!("{} (see --help)", other.unexpected()),
            }
        }
        Ok(Self {
            listen: value_or_env(
                listen,
                "--listen",
                "SANDBOX_AGENT_LISTEN",
                SocketAddr::from(([127, 0, 0, 1], 8080)),
            )?,
            exec_cap_seconds: value_or_env(
                exec_cap,
                "--exec-cap-seconds",
                "SANDBOX_AGENT_EXEC_CAP_SECONDS",
                170.0,
            )?,
            output_limit_bytes: value_or_env(
                output_limit,
                "--output-limit-bytes",
                "SANDBOX_AGENT_OUTPUT_LIMIT_BYTES",
                1024 * 1024,
            )?,
            output_hard_limit_bytes: value_or_env(
                output_hard_limit,
                "--output-hard-limit-bytes",
                "SANDBOX_AGENT_OUTPUT_HARD_LIMIT_BYTES",
                256 * 1024 * 1024,
            )?,
            term_grace_seconds: value_or_env(
                term_grace,
                "--term-grace-seconds",
                "SANDBOX_AGENT_TERM_GRACE_SECONDS",
                3.0,
            )?,
            command_env,
            require_credential,
            pooled,
        })
    }
}

/// The log filter from `SANDBOX_AGENT_LOG`: a level, or `target=level`
/// directives (no regex, no span filters); unset or invalid → info (an
/// invalid value is reported once the subscriber is up).
fn log_filter() -> (Targets, Option<String>) {
    let default = Targets::new().with_default(LevelFilter::INFO);
    match std::env::var("SANDBOX_AGENT_LOG") {
        Ok(raw) if !raw.trim().is_empty() => match raw.trim().parse::<Targets>() {
            Ok(targets) => (targets, None),
            Err(e) => (
                default,
                Some(format!(
                    "invalid SANDBOX_AGENT_LOG {raw:?} ({e}); using info"
                )),
            ),
        },
        _ => (default, None),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Also when logging is not up yet (arguments, credential).
            eprintln!("sandbox-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), StartError> {
    // First of all: not dumpable, so no process of the sandbox (same uid)
    // can ptrace PID 1, read or write its memory through /proc/1/mem, or
    // read /proc/1/environ: those files become root's. Commands are
    // dumpable again after their exec.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .context("PR_SET_DUMPABLE")?;
    // Still single-threaded: take the readiness fd and remove the variable so
    // no command ever sees it.
    let ready_fd = match std::env::var(READY_FD_ENV) {
        Ok(raw) => {
            std::env::remove_var(READY_FD_ENV);
            let fd = raw
                .trim()
                .parse::<i32>()
                .context(&format!("{READY_FD_ENV} is not a number"))?;
            Some(agent::adopt_ready_fd(fd).map_err(|e| e.to_string())?)
        }
        Err(_) => None,
    };
    // Also while single-threaded: the credential leaves the environment
    // (wiped in place, then removed) before anything can copy it.
    let credential = agent::credential::Credential::take_from_env().map_err(|e| e.to_string())?;
    agent::seal_inherited_fds();
    agent::reset_ignored_signals();
    let args = Args::parse()?;
    if args.require_credential && credential.is_none() {
        bail!("{}", agent::credential::CredentialError::Missing);
    }
    if !(args.exec_cap_seconds > 0.0 && args.exec_cap_seconds <= MAX_EXEC_CAP_SECONDS) {
        bail!(
            "exec cap must be in (0, {MAX_EXEC_CAP_SECONDS}] seconds, got {}",
            args.exec_cap_seconds
        );
    }
    let (filter, bad_filter) = log_filter();
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_target(false)
                    // Never a terminal in a sandbox (the daemon reads a FIFO).
                    .with_ansi(false)
                    // A failed write (EPIPE while no daemon reads the output
                    // FIFO, e.g. a daemon restart) is dropped: by default
                    // tracing-subscriber reports it with `eprintln!`, which
                    // panics on that same broken stderr and took the agent
                    // down with it.
                    .log_internal_errors(false),
            )
            .with(filter)
            .init();
    }
    if let Some(msg) = bad_filter {
        tracing::warn!("{msg}");
    }

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
    // One thread: PID 1 serves one sandbox's requests, which wait on I/O,
    // timers and children; file work that may block runs on tokio's
    // blocking pool (`routes::blocking`), never on this thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime
        .block_on(agent::serve(config))
        .map_err(|e| e.to_string())?;
    Ok(())
}
