//! `sandbox-init`: the single-threaded launcher (see the `sandbox_init` crate).

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!(
            "sandbox-init {}{}",
            env!("CARGO_PKG_VERSION"),
            sandbox_abi::failpoint::version_suffix()
        );
        return;
    }
    let args = match sandbox_init::Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sandbox-init: {e}\nusage: sandbox-init --bundle DIR [--report-fd N] [--ready-fd N]");
            std::process::exit(2);
        }
    };
    std::process::exit(sandbox_init::main_with(args));
}
