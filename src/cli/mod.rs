//! The `sandboxd` command line: `serve` (the daemon) plus operator and
//! auditor subcommands. `main` only parses and dispatches here.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub mod bundle;
pub mod doctor;
pub mod image;
pub mod kube;
pub mod ops;
pub mod seccomp;
pub mod serve;

/// `--version`: the package version, plus ` (failpoints)` in test builds.
const VERSION: &str = const_format_version();

const fn const_format_version() -> &'static str {
    if sandbox_abi::failpoint::ENABLED {
        concat!(env!("CARGO_PKG_VERSION"), " (failpoints)")
    } else {
        env!("CARGO_PKG_VERSION")
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "sandboxd",
    version = VERSION,
    about = "Node-local sandbox runtime for AI-agent platforms"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (serves the provisioner HTTP API).
    Serve(ServeArgs),
    /// Write the OCI bundle a create would use (for operators and reviewers).
    Bundle(bundle::BundleArgs),
    /// Kubernetes backend: render the objects of a create; the Pods' init
    /// step; the one-time ownership migration.
    #[command(subcommand)]
    Kube(kube::KubeCmd),
    /// Audit the seccomp profile, or run a command under it.
    #[command(subcommand)]
    Seccomp(seccomp::SeccompCmd),
    /// Native sandbox images: pull, import, ls, rm, gc (the store under
    /// <state_dir>/images; safe to run while the daemon serves).
    #[command(subcommand)]
    Image(image::ImageCmd),
    /// List the sandboxes of the local daemon (id, status, generation, workdir, oom).
    Ls(ops::Target),
    /// Show one sandbox of the local daemon as JSON.
    Inspect(ops::InspectArgs),
    /// Delete a sandbox through the local daemon.
    Rm(ops::RmArgs),
    /// Print the recent output (last 64 KiB, timestamped) of a sandbox's PID 1.
    Logs(ops::LogsArgs),
    /// Check this node for the configured backend and explain every problem
    /// with its fix; exit status 0 only when a create would work.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (also SANDBOXD_CONFIG). Optional: every value has a default.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// TCP listen address (also SANDBOXD_LISTEN); loopback unless the config allows otherwise.
    #[arg(long)]
    pub listen: Option<String>,
    /// Also listen on this Unix socket (also SANDBOXD_UNIX_SOCKET).
    #[arg(long)]
    pub unix_socket: Option<PathBuf>,
    /// Backend: native (default), kubernetes or memory (also PROVISIONER_BACKEND).
    #[arg(long)]
    pub backend: Option<String>,
    /// State directory (also SANDBOXD_STATE_DIR).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// Runs the parsed command; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Serve(args) => serve::run(args).map(|()| 0),
        Command::Bundle(args) => bundle::run(args).map(|()| 0),
        Command::Kube(cmd) => kube::run(cmd),
        // Runs before any tokio runtime exists (`seccomp run` execs).
        Command::Seccomp(cmd) => seccomp::run(cmd),
        Command::Ls(t) => ops::ls(t),
        Command::Inspect(a) => ops::inspect(a),
        Command::Logs(a) => ops::logs(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Image(cmd) => image::run(cmd),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            use std::io::Write;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sandboxd", &mut script);
            // A reader that stops early (`| head`) is not an error.
            match std::io::stdout().write_all(&script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                _ => Ok(0),
            }
        }
        Command::Rm(a) => ops::rm(a),
    }
}
