//! Cross-check against the reference client, end to end (privileged): the
//! published Python client `agent-sandbox==0.0.30` drives a real native
//! sandbox through the daemon's proxy (`/api/sandboxes/{id}/proxy`, bearer
//! token as a header), with `tests/py/agent_client_check.py`: exec (output,
//! exit code, timeout), write, ranged read, list, find, str_replace_editor,
//! upload and byte-exact download.
//!
//! Needs root and the venv made by `tests/py/setup-venv.sh` at
//! `${SANDBOXD_TEST_VENV:-<repo>/target/test-venv}`. Without the venv the
//! test fails when `CI` is set and is skipped (loudly) otherwise.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;

use common::{mkdir_user, privileged, Daemon, NativeDirs, TOKEN};
use serde_json::json;

/// The venv's python, as in `tests/agent_client.rs`.
fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("SANDBOXD_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-venv"));
    let python = venv.join("bin/python");
    python.exists().then_some(python)
}

#[tokio::test]
async fn published_python_client_through_the_proxy() {
    let test = "published_python_client_through_the_proxy";
    if !privileged(test) {
        return;
    }
    let Some(python) = venv_python() else {
        let msg = "the agent-sandbox venv is missing; run tests/py/setup-venv.sh";
        if std::env::var_os("CI").is_some() {
            panic!("{msg} (CI is set, so this is a failure)");
        }
        eprintln!("\n*** SKIPPED {test}: {msg} ***\n");
        return;
    };
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    mkdir_user(&dirs.workspace("u1"));
    let (s, v) = d
        .create(json!({"sandbox_id": "pyc", "thread_id": "t", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let base_url = d.url("/api/sandboxes/pyc/proxy");
    assert_eq!(
        v["sandbox_url"]
            .as_str()
            .map(|u| u.ends_with("/api/sandboxes/pyc/proxy")),
        Some(true),
        "{v}"
    );

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/agent_client_check.py");
    let run = |token: &str| {
        Command::new(&python)
            .arg(&script)
            .arg(&base_url)
            .arg("/home/gem/user-data/client-check")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("SANDBOXD_TOKEN", token)
            .output()
            .expect("run the python client check")
    };

    // The proxy is behind the daemon's token: a wrong one fails the very
    // first call.
    let out = run("wrong-token");
    assert!(!out.status.success(), "a wrong token got through the proxy");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ok   get_context"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = run(TOKEN);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "client check through the proxy failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 20,
        "{stdout}"
    );

    // What the client wrote is in the user's workspace on the host, owned
    // by the sandbox user.
    let root = dirs.workspace("u1").join("client-check");
    assert_eq!(
        std::fs::read_to_string(root.join("docs/a.txt")).unwrap(),
        "l0\nL1\nl2\nl3\n"
    );
    let blob = std::fs::metadata(root.join("up/blob.bin")).unwrap();
    assert_eq!(blob.len(), 2 * 1024 * 1024 + 3 + 4);
    assert_eq!((blob.uid(), blob.gid()), (1000, 1000));
}
