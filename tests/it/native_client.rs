//! Cross-check against the reference client, end to end (privileged): the
//! published Python client `agent-sandbox==0.0.30` drives a real native
//! sandbox through the daemon's proxy (`/api/sandboxes/{id}/proxy`, bearer
//! token as a header), with `tests/py/agent_client_check.py`: exec (output,
//! exit code, timeout), write, ranged read, list, find, str_replace_editor,
//! upload and byte-exact download. The sandbox is a claimed warm-pool
//! member (`[pool] size = 1`, turned on for this test: the pool is off by
//! default), so the client is checked against the claim path too.
//!
//! Needs root and the venv made by `tests/py/setup-venv.sh` at
//! `${SANDBOXD_TEST_VENV:-<repo>/target/test-venv}`. Without the venv the
//! test fails when `CI` is set and is skipped (loudly) otherwise.

use crate::common;
use crate::pyclient;

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use common::{mkdir_user, privileged, Daemon, NativeDirs, TOKEN};
use serde_json::json;

#[tokio::test]
async fn published_python_client_through_the_proxy() {
    let test = "published_python_client_through_the_proxy";
    if !privileged(test) {
        return;
    }
    let Some(python) = pyclient::python_or_skip(test) else {
        return;
    };
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_POOL_SIZE", "1")]);
    mkdir_user(&dirs.workspace("u1"));
    assert!(
        d.wait_log("pool member ready", std::time::Duration::from_secs(30)),
        "no pool member started"
    );
    let (s, v) = d
        .create(json!({"sandbox_id": "pyc", "thread_id": "t", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        d.wait_log(
            "claimed a pool member sandbox_id=pyc",
            std::time::Duration::from_secs(5)
        ),
        "the create did not claim the pool member"
    );
    let base_url = d.url("/api/sandboxes/pyc/proxy");
    assert_eq!(
        v["sandbox_url"]
            .as_str()
            .map(|u| u.ends_with("/api/sandboxes/pyc/proxy")),
        Some(true),
        "{v}"
    );

    let script = pyclient::script();
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
    pyclient::assert_passed(&out, "client check through the proxy");

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
