//! End-to-end tests of `sandbox-agent`: the real binary, real processes,
//! raw HTTP/1.1 over TCP. Every test starts its own agent (umask 077, cwd a
//! fresh temp dir) and checks the readiness pipe on the way.

mod agent_support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use agent_support::{eventually, multipart, proc_state, zombies_of, Agent};
use serde_json::json;

#[test]
fn context_and_readiness() {
    let agent = Agent::start(&[]);
    let r = agent.request("GET", "/v1/sandbox", &[], b"");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["home_dir"], agent.root.path().display().to_string());
    assert!(v["version"].is_string());
    let sys = &v["detail"]["system"];
    for k in ["os", "os_version", "arch", "user", "home_dir", "timezone"] {
        assert!(sys[k].is_string(), "{k} missing: {v}");
    }
    let port = agent.port.to_string();
    assert!(sys["occupied_ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p == &json!(port)));
    assert!(
        v["detail"]["runtime"]["python"].is_array() && v["detail"]["runtime"]["nodejs"].is_array()
    );
    assert!(v["detail"]["utils"].is_array());
    assert!(!v["data"].is_null());
    // The readiness variable never reaches commands.
    let d = agent.exec(json!({"command": "echo ${SANDBOX_AGENT_READY_FD:-unset}"}));
    assert_eq!(d["output"], "unset\n");
}

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
fn error_envelopes_and_status_codes() {
    let agent = Agent::start(&[]);
    std::fs::write(agent.path("bin.dat"), [0x89u8, b'P', b'N', b'G', 0xff]).unwrap();
    std::fs::write(agent.path("f.txt"), "x\n").unwrap();
    let cases = [
        ("/v1/file/read", json!({"file": "missing.txt"}), 404),
        ("/v1/file/read", json!({"file": "/"}), 400),
        ("/v1/file/list", json!({"path": "missing"}), 404),
        ("/v1/file/list", json!({"path": "f.txt"}), 400),
        (
            "/v1/file/find",
            json!({"path": "missing", "glob": "*"}),
            404,
        ),
        ("/v1/file/write", json!({"file": ".", "content": "x"}), 400),
        (
            "/v1/file/write",
            json!({"file": "x", "content": "%%%", "encoding": "base64"}),
            400,
        ),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "str_replace", "path": "f.txt", "old_str": "nope", "new_str": "y"}),
            400,
        ),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "str_replace", "path": "missing.txt", "old_str": "a"}),
            404,
        ),
        ("/v1/shell/exec", json!({"no_command": true}), 400),
        ("/v1/nope", json!({}), 404),
    ];
    for (route, body, status) in cases {
        let r = agent.post_json(route, body.clone());
        assert_eq!(
            r.status,
            status,
            "{route} {body}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        assert_eq!(v["success"], false);
        assert!(v["data"].is_null());
        assert!(!v["message"].as_str().unwrap().is_empty());
    }
    let r = agent.post_json("/v1/file/read", json!({"file": "bin.dat"}));
    assert!(r.status >= 400);
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("'utf-8' codec can't decode"));
    let r = agent.request(
        "POST",
        "/v1/file/read",
        &[("Content-Type", "application/json")],
        b"{not json",
    );
    assert_eq!((r.status, r.json()["success"].clone()), (400, json!(false)));
    let r = agent.request("GET", "/v1/file/download?path=missing.bin", &[], b"");
    assert_eq!((r.status, r.json()["data"].clone()), (404, json!(null)));
    let r = agent.request("GET", "/v1/file/download?path=%2F", &[], b"");
    assert_eq!(r.status, 400);
    let r = agent.request("GET", "/v1/file/download", &[], b"");
    assert_eq!(r.status, 400);
}

#[test]
fn write_read_list_find_and_edit() {
    let agent = Agent::start(&[]);
    let ok = |route: &str, body: serde_json::Value| {
        let r = agent.post_json(route, body);
        assert_eq!(
            r.status,
            200,
            "{route}: {}",
            String::from_utf8_lossy(&r.body)
        );
        r.json()["data"].clone()
    };
    let d = ok(
        "/v1/file/write",
        json!({"file": "docs/a.txt", "content": "l0\nl1\nl2\nl3", "trailing_newline": true}),
    );
    assert_eq!(d["bytes_written"], 12);
    assert_eq!(d["file"], agent.path("docs/a.txt").display().to_string());
    ok(
        "/v1/file/write",
        json!({"file": "docs/a.txt", "content": "l4", "append": true, "leading_newline": null}),
    );
    ok(
        "/v1/file/write",
        json!({"file": "docs/b.bin", "content": "AAH/", "encoding": "base64"}),
    );
    ok(
        "/v1/file/write",
        json!({"file": "docs/.hidden", "content": ""}),
    );
    ok(
        "/v1/file/write",
        json!({"file": "docs/sub/deep/c.py", "content": "print(1)\n"}),
    );
    assert_eq!(
        std::fs::read(agent.path("docs/b.bin")).unwrap(),
        [0, 1, 255]
    );
    // umask 077 applies to created files.
    let mode = std::fs::metadata(agent.path("docs/a.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let read = |body: serde_json::Value| ok("/v1/file/read", body)["content"].clone();
    let file = agent.path("docs/a.txt");
    assert_eq!(read(json!({"file": file})), "l0\nl1\nl2\nl3\nl4");
    assert_eq!(
        read(json!({"file": file, "start_line": 1, "end_line": 3})),
        "l1\nl2\n"
    );
    assert_eq!(
        read(json!({"file": file, "start_line": 3, "end_line": null, "sudo": false})),
        "l3\nl4"
    );
    assert_eq!(read(json!({"file": "docs/a.txt", "end_line": 1})), "l0\n");

    let d = ok("/v1/file/list", json!({"path": "docs/../docs/"}));
    assert_eq!(d["path"], agent.path("docs").display().to_string());
    let files = d["files"].as_array().unwrap();
    let names: Vec<&str> = files.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, [".hidden", "a.txt", "b.bin", "sub"]);
    assert_eq!(
        (
            d["total_count"].clone(),
            d["directory_count"].clone(),
            d["file_count"].clone()
        ),
        (json!(4), json!(1), json!(3))
    );
    for f in files {
        assert_eq!(
            f["path"],
            agent
                .path("docs")
                .join(f["name"].as_str().unwrap())
                .display()
                .to_string()
        );
        assert!(f["modified_time"].is_string());
        assert!(f["size"].is_u64());
    }
    assert_eq!(files[1]["size"], 14);
    assert_eq!(files[3]["is_directory"], true);

    let d = ok("/v1/file/find", json!({"path": "docs", "glob": "**/*.py"}));
    assert_eq!(
        d["files"],
        json!([agent.path("docs/sub/deep/c.py").display().to_string()])
    );
    let d = ok(
        "/v1/file/find",
        json!({"path": agent.path("docs"), "glob": "*.txt"}),
    );
    assert_eq!(d["files"], json!([file.display().to_string()]));

    ok(
        "/v1/file/write",
        json!({"file": "e.txt", "content": "a-b-a-b\n"}),
    );
    let edit = |mode: serde_json::Value| {
        ok(
            "/v1/file/str_replace_editor",
            json!({"command": "str_replace", "path": "e.txt", "old_str": "a", "new_str": "X", "replace_mode": mode}),
        )
    };
    let d = edit(json!("FIRST"));
    assert_eq!(
        (d["prev_exist"].clone(), d["path"].clone()),
        (
            json!(true),
            json!(agent.path("e.txt").display().to_string())
        )
    );
    assert!(d["output"].is_string());
    assert_eq!(
        std::fs::read_to_string(agent.path("e.txt")).unwrap(),
        "X-b-a-b\n"
    );
    edit(json!("ALL"));
    assert_eq!(
        std::fs::read_to_string(agent.path("e.txt")).unwrap(),
        "X-b-X-b\n"
    );
    let r = agent.post_json(
        "/v1/file/str_replace_editor",
        json!({"command": "str_replace", "path": "e.txt", "old_str": "b", "new_str": "y"}),
    );
    assert_eq!(r.status, 400, "ambiguous without replace_mode");
}

#[test]
fn upload_and_download_are_streamed_and_byte_exact() {
    let agent = Agent::start(&[]);
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 17)
        .map(|_| rand::random::<u8>())
        .collect();
    let dest = agent.path("up/nested/blob.bin");
    let (ctype, body) = multipart(&[
        ("path", None, dest.to_str().unwrap().as_bytes()),
        ("file", Some("blob.bin"), &data),
    ]);
    let r = agent.request(
        "POST",
        "/v1/file/upload",
        &[("Content-Type", &ctype)],
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let d = r.json()["data"].clone();
    assert_eq!(
        d,
        json!({"file_path": dest.display().to_string(), "file_size": data.len(), "success": true})
    );
    assert!(
        std::fs::read(&dest).unwrap() == data,
        "uploaded bytes differ"
    );
    assert_eq!(
        std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // No temporary files left beside it.
    assert_eq!(
        std::fs::read_dir(agent.path("up/nested")).unwrap().count(),
        1
    );

    let r = agent.request(
        "GET",
        &format!("/v1/file/download?path={}", dest.display()),
        &[],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert!(
        r.body == data,
        "downloaded bytes differ ({} vs {})",
        r.body.len(),
        data.len()
    );

    // File part before the path field, and a name with a space.
    let dest2 = agent.path("other dir/b c.bin");
    let (ctype, body) = multipart(&[
        ("file", Some("x.bin"), &data[..1000]),
        ("path", None, dest2.to_str().unwrap().as_bytes()),
    ]);
    let r = agent.request(
        "POST",
        "/v1/file/upload",
        &[("Content-Type", &ctype)],
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(std::fs::read(&dest2).unwrap(), &data[..1000]);
    let r = agent.request(
        "GET",
        "/v1/file/download?path=other%20dir%2Fb%20c.bin",
        &[],
        b"",
    );
    assert_eq!((r.status, r.body.as_slice()), (200, &data[..1000]));

    // Upload onto a directory, or without a file part, is a 400.
    let (ctype, body) = multipart(&[("path", None, b"up"), ("file", Some("x"), b"1")]);
    assert_eq!(
        agent
            .request(
                "POST",
                "/v1/file/upload",
                &[("Content-Type", &ctype)],
                &body
            )
            .status,
        400
    );
    let (ctype, body) = multipart(&[("path", None, b"up/y")]);
    assert_eq!(
        agent
            .request(
                "POST",
                "/v1/file/upload",
                &[("Content-Type", &ctype)],
                &body
            )
            .status,
        400
    );
}
