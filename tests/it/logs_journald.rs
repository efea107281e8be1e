//! The daemon under journald: when `JOURNAL_STREAM` names its stderr (as
//! systemd sets it) and the log format is `auto` (or `journald`), it logs
//! through journald's native protocol, with `sandbox_id` and `generation`
//! as the journal fields `SANDBOX_ID` and `GENERATION` (so
//! `journalctl -u sandboxd SANDBOX_ID=…` selects one sandbox).
//!
//! This machine (and CI's) has no journald: the test binds a fake one, a
//! datagram socket at `/run/systemd/journal/socket` (the path
//! `tracing-journald` sends to), and parses what arrives. On a machine with
//! a live journald there, it fails and says so rather than touch it.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::{create_body, privileged, Daemon, TOKEN};
use crate::logs_json::{assert_sandbox_lines, json_lines};

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// The journal socket's path is the machine's: one test at a time.
static JOURNAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One journal entry: its fields in order (a name may repeat).
type Entry = Vec<(String, Vec<u8>)>;

/// Parses one datagram of journald's native protocol: `NAME=value\n`, or
/// `NAME\n<u64 LE length><value>\n` for any value. Checks each name is one
/// journald keeps (`[A-Z0-9_]`, not starting with a digit or `_`, at most
/// 64 bytes): it silently drops the others.
fn parse_entry(mut b: &[u8]) -> Result<Entry, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let nl = b
            .iter()
            .position(|&c| c == b'\n')
            .ok_or("a field without a newline")?;
        let line = &b[..nl];
        let (name, value, rest) = if let Some(eq) = line.iter().position(|&c| c == b'=') {
            (&line[..eq], line[eq + 1..].to_vec(), &b[nl + 1..])
        } else {
            let rest = &b[nl + 1..];
            if rest.len() < 8 {
                return Err(format!(
                    "no length after {:?}",
                    String::from_utf8_lossy(line)
                ));
            }
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            let rest = &rest[8..];
            if rest.len() <= len || rest[len] != b'\n' {
                return Err(format!(
                    "bad length {len} of {:?}",
                    String::from_utf8_lossy(line)
                ));
            }
            (line, rest[..len].to_vec(), &rest[len + 1..])
        };
        let name = String::from_utf8(name.to_vec()).map_err(|e| e.to_string())?;
        let valid = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with(|c: char| c.is_ascii_digit() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(format!("{name:?} is not a journal field name"));
        }
        out.push((name, value));
        b = rest;
    }
    Ok(out)
}

/// Every value of field `name` in `e`.
fn values<'a>(e: &'a Entry, name: &str) -> Vec<&'a str> {
    e.iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| std::str::from_utf8(v).unwrap_or("<not UTF-8>"))
        .collect()
}

fn show(e: &Entry) -> String {
    e.iter()
        .map(|(n, v)| format!("{n}={}", String::from_utf8_lossy(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether a live journald listens at [`JOURNAL_SOCKET`]: `Ok(false)` when
/// nothing is there or a socket nobody reads (left by a killed run).
fn live_journald() -> bool {
    let probe = UnixDatagram::unbound().and_then(|s| s.send_to(&[], JOURNAL_SOCKET));
    match probe {
        Ok(_) => true,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => false,
        Err(e) => panic!("cannot probe {JOURNAL_SOCKET}: {e}"),
    }
}

fn refuse_live_journald() {
    assert!(
        !live_journald(),
        "a journald listens at {JOURNAL_SOCKET}: these tests bind a fake journald there, so \
         they need a machine without one (CI's has none); run them in a container"
    );
}

/// A fake journald: a datagram socket bound at [`JOURNAL_SOCKET`], read by
/// a thread. Dropping it (also when a test fails) stops the thread and
/// removes the socket and the directories it created.
struct FakeJournald {
    entries: Arc<Mutex<Vec<Entry>>>,
    /// Datagrams that do not parse.
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Directories this test created, outermost first.
    created: Vec<PathBuf>,
}

impl FakeJournald {
    fn bind() -> FakeJournald {
        refuse_live_journald();
        let path = Path::new(JOURNAL_SOCKET);
        if path.symlink_metadata().is_ok() {
            // A socket nobody reads: a killed run's.
            std::fs::remove_file(path).unwrap();
        }
        let mut missing = Vec::new();
        let mut dir = path.parent().unwrap();
        while !dir.exists() {
            missing.push(dir.to_path_buf());
            dir = dir.parent().unwrap();
        }
        missing.reverse();
        let mut fake = FakeJournald {
            entries: Arc::default(),
            errors: Arc::default(),
            stop: Arc::default(),
            thread: None,
            created: Vec::new(),
        };
        for d in missing {
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            fake.created.push(d);
        }
        let socket =
            UnixDatagram::bind(path).unwrap_or_else(|e| panic!("bind {JOURNAL_SOCKET}: {e}"));
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let (entries, errors, stop) =
            (fake.entries.clone(), fake.errors.clone(), fake.stop.clone());
        fake.thread = Some(std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            while !stop.load(Ordering::Relaxed) {
                match socket.recv(&mut buf) {
                    // The layer's probe when it starts.
                    Ok(0) => {}
                    Ok(n) => match parse_entry(&buf[..n]) {
                        Ok(e) => {
                            eprintln!("[journal] {}", show(&e));
                            entries.lock().unwrap().push(e);
                        }
                        Err(e) => errors
                            .lock()
                            .unwrap()
                            .push(format!("{e}: {:?}", String::from_utf8_lossy(&buf[..n]))),
                    },
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => panic!("recv on the fake journald: {e}"),
                }
            }
        }));
        fake
    }

    /// Waits (at most `timeout`) for an entry that `pred` accepts.
    fn wait_for(&self, timeout: Duration, pred: impl Fn(&Entry) -> bool) -> Option<Entry> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(e) = self.entries.lock().unwrap().iter().find(|e| pred(e)) {
                return Some(e.clone());
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every entry so far; fails on a datagram that did not parse.
    fn entries(&self) -> Vec<Entry> {
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "not journal entries: {errors:#?}");
        self.entries.lock().unwrap().clone()
    }
}

impl Drop for FakeJournald {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(JOURNAL_SOCKET);
        for d in self.created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn message_starts(e: &Entry, prefix: &str) -> bool {
    values(e, "MESSAGE").iter().any(|m| m.starts_with(prefix))
}

#[tokio::test]
async fn under_journald_the_sandbox_fields_are_journal_fields() {
    // Binding in /run needs root.
    if !privileged("under_journald_the_sandbox_fields_are_journal_fields") {
        return;
    }
    let _one = JOURNAL.lock().await;
    let journal = FakeJournald::bind();
    // The daemon's stderr is a file; JOURNAL_STREAM names it, as systemd
    // names the stream socket it gives a unit.
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let m = stderr.as_file().metadata().unwrap();
    let stream = format!("{}:{}", m.dev(), m.ino());
    let state_dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state_dir.path())
        .env_remove("SANDBOXD_CONFIG")
        .env("PROVISIONER_BACKEND", "memory")
        .env("SANDBOX_PROVISIONER_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        // Empty counts as unset: the default, `auto`.
        .env("SANDBOXD_LOG_FORMAT", "")
        .env("JOURNAL_STREAM", &stream)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .expect("spawn sandboxd");
    // Killed on drop, whatever fails below.
    let mut d = Daemon {
        child,
        addr: "127.0.0.1:0".parse().unwrap(),
        state_dir,
        log: Arc::default(),
        client: Client::builder(TokioExecutor::new()).build_http(),
        graceful_drop: false,
    };
    let stderr_text = || std::fs::read_to_string(stderr.path()).unwrap();
    let listening = journal
        .wait_for(Duration::from_secs(60), |e| {
            values(e, "MESSAGE") == ["listening"] && !values(e, "ADDRESS").is_empty()
        })
        .unwrap_or_else(|| {
            panic!(
                "no \"listening\" entry in the journal; stderr: {}",
                stderr_text()
            )
        });
    let address = values(&listening, "ADDRESS")[0].to_string();
    d.addr = address
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("address {address}"))
        .parse()
        .unwrap();

    let (s, v) = d.create(create_body("logjd", "t1", "u1")).await;
    assert_eq!(s, 200, "{v}");
    let generation = v["generation"].as_str().unwrap().to_string();
    let (s, _) = d.json("DELETE", "/api/sandboxes/logjd", None).await;
    assert_eq!(s, 200);
    journal
        .wait_for(Duration::from_secs(5), |e| {
            message_starts(e, "sandbox deleted")
        })
        .expect("no \"sandbox deleted\" entry in the journal");
    let entries = journal.entries();

    // Every entry: a message, a priority, the identifier, no `F_` fields.
    for e in &entries {
        assert_eq!(values(e, "MESSAGE").len(), 1, "{}", show(e));
        assert_eq!(values(e, "SYSLOG_IDENTIFIER"), ["sandboxd"], "{}", show(e));
        let p = values(e, "PRIORITY");
        assert!(p.len() == 1 && "34567".contains(p[0]), "{}", show(e));
        assert!(!e.iter().any(|(n, _)| n.starts_with("F_")), "{}", show(e));
    }
    // Levels map to syslog priorities: warn 4, info 6.
    let warned = entries
        .iter()
        .find(|e| message_starts(e, "memory backend selected"))
        .expect("no memory backend warning");
    assert_eq!(values(warned, "PRIORITY"), ["4"], "{}", show(warned));
    assert_eq!(values(&listening, "PRIORITY"), ["6"]);

    // The sandbox's entries: each carries its id and generation as journal
    // fields (a span's and an event's own may both be there, equal).
    let ours: Vec<&Entry> = entries
        .iter()
        .filter(|e| values(e, "SANDBOX_ID").contains(&"logjd"))
        .collect();
    for e in &ours {
        assert!(
            values(e, "SANDBOX_ID").iter().all(|v| *v == "logjd"),
            "{}",
            show(e)
        );
        let g = values(e, "GENERATION");
        assert!(
            !g.is_empty() && g.iter().all(|v| *v == generation),
            "an entry without the generation {generation}: {}",
            show(e)
        );
    }
    for (message, span) in [("sandbox created", "create"), ("sandbox deleted", "delete")] {
        assert!(
            ours.iter()
                .any(|e| message_starts(e, message) && values(e, "SPAN_NAME").contains(&span)),
            "no {message:?} entry in the {span} span with both fields: {:#?}",
            ours.iter().map(|e| show(e)).collect::<Vec<_>>()
        );
    }
    // Nothing went to stderr.
    d.kill();
    assert_eq!(stderr_text(), "", "the daemon wrote to stderr");
}

#[tokio::test]
async fn journald_format_without_a_journal_falls_back_to_json() {
    let _one = JOURNAL.lock().await;
    refuse_live_journald();
    let d = Daemon::start_memory(&[("SANDBOXD_LOG_FORMAT", "journald")]);
    let (s, v) = d.create(create_body("logjf", "t1", "u1")).await;
    assert_eq!(s, 200, "{v}");
    let generation = v["generation"].as_str().unwrap().to_string();
    let (s, _) = d.json("DELETE", "/api/sandboxes/logjf", None).await;
    assert_eq!(s, 200);
    assert!(d.wait_log("sandbox deleted", Duration::from_secs(5)));
    let lines = json_lines(&d);
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("cannot reach journald"))
            && l["socket"] == JOURNAL_SOCKET),
        "no warning about the missing journal: {lines:#?}"
    );
    assert_sandbox_lines(&lines, "logjf", &generation);
}

#[test]
fn the_native_protocol_parser_reads_both_forms() {
    let mut b = b"MESSAGE=hi\nPRIORITY=6\nMULTI\n".to_vec();
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(b"a\nb=c\nSANDBOX_ID=x\n");
    let e = parse_entry(&b).unwrap();
    assert_eq!(values(&e, "MESSAGE"), ["hi"]);
    assert_eq!(values(&e, "MULTI"), ["a\nb=c"]);
    assert_eq!(values(&e, "SANDBOX_ID"), ["x"]);
    assert!(parse_entry(b"F_x=1\n").is_err());
    assert!(parse_entry(b"MESSAGE=no newline").is_err());
    assert!(parse_entry(b"M\n\x09\0\0\0\0\0\0\0abc\n").is_err());
}
