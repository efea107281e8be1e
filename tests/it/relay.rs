//! The proxy's fast path (`src/api/relay.rs`) end to end: the real daemon
//! (memory backend) in front of a scripted raw HTTP upstream that answers
//! with exactly the bytes a test wants, and raw client connections, so
//! framing, hand-over to hyper, pipelining and refusals are seen on the
//! wire.

use crate::common::{create_body, Daemon, TOKEN};

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The raw response the scripted upstream sends for a path ending in
/// `name`, and whether it then closes the connection.
fn script(name: &str) -> (&'static [u8], bool) {
    match name {
        "length" => (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nx-secret: 1\r\n\r\nhello",
            false,
        ),
        "until-close" => (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello until close",
            true,
        ),
        "chunked" => (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-trailer\r\n\r\n\
              5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n",
            false,
        ),
        "early-hints" => (
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n\
              HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        "no-content" => (b"HTTP/1.1 204 No Content\r\n\r\n", false),
        "not-modified" => (
            b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\ncontent-length: 99\r\n\r\n",
            false,
        ),
        "conflicting-length" => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nokk",
            false,
        ),
        "garbage" => (b"HTTP/9 20O OK\r\n\r\n", true),
        "upgrade" => (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            false,
        ),
        "bad-chunk" => (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
            true,
        ),
        "short" => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
            true,
        ),
        "close" => (
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
            true,
        ),
        _ => (b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", false),
    }
}

/// Starts the scripted upstream. Each request's path and the number of the
/// connection it came on are sent to the returned channel. Connections
/// that served a `/drop-idle` request are closed 100 ms after it, as a
/// server with a short keep-alive timeout does.
async fn scripted() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(usize, String)>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for conn in 0.. {
            let (mut s, _) = l.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some((path, n)) = read_request(&mut s, &mut buf).await else {
                        return;
                    };
                    buf.drain(..n);
                    let _ = tx.send((conn, path.clone()));
                    let name = path.rsplit('/').next().unwrap().to_string();
                    if name == "hang" {
                        // Never answers; reports when the daemon closes
                        // the connection.
                        let mut rest = [0u8; 1024];
                        while matches!(s.read(&mut rest).await, Ok(n) if n > 0) {}
                        let _ = tx.send((conn, "closed".to_string()));
                        return;
                    }
                    if name == "drop-idle" {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return;
                    }
                    let (resp, close) = script(&name);
                    if s.write_all(resp).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// Reads one request (head and `content-length` body) from `s` into
/// `buf`; its path and length, or `None` at the end of the stream.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, usize)> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(n) = req.parse(buf).expect("a valid forwarded request") {
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| std::str::from_utf8(h.value).unwrap().to_string())
            };
            let path = req.path.unwrap().to_string();
            if header("transfer-encoding").as_deref() == Some("chunked") {
                // Test uploads carry no trailers.
                if let Some(i) = buf[n..].windows(5).position(|w| w == b"0\r\n\r\n") {
                    return Some((path, n + i + 5));
                }
            } else {
                let len: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
                if buf.len() >= n + len {
                    return Some((path, n + len));
                }
            }
        }
        let mut more = [0u8; 4096];
        match s.read(&mut more).await {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&more[..k]),
        }
    }
}

/// A response as the client saw it.
#[derive(Debug)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// A chunked body's trailer section, as sent.
    trailers: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads more of a response into `buf`; `false` at the end of the stream.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut more = [0u8; 4096];
    let k = tokio::time::timeout(Duration::from_secs(10), s.read(&mut more))
        .await
        .expect("no answer within 10 s")
        .unwrap_or(0);
    buf.extend_from_slice(&more[..k]);
    k > 0
}

/// Reads one response from a client connection, strictly framed (a
/// framing error fails the test); `None` when the daemon closed the
/// connection before a whole response.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>, head: bool) -> Option<Seen> {
    let (status, headers, n) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut hs);
        if let httparse::Status::Complete(n) = resp.parse(buf).expect("a valid response head") {
            let headers: Vec<(String, String)> = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8(h.value.to_vec()).unwrap(),
                    )
                })
                .collect();
            break (resp.code.unwrap(), headers, n);
        }
        if !fill(s, buf).await {
            return None;
        }
    };
    buf.drain(..n);
    let mut seen = Seen {
        status,
        headers,
        body: Vec::new(),
        trailers: Vec::new(),
    };
    let te = seen.header("transfer-encoding").map(str::to_string);
    let cl = seen
        .header("content-length")
        .map(|v| v.parse::<usize>().unwrap());
    if head || status == 204 || status == 304 {
        return Some(seen);
    }
    if te.as_deref() == Some("chunked") {
        assert!(cl.is_none(), "both framings: {seen:?}");
        loop {
            let eol = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                if !fill(s, buf).await {
                    return None;
                }
            };
            let size = usize::from_str_radix(std::str::from_utf8(&buf[..eol]).unwrap(), 16)
                .expect("a bare hex chunk size");
            buf.drain(..eol + 2);
            if size == 0 {
                while !buf.starts_with(b"\r\n") {
                    match buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        Some(i) => {
                            seen.trailers = buf[..i + 2].to_vec();
                            buf.drain(..i + 2);
                        }
                        None if !fill(s, buf).await => return None,
                        None => {}
                    }
                }
                buf.drain(..2);
                return Some(seen);
            }
            while buf.len() < size + 2 {
                if !fill(s, buf).await {
                    return None;
                }
            }
            assert_eq!(&buf[size..size + 2], b"\r\n");
            seen.body.extend(buf.drain(..size));
            buf.drain(..2);
        }
    }
    let Some(cl) = cl else {
        panic!("a response not framed by length or chunks: {seen:?}");
    };
    while buf.len() < cl {
        if !fill(s, buf).await {
            return None;
        }
    }
    seen.body = buf.drain(..cl).collect();
    Some(seen)
}

/// Sends one proxied request on a kept client connection and reads its
/// response (which must come, well framed).
async fn exchange(
    (c, buf, relay): &mut (&mut TcpStream, &mut Vec<u8>, &str),
    name: &str,
    method: &str,
) -> Seen {
    let req = get(&format!("/api/sandboxes/rl/proxy/{name}"), "").replacen("GET", method, 1);
    c.write_all(req.as_bytes()).await.unwrap();
    read_response(c, buf, method == "HEAD")
        .await
        .unwrap_or_else(|| panic!("relay={relay} {method} {name}: connection closed"))
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n{extra}\r\n")
}

async fn daemon(
    env: &[(&str, &str)],
) -> (
    Daemon,
    tokio::sync::mpsc::UnboundedReceiver<(usize, String)>,
) {
    let (up, rx) = scripted().await;
    let template = format!("http://{up}/{{sandbox_id}}");
    let mut all = vec![("MEMORY_SANDBOX_URL_TEMPLATE", template.as_str())];
    all.extend_from_slice(env);
    let d = Daemon::start_memory(&all);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("rl", "t", "u")))
        .await;
    assert_eq!(s, 200, "{v}");
    (d, rx)
}

async fn metric(d: &Daemon, path: &str) -> u64 {
    let (_, _, b) = d.call("GET", "/metrics", None, None).await;
    let text = String::from_utf8(b.to_vec()).unwrap();
    let key = format!("sandboxd_proxy_requests_total{{path=\"{path}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .unwrap_or_else(|| panic!("{key} missing from /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Every framing a sandbox may use reaches the client as a well-framed
/// response on a connection that stays usable; responses the relay cannot
/// frame are 502s, never passed on.
#[tokio::test]
async fn every_response_framing_reaches_the_client_well_framed() {
    for relay in ["true", "false"] {
        let (d, _rx) = daemon(&[("SANDBOXD_PROXY_RELAY", relay)]).await;
        let mut c = TcpStream::connect(d.addr).await.unwrap();
        let mut buf = Vec::new();
        let mut conn = (&mut c, &mut buf, relay);
        let r = exchange(&mut conn, "length", "GET").await;
        assert_eq!(
            (r.status, &r.body[..]),
            (200, &b"hello"[..]),
            "relay={relay}"
        );
        assert_eq!(r.header("content-type"), Some("text/plain"));
        assert!(r.header("x-secret").is_none(), "not allowed: {r:?}");
        assert!(r.header("date").is_some(), "relay={relay}: no date: {r:?}");
        let r = exchange(&mut conn, "length", "HEAD").await;
        assert_eq!((r.status, r.header("content-length")), (200, Some("5")));
        let r = exchange(&mut conn, "chunked", "GET").await;
        assert_eq!(
            (r.status, &r.body[..]),
            (200, &b"hello world"[..]),
            "relay={relay}"
        );
        assert!(
            r.trailers.is_empty(),
            "relay={relay}: trailers passed on: {r:?}"
        );
        let r = exchange(&mut conn, "early-hints", "GET").await;
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]), "relay={relay}");
        let r = exchange(&mut conn, "no-content", "GET").await;
        assert_eq!(r.status, 204);
        let r = exchange(&mut conn, "not-modified", "GET").await;
        assert_eq!((r.status, r.header("etag")), (304, Some("\"v1\"")));
        for bad in ["conflicting-length", "garbage", "upgrade"] {
            let r = exchange(&mut conn, bad, "GET").await;
            assert_eq!(r.status, 502, "relay={relay} {bad}: {r:?}");
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert!(
                v["detail"].as_str().unwrap().contains("unreachable"),
                "{bad}: {v}"
            );
        }
        // A close-delimited body comes re-chunked; the client connection
        // stays open.
        let r = exchange(&mut conn, "until-close", "GET").await;
        assert_eq!(
            (r.status, &r.body[..]),
            (200, &b"hello until close"[..]),
            "relay={relay}"
        );
        let r = exchange(&mut conn, "close", "GET").await;
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
        assert!(r.header("connection").is_none(), "{r:?}");
        let r = exchange(&mut conn, "length", "GET").await;
        assert_eq!(r.status, 200);
        // A body cut or broken after the head: the client sees it cut (the
        // connection closes mid-response), never a clean end.
        for cut in ["short", "bad-chunk"] {
            let mut c = TcpStream::connect(d.addr).await.unwrap();
            let req = get(&format!("/api/sandboxes/rl/proxy/{cut}"), "");
            c.write_all(req.as_bytes()).await.unwrap();
            let mut b = Vec::new();
            assert!(
                read_response(&mut c, &mut b, false).await.is_none(),
                "relay={relay} {cut}: a cut body looked whole"
            );
        }
        let served = metric(&d, if relay == "true" { "relay" } else { "hyper" }).await;
        let other = metric(&d, if relay == "true" { "hyper" } else { "relay" }).await;
        assert_eq!((served, other), (14, 0), "relay={relay}");
    }
}

/// A request the relay does not serve hands the connection to hyper
/// before a byte of it is consumed: pipelined requests of every kind on
/// one connection are each answered, in order.
#[tokio::test]
async fn pipelined_requests_of_any_kind_are_answered_in_order() {
    let (d, mut rx) = daemon(&[]).await;
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let chunked_upload = format!(
        "POST /api/sandboxes/rl/proxy/length HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\
         transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    );
    let all = [
        get("/api/sandboxes/rl/proxy/length", ""),
        get("/api/sandboxes/rl/proxy/chunked", ""),
        chunked_upload,
        get("/api/sandboxes", ""),
        get("/api/sandboxes/rl/proxy/length", ""),
        get("/health", "connection: close\r\n"),
    ]
    .concat();
    c.write_all(all.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut statuses = Vec::new();
    let mut bodies = Vec::new();
    while let Some(r) = read_response(&mut c, &mut buf, false).await {
        statuses.push(r.status);
        bodies.push(String::from_utf8(r.body).unwrap());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200], "{bodies:?}");
    assert_eq!(bodies[0], "hello");
    assert_eq!(bodies[1], "hello world");
    assert_eq!(bodies[2], "hello");
    assert!(bodies[3].contains("\"count\":1"), "{}", bodies[3]);
    assert!(bodies[5].contains("\"status\":\"ok\""), "{}", bodies[5]);
    let mut paths = Vec::new();
    while let Ok((_, p)) = rx.try_recv() {
        paths.push(p);
    }
    assert_eq!(
        paths,
        ["/rl/length", "/rl/chunked", "/rl/length", "/rl/length"]
    );
    // The first two went through the relay, the rest through hyper.
    assert_eq!(
        (metric(&d, "relay").await, metric(&d, "hyper").await),
        (2, 2)
    );
}

/// Smuggling: a request whose framing is ambiguous is not served by the
/// relay; hyper refuses it, and the sandbox never sees a request hidden
/// in its body.
#[tokio::test]
async fn ambiguous_request_framing_is_refused() {
    let (d, mut rx) = daemon(&[]).await;
    let hidden = get("/rl/length?hidden", "");
    for framing in [
        "content-length: 4\r\ncontent-length: 40\r\n".to_string(),
        "content-length: 4, 40\r\n".to_string(),
        "content-length: +4\r\n".to_string(),
        format!(
            "content-length: {}\r\ntransfer-encoding: identity\r\n",
            hidden.len()
        ),
    ] {
        let mut c = TcpStream::connect(d.addr).await.unwrap();
        let req = format!(
            "POST /api/sandboxes/rl/proxy/length HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n{framing}\r\n{hidden}"
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut c, &mut buf, false).await;
        let status = r.as_ref().map(|r| r.status);
        assert!(
            matches!(status, Some(400 | 501) | None),
            "{framing:?}: {r:?}"
        );
        // Nothing more on that connection.
        assert!(
            read_response(&mut c, &mut buf, false).await.is_none(),
            "{framing:?}: the connection went on"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut paths = Vec::new();
    while let Ok((_, p)) = rx.try_recv() {
        paths.push(p);
    }
    assert!(paths.is_empty(), "the sandbox saw {paths:?}");
}

/// Kept upstream connections the sandbox closed meanwhile (a keep-alive
/// timeout shorter than the client's pause) are never used again: the next
/// request opens a new one and succeeds.
#[tokio::test]
async fn upstream_connections_closed_while_idle_are_not_reused() {
    let (d, mut rx) = daemon(&[]).await;
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..3 {
        c.write_all(get("/api/sandboxes/rl/proxy/drop-idle", "").as_bytes())
            .await
            .unwrap();
        let r = read_response(&mut c, &mut buf, false).await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Then a connection that stays open is kept.
    for _ in 0..3 {
        c.write_all(get("/api/sandboxes/rl/proxy/length", "").as_bytes())
            .await
            .unwrap();
        let r = read_response(&mut c, &mut buf, false).await.unwrap();
        assert_eq!(r.status, 200);
    }
    let mut conns = Vec::new();
    while let Ok((conn, _)) = rx.try_recv() {
        conns.push(conn);
    }
    assert_eq!(conns.len(), 6);
    assert_eq!(&conns[..3], &[conns[0], conns[0] + 1, conns[0] + 2]);
    assert_eq!(conns[3..], [conns[3]; 3], "{conns:?}");
}

/// The head timeout runs from each request, also on a connection whose
/// earlier requests armed the timer long ago (the relay moves its
/// deadlines lazily): a sandbox that never answers gets a 504 after the
/// timeout, not before, and the connection goes on.
#[tokio::test]
async fn the_head_timeout_counts_from_each_request() {
    let (d, _rx) = daemon(&[("SANDBOXD_PROXY_HEAD_TIMEOUT_SECONDS", "1")]).await;
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    let mut conn = (&mut c, &mut buf, "true");
    for _ in 0..2 {
        assert_eq!(exchange(&mut conn, "length", "GET").await.status, 200);
    }
    // The timer armed by those requests has long passed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = std::time::Instant::now();
    let r = exchange(&mut conn, "hang", "GET").await;
    let waited = started.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "answered after {waited:?}"
    );
    assert_eq!(exchange(&mut conn, "length", "GET").await.status, 200);
    assert_eq!(metric(&d, "relay").await, 4);
}

/// A client that goes away (or half-closes, which hyper's server takes the
/// same way) while the sandbox has not answered abandons the request: the
/// daemon closes the sandbox's connection at once, on both paths.
#[tokio::test]
async fn a_client_that_goes_away_abandons_its_request() {
    for relay in ["true", "false"] {
        let (d, mut rx) = daemon(&[("SANDBOXD_PROXY_RELAY", relay)]).await;
        for half_close in [false, true] {
            let mut c = TcpStream::connect(d.addr).await.unwrap();
            c.write_all(get("/api/sandboxes/rl/proxy/hang", "").as_bytes())
                .await
                .unwrap();
            let (conn, path) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the request reached the sandbox")
                .unwrap();
            assert_eq!(path, "/rl/hang");
            if half_close {
                c.shutdown().await.unwrap();
                let mut rest = Vec::new();
                let n = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest))
                    .await
                    .expect("the daemon closed the connection")
                    .unwrap_or(0);
                assert_eq!(n, 0, "relay={relay}: {:?}", String::from_utf8_lossy(&rest));
            } else {
                drop(c);
            }
            let closed = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("relay={relay} half_close={half_close}: the sandbox's connection stayed open")
                })
                .unwrap();
            assert_eq!(closed, (conn, "closed".to_string()));
        }
        // Nothing stays pinned: the delete does not wait.
        let started = std::time::Instant::now();
        let (s, _) = d.json("DELETE", "/api/sandboxes/rl", None).await;
        assert_eq!(s, 200);
        assert!(started.elapsed() < Duration::from_secs(5), "relay={relay}");
    }
}

/// The relay serves the Unix socket listener too: proxied requests on a
/// kept connection, then a hand-off to hyper for another route.
#[tokio::test]
async fn the_unix_socket_is_served_by_the_relay_too() {
    let (up, _rx) = scripted().await;
    let template = format!("http://{up}/{{sandbox_id}}");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let d = Daemon::start(
        &[
            ("PROVISIONER_BACKEND", "memory"),
            ("MEMORY_SANDBOX_URL_TEMPLATE", template.as_str()),
        ],
        &["--unix-socket", sock.to_str().unwrap()],
    );
    assert!(d.wait_log("unix:", Duration::from_secs(5)));
    let (s, _) = d
        .json("POST", "/api/sandboxes", Some(create_body("rl", "t", "u")))
        .await;
    assert_eq!(s, 200);
    let mut c = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let all = [
        get("/api/sandboxes/rl/proxy/length", ""),
        get("/api/sandboxes/rl/proxy/chunked", ""),
        get("/api/sandboxes", "connection: close\r\n"),
    ]
    .concat();
    c.write_all(all.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
        .await
        .expect("answers within 10 s")
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{text}");
    assert!(text.contains("\r\n\r\nhello"), "{text}");
    assert!(
        text.contains("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
        "{text}"
    );
    assert!(text.contains("\"count\":1"), "{text}");
    assert_eq!(metric(&d, "relay").await, 2);
}

/// An upstream connection the sandbox closed while it was kept (deleted,
/// or a short keep-alive) is let go at the next response on that client
/// connection, not held until the client leaves.
#[tokio::test]
async fn kept_connections_closed_by_the_sandbox_are_let_go() {
    let (d, _rx) = daemon(&[]).await;
    let (s, _) = d
        .json("POST", "/api/sandboxes", Some(create_body("rl2", "t", "u")))
        .await;
    assert_eq!(s, 200);
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .unwrap()
            .count()
    };
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    let mut ask = async |path: &str| {
        c.write_all(get(path, "").as_bytes()).await.unwrap();
        let r = read_response(&mut c, &mut buf, false).await.unwrap();
        assert_eq!(r.status, 200);
    };
    ask("/api/sandboxes/rl2/proxy/length").await;
    // Kept: the connection to rl2; then one to rl that its server closes
    // 100 ms after answering.
    ask("/api/sandboxes/rl/proxy/drop-idle").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = fds();
    // Reuses the connection to rl2 (no new fd) and lets the closed one go.
    ask("/api/sandboxes/rl2/proxy/length").await;
    // (The relay tidies up just after the response is written.)
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fds() != before - 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fds(), before - 1, "the closed upstream connection was kept");
}

/// The relay serves connections on `SANDBOXD_WORKER_THREADS` connection
/// workers (threads `sandboxd-conn-N`), each with its own pool of idle
/// upstream connections; a connection reuses the one a closed connection
/// parked, whichever worker each was served by.
#[tokio::test]
async fn parked_upstream_connections_are_reused_across_connection_workers() {
    let (d, mut rx) = daemon(&[("SANDBOXD_WORKER_THREADS", "2")]).await;
    let mut workers: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", d.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("sandboxd-conn-"))
        .collect();
    workers.sort();
    assert_eq!(workers, ["sandboxd-conn-0", "sandboxd-conn-1"]);
    while rx.try_recv().is_ok() {}
    // Each step waits for the daemon to take the connection or see it
    // closed.
    let settle = || tokio::time::sleep(Duration::from_millis(200));
    let open = async || {
        let c = TcpStream::connect(d.addr).await.unwrap();
        settle().await;
        c
    };
    let ask = async |c: &mut TcpStream| {
        let mut buf = Vec::new();
        c.write_all(get("/api/sandboxes/rl/proxy/length", "").as_bytes())
            .await
            .unwrap();
        let r = read_response(c, &mut buf, false).await.unwrap();
        assert_eq!(r.status, 200);
    };
    // a and b on one worker each; a's upstream connection parked on a's.
    let mut a = open().await;
    let b = open().await;
    ask(&mut a).await;
    drop(a);
    settle().await;
    // The next one goes to a's worker, so once b is gone the one after
    // goes to b's: it takes the connection parked on the other worker.
    let _c = open().await;
    drop(b);
    settle().await;
    let mut e = open().await;
    ask(&mut e).await;
    let mut seen = Vec::new();
    while let Ok((conn, path)) = rx.try_recv() {
        seen.push((conn, path));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0].0, seen[1].0,
        "one upstream connection for both: {seen:?}"
    );
}

/// At a SIGTERM every connection worker closes its idle keep-alive
/// connections (each watches its own copy of the drain signal) and the
/// daemon exits.
#[tokio::test]
async fn idle_connections_on_every_worker_close_at_shutdown() {
    let (mut d, _rx) = daemon(&[("SANDBOXD_WORKER_THREADS", "2")]).await;
    let mut conns = Vec::new();
    // Two connections open at once: one on each worker.
    for _ in 0..2 {
        let mut c = TcpStream::connect(d.addr).await.unwrap();
        let mut buf = Vec::new();
        c.write_all(get("/api/sandboxes/rl/proxy/length", "").as_bytes())
            .await
            .unwrap();
        let r = read_response(&mut c, &mut buf, false).await.unwrap();
        assert_eq!(r.status, 200);
        conns.push(c);
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    for mut c in conns {
        let mut b = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
            .await
            .expect("an idle connection left open after the SIGTERM")
            .unwrap();
        assert_eq!(n, 0, "closed without a response");
    }
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
