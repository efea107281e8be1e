//! `sandboxd`: parses arguments and calls the library.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "sandboxd", version, about = "Node-local sandbox runtime")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// Audit the seccomp profile, or run a command under it.
    #[command(subcommand)]
    Seccomp(sandboxd::cli::seccomp::SeccompCmd),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Seccomp(c) => sandboxd::cli::seccomp::run(c)?,
    };
    std::process::exit(code);
}
