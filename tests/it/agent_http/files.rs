//! File routes, error envelopes and status codes, streamed transfers.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::agent_support::{multipart, Agent};

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
    let len = 3 * 1024 * 1024 + 17;
    let mut data: Vec<u8> = Vec::with_capacity(len);
    while data.len() < len {
        data.extend_from_slice(&sandbox_abi::random::bytes::<65536>());
    }
    data.truncate(len);
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

#[test]
fn missing_paths_say_they_do_not_exist() {
    let agent = Agent::start(&[]);
    let missing = agent.path("no/such.txt");
    let m = missing.display().to_string();
    let cases = [
        ("/v1/file/read", json!({"file": m})),
        ("/v1/file/list", json!({"path": m})),
        ("/v1/file/find", json!({"path": m, "glob": "*"})),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "view", "path": m}),
        ),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "str_replace", "path": m, "old_str": "a", "new_str": "b"}),
        ),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "insert", "path": m, "insert_line": 0, "new_str": "b"}),
        ),
    ];
    for (route, body) in cases {
        let r = agent.post_json(route, body.clone());
        let v = r.json();
        assert_eq!(r.status, 404, "{route} {body}: {v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{m} does not exist")),
            "{route} {body}: {message:?}"
        );
    }
    let r = agent.request("GET", &format!("/v1/file/download?path={m}"), &[], b"");
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert_eq!(r.status, 404, "{message}");
    assert!(
        message.contains(&format!("{m} does not exist")),
        "{message:?}"
    );
}

/// One request on a fresh connection; the status code and (up to 64 KiB
/// of) the body, or `None` when no response head arrives within `wait`.
fn bounded_request(
    agent: &Agent,
    method: &str,
    target: &str,
    body: &[u8],
    wait: Duration,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let deadline = Instant::now() + wait;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while raw.len() < 64 * 1024 && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// A sandbox can plant a FIFO or a symlink to a device where the platform
/// expects a file: every file endpoint refuses it at once (400) instead of
/// blocking in `open` or streaming forever. Run under a 1 GiB address-space
/// limit so an agent that reads `/dev/zero` whole fails instead of eating
/// the host's memory.
#[test]
fn special_files_are_refused_not_streamed() {
    let agent = Agent::start_wrapped(&["prlimit", "--as=1073741824"], &[]);
    nix::unistd::mkfifo(
        &agent.path("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", agent.path("out.csv")).unwrap();
    let wait = Duration::from_secs(5);
    for name in ["pipe", "out.csv"] {
        let p = agent.path(name).display().to_string();
        let posts = [
            ("/v1/file/read", json!({"file": p})),
            ("/v1/file/write", json!({"file": p, "content": "x"})),
            (
                "/v1/file/str_replace_editor",
                json!({"command": "view", "path": p}),
            ),
            (
                "/v1/file/str_replace_editor",
                json!({"command": "str_replace", "path": p, "old_str": "a", "new_str": "b"}),
            ),
        ];
        for (route, body) in posts {
            let started = Instant::now();
            let got = bounded_request(&agent, "POST", route, body.to_string().as_bytes(), wait);
            let (status, text) =
                got.unwrap_or_else(|| panic!("{route} {name}: no answer within {wait:?}"));
            assert_eq!(status, 400, "{route} {name}: {text}");
            assert!(
                text.contains("is not a regular file"),
                "{route} {name}: {text}"
            );
            assert!(started.elapsed() < wait);
        }
        let got = bounded_request(
            &agent,
            "GET",
            &format!("/v1/file/download?path={p}"),
            b"",
            wait,
        );
        let (status, text) =
            got.unwrap_or_else(|| panic!("download {name}: no answer within {wait:?}"));
        assert_eq!(
            status,
            400,
            "download {name}: {}",
            &text[..text.len().min(200)]
        );
        assert!(
            text.contains("is not a regular file"),
            "download {name}: {text}"
        );
    }
    // The agent is still fine, and regular files (procfs included) still work.
    std::fs::write(agent.path("ok.txt"), "fine\n").unwrap();
    let r = agent.post_json("/v1/file/read", json!({"file": "ok.txt"}));
    assert_eq!(r.status, 200);
    let r = agent.request("GET", "/v1/file/download?path=/proc/self/status", &[], b"");
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("Pid:"));
}
