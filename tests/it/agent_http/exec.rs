//! Exec: output, exit codes, timeouts, caps, truncation, reaping, SIGTERM.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::agent_support::{eventually, proc_state, zombies_of, Agent};

#[test]
fn exec_interleaves_output_and_reports_exit_code() {
    let agent = Agent::start(&[]);
    let d = agent.exec(json!({"command": "echo a; echo b >&2; echo c; echo d >&2; exit 3"}));
    assert_eq!(d["output"], "a\nb\nc\nd\n");
    assert_eq!(d["exit_code"], 3);
    assert_eq!(d["status"], "completed");
    assert_eq!(
        d["command"],
        "echo a; echo b >&2; echo c; echo d >&2; exit 3"
    );
    assert!(!d["session_id"].as_str().unwrap().is_empty());

    // Nulls, unknown fields, float timeouts, a given id, exec_dir, stdin.
    std::fs::create_dir(agent.path("sub")).unwrap();
    let d = agent.exec(json!({
        "command": "pwd; cat; echo $((1+1))", "exec_dir": agent.path("sub"), "timeout": 30.5,
        "hard_timeout": null, "truncate": null, "async_mode": null, "id": "my-session",
        "no_change_timeout": 5, "preserve_symlinks": false, "strict": null, "future_field": {"x": 1}
    }));
    assert_eq!(d["output"], format!("{}\n2\n", agent.path("sub").display()));
    assert_eq!(d["session_id"], "my-session");
    assert_eq!(d["exit_code"], 0);

    // Missing exec_dir falls back to the agent's cwd unless strict.
    let d = agent.exec(json!({"command": "pwd", "exec_dir": "/no/such/dir"}));
    assert_eq!(d["output"], format!("{}\n", agent.root.path().display()));
    let r = agent.post_json(
        "/v1/shell/exec",
        json!({"command": "pwd", "exec_dir": "/no/such", "strict": true}),
    );
    assert_eq!(r.status, 400);
}

#[test]
fn exec_timeout_kills_the_group_before_n_seconds() {
    let agent = Agent::start(&[]);
    for (field, n) in [("timeout", json!(2)), ("hard_timeout", json!(1.5))] {
        let start = Instant::now();
        let d = agent
            .exec(json!({"command": "sleep 60 & echo bg=$!; echo partial; sleep 60", field: n}));
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs_f64(n.as_f64().unwrap()),
            "{field}: answered after {took:?}"
        );
        assert!(
            took > Duration::from_secs_f64(n.as_f64().unwrap() * 0.7),
            "{field}: answered too early ({took:?})"
        );
        assert_eq!(d["status"], "hard_timeout");
        assert_eq!(d["exit_code"], 124);
        let out = d["output"].as_str().unwrap();
        assert!(out.contains("partial"), "{out:?}");
        let bg: i32 = out
            .lines()
            .find_map(|l| l.strip_prefix("bg="))
            .unwrap()
            .parse()
            .unwrap();
        // The background sleep was in the group: killed, then reaped by the agent.
        assert!(
            eventually(Duration::from_secs(3), || proc_state(bg).is_none()),
            "background job {bg} survived: {:?}",
            proc_state(bg)
        );
    }
}

#[test]
fn exec_without_timeout_is_capped_with_a_nonzero_code() {
    let agent = Agent::start(&[("SANDBOX_AGENT_EXEC_CAP_SECONDS", "1.5")]);
    let start = Instant::now();
    let d = agent.exec(json!({"command": "echo before; sleep 30"}));
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(d["exit_code"], 124);
    assert_eq!(d["status"], "hard_timeout");
    assert!(d["output"].as_str().unwrap().starts_with("before\n"));
    // A timeout above the cap is cut to the cap too.
    let start = Instant::now();
    agent.exec(json!({"command": "sleep 30", "timeout": 100}));
    assert!(start.elapsed() < Duration::from_millis(1500));
}

#[test]
fn killed_by_signal_reports_128_plus_signal() {
    let agent = Agent::start(&[]);
    assert_eq!(
        agent.exec(json!({"command": "kill -9 $$"}))["exit_code"],
        137
    );
    assert_eq!(
        agent.exec(json!({"command": "kill -TERM $$"}))["exit_code"],
        143
    );
    assert_eq!(
        agent.exec(json!({"command": "sleep 5 & kill -KILL $!; wait $!"}))["exit_code"],
        137
    );
    // The agent survives its commands' signals to their own groups.
    assert_eq!(
        agent.exec(json!({"command": "kill -TERM 0"}))["exit_code"],
        143
    );
    assert_eq!(agent.exec(json!({"command": "true"}))["exit_code"], 0);
}

#[test]
fn output_truncation_is_configurable_and_optional() {
    let agent = Agent::start(&[("SANDBOX_AGENT_OUTPUT_LIMIT_BYTES", "1000")]);
    let cmd = "head -c 5000 /dev/zero | tr '\\0' x";
    let d = agent.exec(json!({"command": cmd}));
    let out = d["output"].as_str().unwrap();
    assert!(
        out.starts_with(&"x".repeat(1000)) && !out.starts_with(&"x".repeat(1001)),
        "{out}"
    );
    assert!(
        out.contains("output truncated to the first 1000 of 5000 bytes"),
        "{out}"
    );
    let d = agent.exec(json!({"command": cmd, "truncate": false}));
    assert_eq!(d["output"], "x".repeat(5000));
}

#[test]
fn async_mode_returns_running_and_keeps_going() {
    let agent = Agent::start(&[]);
    let start = Instant::now();
    let d = agent.exec(json!({"command": "sleep 0.5; echo done > marker", "async_mode": true}));
    assert!(start.elapsed() < Duration::from_millis(400));
    assert_eq!(d["status"], "running");
    assert!(eventually(Duration::from_secs(5), || agent
        .path("marker")
        .exists()));
}

#[test]
fn orphans_are_reaped() {
    let agent = Agent::start(&[]);
    // Double forks: the subshells exit at once, their children are orphaned
    // onto the agent (PID 1 in a sandbox, a subreaper here).
    let d = agent.exec(json!({"command": "( sleep 1 & echo orphan=$! ); for i in 1 2 3 4 5 6 7 8; do ( true & ) ; ( sh -c 'exit 3' & ); done"}));
    assert_eq!(d["exit_code"], 0);
    let orphan: i32 = d["output"]
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("orphan="))
        .unwrap()
        .parse()
        .unwrap();
    let state = proc_state(orphan);
    assert_eq!(
        state.map(|s| s.1),
        Some(agent.pid()),
        "orphan not re-parented to the agent: {state:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || proc_state(orphan).is_none()),
        "orphan {orphan} not reaped: {:?}",
        proc_state(orphan)
    );
    assert!(eventually(Duration::from_secs(3), || zombies_of(
        agent.pid()
    )
    .is_empty()));
    assert_eq!(zombies_of(agent.pid()), Vec::<i32>::new());
}

#[test]
fn sigterm_is_forwarded_and_the_agent_exits_cleanly() {
    let mut agent = Agent::start(&[]);
    let script =
        "trap 'echo got-term > term-marker; exit 0' TERM; echo started > started; sleep 100 & wait";
    agent.exec(json!({"command": script, "async_mode": true}));
    assert!(eventually(Duration::from_secs(5), || agent
        .path("started")
        .exists()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    assert!(eventually(Duration::from_secs(10), || {
        status = agent.child.try_wait().unwrap();
        status.is_some()
    }));
    assert!(status.unwrap().success(), "{status:?}");
    assert_eq!(
        std::fs::read_to_string(agent.path("term-marker")).unwrap(),
        "got-term\n"
    );
}

#[test]
fn commands_get_a_clean_signal_state() {
    // Started with INT, QUIT and HUP ignored, as `cmd &` or nohup would.
    let wrapper = ["sh", "-c", "trap '' INT QUIT HUP; exec \"$0\" \"$@\""];
    let agent = Agent::start_wrapped(&wrapper, &[]);
    // Nothing blocked or ignored is inherited from the agent (SIGPIPE,
    // which Rust ignores, included). glibc's posix_spawn leaves only its
    // internal signals 32 and 33 ignored; every glibc program resets them.
    let d = agent.exec(json!({"command": "grep -E '^Sig(Blk|Ign)' /proc/self/status"}));
    let out = d["output"].as_str().unwrap();
    let mask = |name: &str| {
        let line = out.lines().find_map(|l| l.strip_prefix(name)).unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    };
    assert_eq!(mask("SigBlk:"), 0, "{out}");
    let glibc_internal = (1u64 << 31) | (1u64 << 32);
    assert_eq!(mask("SigIgn:") & !glibc_internal, 0, "{out}");
    // Open fds: only 0, 1, 2 (and the one grep itself opens for /proc).
    let d = agent.exec(json!({"command": "ls /proc/self/fd"}));
    assert_eq!(d["output"], "0\n1\n2\n3\n");
}

#[test]
fn long_commands_run_from_a_removed_script_file() {
    let agent = Agent::start(&[]);
    let cmd = format!("echo \"$0\"; x={}; echo ${{#x}}", "a".repeat(200_000));
    let d = agent.exec(json!({ "command": cmd }));
    let out = d["output"].as_str().unwrap();
    let mut lines = out.lines();
    let script = lines.next().unwrap().to_owned();
    assert_eq!(lines.next(), Some("200000"), "{out:.200}");
    assert_eq!(d["exit_code"], 0);
    assert!(
        eventually(Duration::from_secs(2), || !std::path::Path::new(&script)
            .exists()),
        "{script} left behind"
    );
}

#[test]
fn background_jobs_keep_writing_after_the_answer() {
    let agent = Agent::start(&[]);
    let cmd = "( for i in 1 2 3 4 5 6 7 8; do echo tick; sleep 0.1; done; echo finished > bg-done ) & echo answered";
    let d = agent.exec(json!({ "command": cmd }));
    // The job may print its first tick before or after "answered".
    assert!(d["output"].as_str().unwrap().contains("answered\n"));
    // Its later writes to the (still drained) pipe must not kill it.
    assert!(eventually(Duration::from_secs(5), || agent
        .path("bg-done")
        .exists()));
}

#[test]
fn an_abandoned_request_kills_its_command() {
    use std::io::Write;
    let agent = Agent::start(&[]);
    let body = serde_json::to_vec(&json!({"command": "echo $$ > leader.pid; sleep 60"})).unwrap();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
    write!(s, "POST /v1/shell/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
    s.write_all(&body).unwrap();
    assert!(eventually(Duration::from_secs(5), || agent
        .path("leader.pid")
        .exists()));
    let mut leader = 0;
    assert!(eventually(Duration::from_secs(2), || {
        leader = std::fs::read_to_string(agent.path("leader.pid"))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0);
        leader > 0
    }));
    assert!(proc_state(leader).is_some());
    drop(s);
    assert!(
        eventually(Duration::from_secs(5), || proc_state(leader).is_none()),
        "command outlived its request: {:?}",
        proc_state(leader)
    );
}

/// The daemon passes its exec timeout minus a margin: caps above the old
/// fixed bound (180 s) are accepted; nonsense is refused at start.
#[test]
fn the_exec_cap_may_exceed_the_old_bound() {
    let agent = Agent::start(&[("SANDBOX_AGENT_EXEC_CAP_SECONDS", "590")]);
    let d = agent.exec(json!({"command": "echo up"}));
    assert_eq!(d["output"], "up\n");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_sandboxd")).with_file_name("sandbox-agent");
    for bad in ["0", "-1", "nan", "inf", "86401"] {
        let mut child = std::process::Command::new(&bin)
            .args(["--listen", "127.0.0.1:0", "--exec-cap-seconds", bad])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let ended = eventually(Duration::from_secs(5), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if !ended {
            let _ = child.kill();
        }
        let _ = child.wait();
        assert!(ended, "--exec-cap-seconds {bad} was accepted");
    }
}
