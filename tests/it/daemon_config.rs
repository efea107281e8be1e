//! Start-up behaviour of `sandboxd serve`: token rules, listen rules,
//! Unix socket, config file.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{Daemon, TOKEN};

fn serve_fails(env: &[(&str, &str)], args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.arg("serve")
        .arg("--state-dir")
        .arg(dir.path())
        .args(args)
        .env("PROVISIONER_BACKEND", "memory")
        .env_remove("SANDBOX_PROVISIONER_TOKEN")
        .env_remove("SANDBOXD_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "serve should have refused to start");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn refuses_short_or_padded_tokens() {
    let e = serve_fails(
        &[("SANDBOX_PROVISIONER_TOKEN", "short")],
        &["--listen", "127.0.0.1:0"],
    );
    assert!(e.contains("at least 32"), "{e}");
    let padded = format!("{TOKEN} ");
    let e = serve_fails(
        &[("SANDBOX_PROVISIONER_TOKEN", &padded)],
        &["--listen", "127.0.0.1:0"],
    );
    assert!(e.contains("white space"), "{e}");
}

#[test]
fn refuses_non_loopback_listen_unless_allowed() {
    let e = serve_fails(
        &[("SANDBOX_PROVISIONER_TOKEN", TOKEN)],
        &["--listen", "0.0.0.0:0"],
    );
    assert!(e.contains("non-loopback"), "{e}");
    let e = serve_fails(
        &[("SANDBOX_PROVISIONER_TOKEN", TOKEN)],
        &["--listen", "not-an-address"],
    );
    assert!(e.contains("listen address"), "{e}");
}

#[test]
fn bad_config_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "idle_timeout_seconds = \"ten\"\n").unwrap();
    let e = serve_fails(
        &[("SANDBOX_PROVISIONER_TOKEN", TOKEN)],
        &["--config", p.to_str().unwrap()],
    );
    assert!(e.contains("c.toml"), "{e}");
}

#[tokio::test]
async fn generates_a_private_token_and_logs_only_its_path() {
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state.path())
        .env("PROVISIONER_BACKEND", "memory")
        .env_remove("SANDBOX_PROVISIONER_TOKEN")
        .env_remove("SANDBOXD_CONFIG")
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let token_path = state.path().join("token");
    // Everything of the start-up is logged before the "listening" line
    // (with its address): read up to it, then the rest after the kill.
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        log.push_str(&line);
        if n == 0 || line.contains("http://127.0.0.1:") {
            break;
        }
    }
    assert!(log.contains("http://127.0.0.1:"), "not listening: {log}");
    let _ = child.kill();
    let _ = child.wait();
    std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
    let token = std::fs::read_to_string(&token_path).unwrap();
    let token = token.trim_end();
    assert!(token.len() >= 32);
    let mode = std::fs::metadata(&token_path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        log.contains(token_path.to_str().unwrap()),
        "path not logged: {log}"
    );
    assert!(!log.contains(token), "token value logged");
}

#[tokio::test]
async fn serves_on_a_unix_socket_too() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let d = Daemon::start(
        &[("PROVISIONER_BACKEND", "memory")],
        &["--unix-socket", sock.to_str().unwrap()],
    );
    assert!(d.wait_log("unix:", std::time::Duration::from_secs(5)));
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660);
    // Plain HTTP/1.1 over the socket.
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    write!(
        s,
        "GET /api/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"count\":0"), "{out}");
}

#[tokio::test]
async fn config_file_values_apply_and_env_wins() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(
        &p,
        "backend = \"memory\"\nidle_timeout_seconds = 900\nidle_check_interval_seconds = 7\n",
    )
    .unwrap();
    let d = Daemon::start(
        &[("SANDBOX_IDLE_TIMEOUT_SECONDS", "1000")],
        &["--config", p.to_str().unwrap()],
    );
    let (_, h) = d.json("GET", "/health", None).await;
    assert_eq!(h["backend"], "memory");
    assert_eq!(h["idle_timeout_seconds"], 1000);
    assert_eq!(h["idle_check_interval_seconds"], 7);
}

/// Hardening: a file holding the token (the config file with `token`, the
/// `token_file`) that group or others may read is refused at start with the
/// file named and the fix; mode 0600 starts.
#[test]
fn files_holding_the_token_must_be_private() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, format!("token = \"{TOKEN}\"\n")).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = serve_fails(
        &[],
        &["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()],
    );
    assert!(e.contains("c.toml") && e.contains("0644"), "{e}");
    assert!(e.contains(&format!("chmod 600 {}", cfg.display())), "{e}");

    let tf = dir.path().join("token");
    std::fs::write(&tf, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = serve_fails(
        &[("SANDBOXD_TOKEN_FILE", tf.to_str().unwrap())],
        &["--listen", "127.0.0.1:0"],
    );
    assert!(e.contains("0640") && e.contains("chmod 600"), "{e}");
    if nix::unistd::geteuid().is_root() {
        std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&tf, Some(4242), None).unwrap();
        let e = serve_fails(
            &[("SANDBOXD_TOKEN_FILE", tf.to_str().unwrap())],
            &["--listen", "127.0.0.1:0"],
        );
        assert!(
            e.contains("uid 4242") && e.contains("chown root:root"),
            "{e}"
        );
    }
}
