//! The operator's side of the daemon, with the real binary: `sandboxd ls`,
//! `inspect` and `rm` against a running daemon, their token resolution
//! (never creating a token), and the config file's `log_format`.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use common::{create_body, Daemon, TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");

/// Runs `sandboxd <args>` with `env` only (no token inherited from the test
/// environment).
fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("SANDBOX_PROVISIONER_TOKEN")
        .env_remove("SANDBOXD_CONFIG")
        .env_remove("SANDBOXD_STATE_DIR")
        .env_remove("SANDBOXD_TOKEN_FILE")
        .env_remove("SANDBOXD_UNIX_SOCKET")
        .env_remove("SANDBOXD_LISTEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    eprintln!(
        "sandboxd {args:?} -> {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn ls_inspect_rm_against_a_running_daemon() {
    let d = Daemon::start_memory(&[]);
    let (s, v) = d.create(create_body("cli1", "t1", "u1")).await;
    assert_eq!(s, 200, "{v}");
    let generation = v["generation"].as_str().unwrap().to_string();
    let url = format!("http://{}", d.addr);
    let tok = [("SANDBOX_PROVISIONER_TOKEN", TOKEN)];

    let o = cli(&["ls", "--url", &url], &tok);
    assert!(o.status.success());
    let out = stdout(&o);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["ID", "STATUS", "GENERATION", "WORKDIR", "OOM"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[0], "cli1");
    assert_eq!(row[1], "running");
    assert_eq!(row[2], generation);

    let o = cli(&["inspect", "--url", &url, "cli1"], &tok);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["generation"], generation.as_str());
    assert_eq!(v["sandbox_id"], "cli1");

    let o = cli(&["inspect", "--url", &url, "nosuch"], &tok);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("sandbox nosuch not found"));

    // A stale generation: refused, exit 1, sandbox still there.
    let o = cli(
        &[
            "rm",
            "--url",
            &url,
            "--expected-generation",
            "g-wrong",
            "cli1",
        ],
        &tok,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("sandbox cli1 was not deleted: it is not generation g-wrong"),
        "{}",
        stderr(&o)
    );
    let (s, _) = d.json("GET", "/api/sandboxes/cli1", None).await;
    assert_eq!(s, 200, "rm with a wrong generation deleted the sandbox");

    let o = cli(
        &[
            "rm",
            "--url",
            &url,
            "--expected-generation",
            &generation,
            "cli1",
        ],
        &tok,
    );
    assert!(o.status.success());
    assert!(stdout(&o).contains("deleted sandbox cli1"));
    let (s, _) = d.json("GET", "/api/sandboxes/cli1", None).await;
    assert_eq!(s, 404);

    // The token from the daemon's env file (as systemd's EnvironmentFile=).
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("sandboxd.env");
    std::fs::write(
        &env_file,
        format!("# token\nSANDBOX_PROVISIONER_TOKEN={TOKEN}\n"),
    )
    .unwrap();
    let o = cli(
        &[
            "ls",
            "--url",
            &url,
            "--env-file",
            env_file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success());

    // A wrong token is an error, not an empty list.
    let o = cli(
        &["ls", "--url", &url],
        &[("SANDBOX_PROVISIONER_TOKEN", &"x".repeat(40))],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("401"), "{}", stderr(&o));
}

/// No daemon where the CLI looks: exit 1 with the address it tried and the
/// OS's reason, over TCP and over a Unix socket; nothing on stdout.
#[test]
fn cli_without_a_daemon_says_where_it_looked() {
    // A loopback port nobody listens on (bound, then closed).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tok = [("SANDBOX_PROVISIONER_TOKEN", TOKEN)];
    let o = cli(&["ls", "--url", &format!("http://{addr}")], &tok);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains(&format!(
            "sandboxd: error: cannot connect to the daemon at {addr}: Connection refused"
        )),
        "{}",
        stderr(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let o = cli(
        &[
            "inspect",
            "--url",
            &format!("unix:{}", sock.display()),
            "x1",
        ],
        &tok,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!(
            "cannot connect to the daemon at unix:{}: No such file or directory",
            sock.display()
        )),
        "{}",
        stderr(&o)
    );
}

/// The CLI finds the daemon's generated token and its Unix socket through
/// the config file, like the daemon does.
#[test]
fn cli_uses_the_config_file_and_stored_token() {
    let state = tempfile::tempdir().unwrap();
    let sock = state.path().join("api.sock");
    let conf = state.path().join("config.toml");
    std::fs::write(
        &conf,
        format!(
            "backend = \"memory\"\nlisten = \"127.0.0.1:0\"\nstate_dir = {:?}\nunix_socket = {:?}\n",
            state.path().to_str().unwrap(),
            sock.to_str().unwrap()
        ),
    )
    .unwrap();
    // No token configured: the daemon generates <state>/token.
    let mut daemon = Command::new(BIN)
        .args(["serve", "--config", conf.to_str().unwrap()])
        .env_remove("SANDBOX_PROVISIONER_TOKEN")
        .env_remove("SANDBOXD_CONFIG")
        .env_remove("PROVISIONER_BACKEND")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sock.exists() {
        assert!(std::time::Instant::now() < end, "daemon did not start");
        assert!(daemon.try_wait().unwrap().is_none(), "daemon exited");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(state.path().join("token").exists());
    let o = cli(&["ls", "--config", conf.to_str().unwrap()], &[]);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(o.status.success());
    assert_eq!(stdout(&o).lines().count(), 1, "only the header expected");
    assert!(stdout(&o).starts_with("ID "));
}

#[test]
fn cli_without_a_token_says_so_and_creates_none() {
    let state = tempfile::tempdir().unwrap();
    // Hermetic: no node config or env file either.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("empty.toml");
    std::fs::write(&conf, "").unwrap();
    let o = cli(
        &[
            "ls",
            "--url",
            "http://127.0.0.1:9",
            "--config",
            conf.to_str().unwrap(),
            "--env-file",
            "/dev/null",
            "--state-dir",
            state.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no API token found"), "{}", stderr(&o));
    assert!(
        std::fs::read_dir(state.path()).unwrap().next().is_none(),
        "the CLI wrote into the state dir"
    );
}

/// Runs `sandboxd serve` until it exits (its backend fails on purpose right
/// after logging starts); returns its stderr lines.
fn serve_log(config: &std::path::Path, env: &[(&str, &str)]) -> Vec<String> {
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state.path())
        .env_remove("SANDBOXD_CONFIG")
        .env_remove("SANDBOXD_LOG_FORMAT")
        .env("SANDBOX_PROVISIONER_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let lines: Vec<String> = BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the backend should have failed: {lines:?}"
    );
    lines
}

#[test]
fn config_log_format_applies_and_env_wins() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("config.toml");
    // The native backend fails at its first step (the seccomp profile).
    std::fs::write(
        &conf,
        "log_format = \"json\"\n[native]\nseccomp_profile = \"/nonexistent/profile.json\"\n",
    )
    .unwrap();
    let alias = "PROVISIONER_BACKEND alias selects the native";
    let lines = serve_log(&conf, &[("PROVISIONER_BACKEND", "docker")]);
    let line = lines
        .iter()
        .find(|l| l.contains(alias))
        .unwrap_or_else(|| panic!("no alias line: {lines:?}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    // Fields at the top level (src/cli/logfmt.rs).
    assert_eq!(v["value"], "docker");

    let lines = serve_log(
        &conf,
        &[
            ("PROVISIONER_BACKEND", "local"),
            ("SANDBOXD_LOG_FORMAT", "text"),
        ],
    );
    let line = lines.iter().find(|l| l.contains(alias)).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(line).is_err(),
        "{line}"
    );
    assert!(line.contains("value=local"), "{line}");
}

/// `sandboxd bundle --out DIR` (run as root by reviewers) writes only into a
/// directory it creates itself (0700): an existing directory, or a symlink
/// planted where DIR should be, is refused with a clear error and nothing
/// is written through it.
#[test]
fn bundle_out_is_created_exclusively_and_never_followed() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("empty.toml");
    std::fs::write(&config, "").unwrap();
    let bundle = |out: &std::path::Path| {
        cli(
            &[
                "bundle",
                "--sandbox-id",
                "b1",
                "--uid",
                "u1",
                "--config",
                config.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            &[],
        )
    };
    // An existing (empty) directory.
    let existing = tmp.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    let out = bundle(&existing);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read_dir(&existing).unwrap().count(), 0);
    // A symlink to a directory elsewhere.
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = bundle(&link);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    // A dangling symlink: nothing is created at its target either.
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
    assert!(!bundle(&dangling).status.success());
    assert!(!tmp.path().join("nowhere").exists());
    // A new directory: made 0700, the config the daemon's only.
    let fresh = tmp.path().join("fresh");
    let out = bundle(&fresh);
    assert!(out.status.success());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(mode(&fresh.join("config.json")), 0o600);
    // The shared /etc (passwd among it) in etc/, the sandbox's own files
    // (hosts, hostname) in files/.
    assert_eq!(mode(&fresh.join("etc/passwd")), 0o644);
    assert_eq!(mode(&fresh.join("files/hosts")), 0o644);
    assert!(fresh.join("rootfs/var/tmp").is_dir());
}

/// `sandboxd doctor`: every check in plain words; a required problem is
/// explained with its fix and makes the exit status 1; `serve` refuses to
/// start with the same words.
#[test]
fn doctor_explains_and_serve_refuses_with_the_same_words() {
    if !common::privileged("doctor_explains_and_serve_refuses_with_the_same_words") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("c.toml");
    let write_config = |extra: &str| {
        std::fs::write(
            &config,
            format!(
                "backend = \"native\"\nstate_dir = {:?}\nuser_data_root = {:?}\nskills_root = {:?}\n{extra}",
                tmp.path().join("state"),
                tmp.path().join("ud"),
                tmp.path().join("sk"),
            ),
        )
        .unwrap();
        std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    };
    write_config("");
    let out = cli(&["doctor", "--config", config.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    for check in [
        "root",
        "kernel",
        "openat2",
        "pidfd",
        "seccomp",
        "cgroups",
        "state dir",
        "token",
    ] {
        assert!(text.contains(&format!("ok    {check}")), "{check}: {text}");
    }
    // A token file others can read, and a seccomp profile that is missing.
    let token = tmp.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    write_config(&format!(
        "token_file = {token:?}\n[native]\nseccomp_profile = {:?}\n",
        tmp.path().join("missing.json")
    ));
    let out = cli(&["doctor", "--config", config.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("FAIL  token"), "{text}");
    assert!(
        text.contains(&format!("fix: chmod 600 {}", token.display())),
        "{text}"
    );
    assert!(text.contains("FAIL  seccomp"), "{text}");
    assert!(text.contains("2 required check(s) failed"), "{text}");
    let serve = cli(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!serve.status.success());
    let err = String::from_utf8_lossy(&serve.stderr);
    assert!(
        err.contains("FAIL  token") && err.contains("FAIL  seccomp"),
        "{err}"
    );
    assert!(
        !tmp.path().join("state").exists(),
        "serve made its state dir before refusing"
    );
}

/// Shell completions name every subcommand.
#[test]
fn completions_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = cli(&["completions", shell], &[]);
        assert!(out.status.success());
        let text = stdout(&out);
        for sub in [
            "serve", "bundle", "seccomp", "ls", "inspect", "logs", "rm", "doctor",
        ] {
            assert!(text.contains(sub), "{shell}: {sub} missing");
        }
    }
    assert!(!cli(&["completions", "tcsh"], &[]).status.success());
}
