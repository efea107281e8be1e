//! schemathesis (PyPI, in the test venv: `tests/py/setup-venv.sh`) against
//! a running daemon, driven by the OpenAPI document the daemon serves at
//! `GET /openapi.json`, with `--checks all`: no 5xx but the documented ones
//! (`tests/py/schemathesis.toml`), every response conforms to the
//! document (status, content type, headers, body schema), the daemon
//! survives, and afterwards no sandbox is left (the list is empty; native:
//! the state and cgroup directories too).
//!
//! Bounded for CI: a fixed seed and `SANDBOXD_FUZZ_EXAMPLES` examples per
//! operation (default 25 with the memory backend, 10 with the native one);
//! set it higher for a longer run, e.g. `SANDBOXD_FUZZ_EXAMPLES=500 cargo
//! test --test it fuzz_api`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{self, mkdir_user, privileged, Daemon, NativeDirs, TOKEN};

fn schemathesis() -> PathBuf {
    let venv = std::env::var_os("SANDBOXD_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-venv"));
    let bin = venv.join("bin/schemathesis");
    assert!(
        bin.exists(),
        "{} is missing: run tests/py/setup-venv.sh (installs schemathesis from PyPI)",
        bin.display()
    );
    bin
}

fn examples(default: u32) -> u32 {
    std::env::var("SANDBOXD_FUZZ_EXAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `schemathesis run` on the daemon's document; panics with its
/// report unless every check passed. `extra`: operation filters.
fn run_schemathesis(d: &Daemon, examples: u32, extra: &[&str], deadline: Duration) {
    let report = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/schemathesis.toml");
    let mut cmd = Command::new(schemathesis());
    cmd.arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .arg("run")
        .arg(d.url("/openapi.json"))
        .args(["--checks", "all"])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .args(["--max-examples", &examples.to_string()])
        .args(["--seed", "20261201"])
        // One worker: schemathesis' parallel workers are not reliable
        // (an internal error in its coverage phase), and the daemon's
        // concurrency has its own tests.
        .args(["--workers", "1"])
        .args(["--generation-database", "none"])
        .args(["--request-timeout", "30"])
        .args(["--suppress-health-check", "all"])
        .args(extra)
        .current_dir(report.path())
        .env("SCHEMATHESIS_HOOKS", "")
        .stdin(std::process::Stdio::null());
    let started = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run schemathesis");
    // Bounded: a hung run is a failure, not a stuck CI job.
    let out = loop {
        if let Some(_status) = child.try_wait().unwrap() {
            break child.wait_with_output().unwrap();
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "schemathesis did not finish within {deadline:?}:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!(
        "schemathesis ({examples} examples per operation) took {:?}",
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "schemathesis found failures ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // "Test cases:\n  878 generated, 878 passed, ..."
    let generated: u64 = stdout
        .lines()
        .find_map(|l| l.trim().split_once(" generated,"))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        generated > 0,
        "schemathesis generated no test cases:\n{stdout}"
    );
    eprintln!("schemathesis: {generated} test cases");
}

/// Deletes what the fuzzer created and checks the daemon lists nothing.
async fn delete_all_and_check_empty(d: &Daemon) {
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(s, 200, "{v}");
    for sb in v["sandboxes"].as_array().unwrap() {
        let id = sb["sandbox_id"].as_str().unwrap();
        let (s, v) = d
            .json("DELETE", &format!("/api/sandboxes/{id}"), None)
            .await;
        assert_eq!(s, 200, "delete {id}: {v}");
    }
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!((s, v["count"].as_u64()), (200, Some(0)), "{v}");
    let (s, _, _) = d.call("GET", "/health", None, None).await;
    assert_eq!(s, 200, "the daemon does not answer after the fuzz run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_with_the_memory_backend() {
    let upstream = common::upstream::start().await;
    let template = format!("http://{upstream}/{{sandbox_id}}");
    let d = Daemon::start_memory(&[("MEMORY_SANDBOX_URL_TEMPLATE", template.as_str())]);
    let n = examples(25);
    let d = tokio::task::spawn_blocking(move || {
        // Everything but quiesce, which closes the create gate for good;
        // then quiesce on its own.
        run_schemathesis(
            &d,
            n,
            &["--exclude-operation-id", "quiesce"],
            Duration::from_secs(600),
        );
        run_schemathesis(
            &d,
            n.min(10),
            &["--include-operation-id", "quiesce"],
            Duration::from_secs(300),
        );
        d
    })
    .await
    .unwrap();
    delete_all_and_check_empty(&d).await;
    assert!(
        !d.log_contains("panicked"),
        "the daemon panicked during the fuzz run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_with_the_native_backend() {
    if !privileged("schemathesis_finds_nothing_with_the_native_backend") {
        return;
    }
    let dirs = NativeDirs::new();
    // The document's example create (uid u1, workdir projects/abc) then
    // makes a real sandbox, so the proxy reaches a real agent.
    mkdir_user(&dirs.workspace("u1").join("projects/abc"));
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_NETWORK", "none")]);
    let n = examples(10);
    let d = tokio::task::spawn_blocking(move || {
        run_schemathesis(
            &d,
            n,
            &["--exclude-operation-id", "quiesce"],
            Duration::from_secs(600),
        );
        d
    })
    .await
    .unwrap();
    delete_all_and_check_empty(&d).await;
    assert!(
        !d.log_contains("panicked"),
        "the daemon panicked during the fuzz run"
    );
    // Nothing left on the host: no sandbox state, no sandbox cgroup.
    let sandboxes = d.state_dir.path().join("sandboxes");
    let left: Vec<_> = std::fs::read_dir(&sandboxes)
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "sandbox state left behind: {left:?}");
    let mut cgroups = Vec::new();
    for c in ["memory", "pids", "unified", ""] {
        let p = Path::new("/sys/fs/cgroup")
            .join(c)
            .join(&dirs.cgroup_parent);
        if let Ok(rd) = std::fs::read_dir(&p) {
            cgroups.extend(
                rd.flatten()
                    .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                    .map(|e| e.path()),
            );
        }
    }
    assert!(
        cgroups.is_empty(),
        "sandbox cgroups left behind: {cgroups:?}"
    );
    assert_eq!(common::children_of(d.pid()), 0, "sandbox processes left");
}
