//! The launcher refuses bad arguments with its usage and exit status 2,
//! before touching anything.

use std::process::Command;

#[test]
fn bad_arguments_print_usage_and_exit_2() {
    for args in [
        &[][..],
        &["--bundle"][..],
        &["--report-fd", "x", "--bundle", "/nonexistent"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sandbox-init"))
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("usage: sandbox-init --bundle DIR"), "{err}");
    }
}
