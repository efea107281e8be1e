//! Shared by the agent integration tests: start the real `sandbox-agent`
//! binary on a free loopback port, wait for its readiness byte, and speak
//! raw HTTP/1.1 to it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};

pub struct Agent {
    pub child: Child,
    pub port: u16,
    /// The agent's working directory (relative paths resolve here).
    pub root: tempfile::TempDir,
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Agent {
    /// Starts an agent with umask 077 (as in a sandbox) and extra `env`,
    /// asserting the readiness byte arrives and the pipe is then closed.
    pub fn start(env: &[(&str, &str)]) -> Agent {
        Self::start_wrapped(&[], env)
    }

    /// Like [`Agent::start`], run through `wrapper` (e.g. `unshare ...`).
    pub fn start_wrapped(wrapper: &[&str], env: &[(&str, &str)]) -> Agent {
        Self::start_full(wrapper, &[], env)
    }

    /// Like [`Agent::start`], with extra arguments (e.g. `--pooled`).
    pub fn start_with_args(args: &[&str], env: &[(&str, &str)]) -> Agent {
        Self::start_full(&[], args, env)
    }

    fn start_full(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Agent {
        let root = tempfile::tempdir().unwrap();
        let port = free_port();
        let (ready_r, ready_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let ready_w_raw = ready_w.as_raw_fd();
        // The static agent is built by the root build script next to `sandboxd`.
        let agent_bin =
            std::path::Path::new(env!("CARGO_BIN_EXE_sandboxd")).with_file_name("sandbox-agent");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(agent_bin);
                c
            }
            None => Command::new(agent_bin),
        };
        cmd.args(args)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .current_dir(root.path())
            .env("HOME", root.path())
            .env("SANDBOX_AGENT_READY_FD", ready_w_raw.to_string())
            .env("SANDBOX_AGENT_LOG", "warn")
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: only async-signal-safe calls (fcntl, umask) run between
        // fork and exec; they touch the child's own fd table and umask.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
                fcntl(ready_w_raw, FcntlArg::F_SETFD(FdFlag::empty()))
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().expect("spawn sandbox-agent");
        drop(ready_w);
        let agent = Agent { child, port, root };
        agent.expect_ready(ready_r, wrapper.is_empty());
        agent
    }

    /// One readiness byte must arrive; unless a wrapper process still
    /// holds the pipe, EOF must follow (the agent closed its end).
    fn expect_ready(&self, ready_r: OwnedFd, expect_eof: bool) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut file = std::fs::File::from(ready_r);
            let mut buf = Vec::new();
            let first = (&mut file).take(1).read_to_end(&mut buf);
            let _ = tx.send(first.map(|_| buf.clone()));
            if expect_eof {
                let rest = file.read_to_end(&mut buf).map(|_| buf);
                let _ = tx.send(rest);
            }
        });
        let wait = |what: &str| {
            rx.recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{what} from the agent within 20 s"))
                .unwrap()
        };
        assert_eq!(wait("readiness byte").len(), 1, "one readiness byte");
        if expect_eof {
            assert_eq!(
                wait("EOF after the readiness byte").len(),
                1,
                "exactly one byte, then EOF"
            );
        }
        // Listening already: a connect must succeed at once.
        TcpStream::connect(("127.0.0.1", self.port)).expect("agent listening after the ready byte");
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// One HTTP/1.1 request on a fresh connection.
    pub fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(200))).unwrap();
        let mut head = format!(
            "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nX-Extra-Header: whatever\r\nContent-Length: {}\r\n",
            self.port,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        parse_reply(&raw)
    }

    pub fn post_json(&self, path: &str, body: serde_json::Value) -> Reply {
        let bytes = serde_json::to_vec(&body).unwrap();
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            &bytes,
        )
    }

    /// POST /v1/shell/exec, asserting a 200 envelope; returns `data`.
    pub fn exec(&self, body: serde_json::Value) -> serde_json::Value {
        let r = self.post_json("/v1/shell/exec", body);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["success"], true);
        v["data"].clone()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_reply(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("HTTP head");
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size_text = std::str::from_utf8(&data[..eol]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        data = &data[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// A multipart/form-data body with the given (name, filename, bytes) parts.
pub fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "----sandboxd-test-boundary-7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    for (name, filename, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match filename {
            Some(f) => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
            ),
            None => body.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes()),
        }
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// (state, ppid) of a live or zombie process, from /proc/<pid>/stat.
pub fn proc_state(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| proc_state(pid) == Some(('Z', parent)))
        .collect()
}

/// Waits until `cond` holds or `within` passes.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
