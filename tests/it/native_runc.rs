//! Cross-check of the bundle builder against OCI runtimes nobody here wrote:
//! the bundle `sandboxd bundle` writes (the same `config.json` a native
//! create gives `sandbox-init`) is run by `runc` (and `crun` when
//! installed), and the agent inside answers `GET /v1/sandbox` on
//! 127.0.0.1:8080 of the container's network namespace, reached with the
//! daemon's own `NetnsDialer`.
//!
//! Privileged. Without runc or crun its test skips loudly, or fails when
//! `CI` is set (`.ci/run` installs both; `require_tool`).

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{mkdir_user, privileged};
use sandboxd::backend::native::netns::{open_netns, NetnsDialer};

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

/// A bundle for sandbox `id` of user `u1` (workdir `proj`) over fresh host
/// directories; returns the bundle directory.
fn write_bundle(root: &Path, id: &str) -> PathBuf {
    let user_data = root.join("user-data");
    let skills = root.join("skills");
    mkdir_user(&user_data.join("shared/u1/workspace/proj"));
    std::fs::create_dir_all(skills.join("u1")).unwrap();
    std::fs::write(skills.join("u1/SKILL.md"), "skill\n").unwrap();
    let config = root.join("sandboxd.toml");
    std::fs::write(
        &config,
        format!(
            "user_data_root = {:?}\nskills_root = {:?}\n\n[native]\nagent_path = {:?}\n",
            user_data.display().to_string(),
            skills.display().to_string(),
            &common::sibling_bin("sandbox-agent").display().to_string(),
        ),
    )
    .unwrap();
    let bundle = root.join("bundle");
    let out = Command::new(SANDBOXD)
        .args(["bundle", "--sandbox-id", id, "--uid", "u1"])
        .args(["--workdir-path", "proj", "--out"])
        .arg(&bundle)
        .arg("--config")
        .arg(&config)
        // Only the file configures this bundle.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("run sandboxd bundle");
    assert!(
        out.status.success(),
        "sandboxd bundle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(printed.trim(), bundle.join("config.json").to_str().unwrap());
    bundle
}

/// A container started with `<runtime> run --detach`; killed and deleted
/// on drop.
struct Container {
    runtime: &'static str,
    /// Run the runtime with the unified (v2) hierarchy of a hybrid host
    /// hidden ([`HIDE_UNIFIED`]).
    v1_only: bool,
    state: PathBuf,
    name: String,
}

/// Runs the runtime (`$0`, with its arguments) in a mount namespace of its
/// own where the unified hierarchy of a hybrid host is an empty tmpfs, so
/// it sees (and its container gets) the v1 hierarchies only. crun refuses
/// a hybrid host whose unified hierarchy has a controller (this test
/// machine's has hugetlb): "cgroups in hybrid mode not supported".
const HIDE_UNIFIED: &str = "mount --make-rprivate / && \
     mount -t tmpfs sandboxd-xcheck /sys/fs/cgroup/unified && exec \"$0\" \"$@\"";

impl Container {
    fn cmd(&self) -> Command {
        let mut c = if self.v1_only {
            let mut c = Command::new("unshare");
            c.args(["-m", "sh", "-c", HIDE_UNIFIED, self.runtime]);
            c
        } else {
            Command::new(self.runtime)
        };
        c.arg("--root").arg(&self.state);
        c
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .cmd()
            .args(["kill", &self.name, "KILL"])
            .stderr(Stdio::null())
            .status();
        let _ = self
            .cmd()
            .args(["delete", "--force", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Sends one HTTP/1.1 request (`Connection: close`) over `stream`; returns
/// the whole response.
fn http(stream: std::net::TcpStream, method: &str, path: &str, body: &str) -> String {
    let mut stream = stream;
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).unwrap();
    String::from_utf8_lossy(&resp).into_owned()
}

/// What the agent under a runtime answered.
struct Answers {
    /// `GET /v1/sandbox`.
    context: String,
    /// `POST /v1/shell/exec` of [`EXEC`].
    exec: String,
    /// The file the command wrote to the workspace, read on the host.
    host_file: Option<(String, u32)>,
}

/// Identity, filter and workspace as the payload sees them.
const EXEC: &str = r#"{"command":"pwd; id -u; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; echo hi > from-runtime","timeout":20}"#;

/// Runs the bundle with `runtime` and talks to the agent inside. `Err`
/// carries the runtime's refusal (its stderr and log) for the caller to
/// judge.
async fn agent_answers_under(runtime: &'static str, v1_only: bool) -> Result<Answers, String> {
    let dir = tempfile::Builder::new()
        .prefix("sandboxd-runc-")
        .tempdir()
        .unwrap();
    let name = format!("sandboxd-xcheck-{runtime}-{}", std::process::id());
    let bundle = write_bundle(dir.path(), &name);
    let container = Container {
        runtime,
        v1_only,
        state: dir.path().join("state"),
        name: name.clone(),
    };
    let pid_file = dir.path().join("pid");
    let stdout = dir.path().join("stdout");
    let stderr = dir.path().join("stderr");
    let log = dir.path().join("runtime.log");
    let started = container
        .cmd()
        .arg("--log")
        .arg(&log)
        .args(["run", "--detach", "--pid-file"])
        .arg(&pid_file)
        .arg("--bundle")
        .arg(&bundle)
        .arg(&name)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .status()
        .expect("spawn the OCI runtime");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    if !started.success() {
        return Err(format!(
            "{runtime} run failed ({started}):\nstderr: {}\nlog: {}",
            read(&stderr),
            read(&log)
        ));
    }
    let pid: i32 = read(&pid_file).trim().parse().expect("pid file");
    let netns = Arc::new(open_netns(pid).expect("open the container's netns"));
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap(),
        "the container shares the host's network namespace"
    );
    let dialer = NetnsDialer::start().unwrap();
    let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let connect = || async {
        loop {
            match dialer.connect(netns.clone(), addr).await {
                Ok(s) => break s.into_std().unwrap(),
                Err(_) if Instant::now() < end => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!(
                    "the agent under {runtime} never listened: {e}\nagent stderr: {}\nlog: {}",
                    read(&stderr),
                    read(&log)
                ),
            }
        }
    };
    let stream = connect().await;
    let context = tokio::task::spawn_blocking(move || http(stream, "GET", "/v1/sandbox", ""))
        .await
        .unwrap();
    let stream = connect().await;
    let exec = tokio::task::spawn_blocking(move || http(stream, "POST", "/v1/shell/exec", EXEC))
        .await
        .unwrap();
    let written = dir
        .path()
        .join("user-data/shared/u1/workspace/proj/from-runtime");
    let host_file = std::fs::read_to_string(&written).ok().map(|text| {
        use std::os::unix::fs::MetadataExt;
        (text, std::fs::metadata(&written).unwrap().uid())
    });
    drop(container);
    Ok(Answers {
        context,
        exec,
        host_file,
    })
}

fn assert_agent_ok(runtime: &str, a: &Answers) {
    println!("{runtime}: {}\n{}", a.context, a.exec);
    assert!(
        a.context.starts_with("HTTP/1.1 200"),
        "{runtime}: GET /v1/sandbox: {}",
        a.context
    );
    assert!(
        a.context.contains("\"success\":true"),
        "{runtime}: {}",
        a.context
    );
    assert!(
        a.exec.starts_with("HTTP/1.1 200"),
        "{runtime}: POST /v1/shell/exec: {}",
        a.exec
    );
    let body = &a.exec[a.exec.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).expect("exec answer is JSON");
    assert_eq!(v["data"]["exit_code"], 0, "{runtime}: {v}");
    // The bundle's identity: cwd is the workdir, user 1000, the profile
    // from config.json installed by the runtime, no_new_privs.
    assert_eq!(
        v["data"]["output"], "/home/gem/user-data/proj\n1000\nNoNewPrivs:\t1\nSeccomp:\t2\n",
        "{runtime}: {v}"
    );
    // The workspace bind is the user's directory on the host, writable.
    assert_eq!(
        a.host_file,
        Some(("hi\n".to_string(), 1000)),
        "{runtime}: the write did not reach the host workspace"
    );
}
#[tokio::test]
async fn runc_runs_the_bundle_and_the_agent_answers() {
    if !privileged("runc_runs_the_bundle_and_the_agent_answers") {
        return;
    }
    if !common::require_tool("runc", "apt-get install runc") {
        return;
    }
    match agent_answers_under("runc", false).await {
        Ok(a) => assert_agent_ok("runc", &a),
        // A refusal is a bug in the bundle builder: report it verbatim.
        Err(e) => panic!("runc refused sandboxd's bundle:\n{e}"),
    }
}

#[tokio::test]
async fn crun_runs_the_bundle_and_the_agent_answers() {
    if !privileged("crun_runs_the_bundle_and_the_agent_answers") {
        return;
    }
    if !common::require_tool("crun", "apt-get install crun") {
        return;
    }
    let answers = match agent_answers_under("crun", false).await {
        // A refusal of the host's cgroup layout, not of the bundle: run it
        // again on the v1 hierarchies alone (the bundle's limits still
        // applied, by crun's v1 code).
        Err(e) if e.contains("hybrid mode not supported") => {
            eprintln!(
                "crun refused this hybrid host ({e}); again with its unified hierarchy hidden"
            );
            agent_answers_under("crun", true).await
        }
        r => r,
    };
    match answers {
        Ok(a) => assert_agent_ok("crun", &a),
        Err(e) => panic!("crun refused sandboxd's bundle:\n{e}"),
    }
}
