//! `sandboxd`: the daemon and its operator/auditor CLI.

use clap::Parser;

fn main() {
    let cli = sandboxd::cli::Cli::parse();
    match sandboxd::cli::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("sandboxd: error: {e:#}");
            std::process::exit(1);
        }
    }
}
