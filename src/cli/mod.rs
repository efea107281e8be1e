//! The `sandboxd` command line: `serve` (the daemon) plus operator and
//! auditor subcommands. `main` only parses and dispatches here.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub mod bundle;
pub mod config_cmd;
pub mod doctor;
#[cfg(feature = "images")]
pub mod image;
#[cfg(feature = "kube")]
pub mod kube;
pub mod logfmt;
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
    #[cfg(feature = "kube")]
    #[command(subcommand)]
    Kube(kube::KubeCmd),
    /// Audit the seccomp profile, or run a command under it.
    #[command(subcommand)]
    Seccomp(seccomp::SeccompCmd),
    /// Native sandbox images: pull, import, ls, rm, gc (the store under
    /// <state_dir>/images; safe to run while the daemon serves).
    #[cfg(feature = "images")]
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
    /// Print the configuration file with every setting at its default
    /// (commented out): `sandboxd config default`.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Write man pages (sandboxd.1 and one per subcommand) into a directory.
    #[command(hide = true)]
    Man {
        /// The directory (created if missing).
        dir: PathBuf,
    },
    /// Print the OpenAPI 3.1 description of the provisioner API (the one
    /// `GET /openapi.json` serves) or of the in-sandbox agent API.
    Openapi {
        #[arg(value_enum)]
        api: OpenapiDoc,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// The configuration file with every setting at its default, commented
    /// out (the Debian package's /etc/sandboxd/config.toml).
    Default,
}

/// The documents `sandboxd openapi` prints (`docs/openapi/<name>.json`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OpenapiDoc {
    Provisioner,
    Agent,
}

/// `sandboxd.1`, then `sandboxd-<sub>.1` for every visible subcommand
/// (and `sandboxd-<sub>-<subsub>.1` below those), from the clap definitions.
pub fn write_man_pages(dir: &std::path::Path) -> anyhow::Result<()> {
    use clap::CommandFactory;
    fn write(dir: &std::path::Path, name: String, cmd: clap::Command) -> anyhow::Result<()> {
        let cmd = cmd.name(name.clone());
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
        for sub in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            write(dir, format!("{name}-{}", sub.get_name()), sub.clone())?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir)?;
    // The package version, without the test builds' " (failpoints)".
    let mut cmd = Cli::command().version(env!("CARGO_PKG_VERSION"));
    cmd.build();
    write(dir, "sandboxd".into(), cmd)
}

/// Writes `bytes` to stdout; a reader that stops early (`| head`) is not
/// an error.
fn print_bytes(bytes: &[u8]) -> anyhow::Result<i32> {
    use std::io::Write;
    match std::io::stdout().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
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
        #[cfg(feature = "kube")]
        Command::Kube(cmd) => kube::run(cmd),
        // Runs before any tokio runtime exists (`seccomp run` execs).
        Command::Seccomp(cmd) => seccomp::run(cmd),
        Command::Ls(t) => ops::ls(t),
        Command::Inspect(a) => ops::inspect(a),
        Command::Logs(a) => ops::logs(a),
        Command::Doctor(a) => doctor::run(a),
        #[cfg(feature = "images")]
        Command::Image(cmd) => image::run(cmd),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sandboxd", &mut script);
            print_bytes(&script)
        }
        Command::Config(ConfigCmd::Default) => print_bytes(config_cmd::default_toml().as_bytes()),
        Command::Man { dir } => {
            write_man_pages(&dir)?;
            Ok(0)
        }
        Command::Openapi { api } => print_bytes(
            match api {
                OpenapiDoc::Provisioner => crate::api::openapi::provisioner_json(),
                OpenapiDoc::Agent => sandbox_abi::agent_api::openapi::agent_json(),
            }
            .as_bytes(),
        ),
        Command::Rm(a) => ops::rm(a),
    }
}
