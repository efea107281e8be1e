//! `sandbox-init`: the single-threaded launcher (see `sandboxd::init`).

fn main() {
    let args = match sandboxd::init::Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sandbox-init: {e}\nusage: sandbox-init --bundle DIR [--report-fd N] [--ready-fd N]");
            std::process::exit(2);
        }
    };
    std::process::exit(sandboxd::init::main_with(args));
}
