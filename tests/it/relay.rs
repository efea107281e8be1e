//! The proxy's one forwarding path (hyper on the connection workers,
//! `src/api/proxy.rs`) end to end, on the wire: the real daemon (memory
//! backend) in front of a scripted raw HTTP upstream that answers with
//! exactly the bytes a test wants, and raw client connections, so framing,
//! pipelining, streaming, upgrades and refusals are seen byte for byte.
//! (The file keeps the name of the hand-written relay these tests were
//! written for; they hold for the path that replaced it.)

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
        "bad-chunk-first" => (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n",
            true,
        ),
        "long" => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nforged",
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
                    let Some(req) = read_request(&mut s, &mut buf, conn, &tx).await else {
                        return;
                    };
                    buf.drain(..req.len);
                    let path = req.path.clone();
                    let _ = tx.send((conn, path.clone()));
                    let name = path.rsplit('/').next().unwrap().to_string();
                    if name == "ws" {
                        // Switches when asked to, then echoes what comes
                        // back in upper case until the daemon closes.
                        let asked = req.header("upgrade").is_some()
                            && req
                                .header("connection")
                                .is_some_and(|v| v.eq_ignore_ascii_case("upgrade"));
                        let _ = tx.send((conn, format!("upgrade asked: {asked}")));
                        let _ = s
                            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: abc=\r\nset-cookie: a=1\r\n\r\n")
                            .await;
                        let mut b = buf.clone();
                        loop {
                            if !b.is_empty() {
                                b.make_ascii_uppercase();
                                if s.write_all(&b).await.is_err() {
                                    break;
                                }
                                b.clear();
                            }
                            let mut more = [0u8; 4096];
                            match s.read(&mut more).await {
                                Ok(0) | Err(_) => break,
                                Ok(k) => b.extend_from_slice(&more[..k]),
                            }
                        }
                        let _ = tx.send((conn, "closed".to_string()));
                        return;
                    }
                    if name == "echo" {
                        // The request body back, in chunks of 64 KiB.
                        let mut out =
                            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                        for c in req.body.chunks(64 * 1024) {
                            out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                            out.extend_from_slice(c);
                            out.extend_from_slice(b"\r\n");
                        }
                        out.extend_from_slice(b"0\r\n\r\n");
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    if name == "stream" {
                        // A first chunk, then the rest once the test saw
                        // it arrive at the client.
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                            .await;
                        go().notified().await;
                        let _ = s.write_all(b"4\r\nrest\r\n0\r\n\r\n").await;
                        continue;
                    }
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
                        drop(s);
                        let _ = tx.send((conn, "dropped".to_string()));
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

/// What the scripted upstream's `stream` response waits for before its
/// second chunk.
fn go() -> &'static tokio::sync::Notify {
    static GO: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();
    GO.get_or_init(tokio::sync::Notify::new)
}

/// A request as the scripted upstream read it.
struct Req {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Bytes it took in the buffer.
    len: usize,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Decodes a chunked body at the start of `b` (no trailers, as the daemon
/// forwards it): the data and the bytes it took, `None` while incomplete.
fn dechunk(mut b: &[u8]) -> Option<(Vec<u8>, usize)> {
    let all = b.len();
    let mut data = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap(), 16)
            .expect("a bare hex chunk size from the daemon");
        b = &b[eol + 2..];
        if size == 0 {
            if !b.starts_with(b"\r\n") {
                assert!(
                    b.len() < 2,
                    "trailers forwarded: {:?}",
                    String::from_utf8_lossy(b)
                );
                return None;
            }
            return Some((data, all - b.len() + 2));
        }
        if b.len() < size + 2 {
            return None;
        }
        assert_eq!(&b[size..size + 2], b"\r\n");
        data.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Reads one request (head and body, framed by length or chunks) from `s`
/// into `buf`, or `None` at the end of the stream. A chunked body whose
/// part so far contains `first` is reported as `first-chunk` on `tx` (once,
/// before the rest of it came).
async fn read_request(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    conn: usize,
    tx: &tokio::sync::mpsc::UnboundedSender<(usize, String)>,
) -> Option<Req> {
    let mut reported = false;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(n) = req.parse(buf).expect("a valid forwarded request") {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8(h.value.to_vec()).unwrap(),
                    )
                })
                .collect();
            let mut r = Req {
                path: req.path.unwrap().to_string(),
                headers,
                body: Vec::new(),
                len: 0,
            };
            if r.header("transfer-encoding") == Some("chunked") {
                assert!(
                    r.header("content-length").is_none(),
                    "both framings forwarded"
                );
                if let Some((body, k)) = dechunk(&buf[n..]) {
                    r.body = body;
                    r.len = n + k;
                    return Some(r);
                }
                if !reported && buf[n..].windows(5).any(|w| w == b"first") {
                    reported = true;
                    let _ = tx.send((conn, "first-chunk".to_string()));
                }
            } else {
                let len: usize = r.header("content-length").map_or(0, |v| v.parse().unwrap());
                if buf.len() >= n + len {
                    r.body = buf[n..n + len].to_vec();
                    r.len = n + len;
                    return Some(r);
                }
            }
        }
        let mut more = [0u8; 64 * 1024];
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
/// response on a connection that stays usable; responses the proxy cannot
/// frame are 502s, never passed on, also when the body breaks in what came
/// with the head (issue #32 §3: a 502 before the head, not a closed
/// connection).
#[tokio::test]
async fn every_response_framing_reaches_the_client_well_framed() {
    {
        let relay = "hyper";
        let (d, _rx) = daemon(&[]).await;
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
        for bad in [
            "conflicting-length",
            "garbage",
            "upgrade",
            "bad-chunk-first",
        ] {
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
        assert_eq!(metric(&d, "hyper").await, 15);
    }
}

/// Pipelined requests of every kind on one connection (proxied, chunked
/// uploads, the control API) are each answered, in order.
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
    assert_eq!(metric(&d, "hyper").await, 4);
}

/// Smuggling: a request whose framing is ambiguous is refused, and the
/// sandbox never sees a request hidden in its body.
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
    while let Ok((conn, p)) = rx.try_recv() {
        if p != "dropped" {
            conns.push(conn);
        }
    }
    assert_eq!(conns.len(), 6);
    assert_eq!(&conns[..3], &[conns[0], conns[0] + 1, conns[0] + 2]);
    assert_eq!(conns[3..], [conns[3]; 3], "{conns:?}");
}

/// The head timeout runs from each request, also on a connection whose
/// earlier requests ran long ago: a sandbox that never answers gets a 504 after the
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
    assert_eq!(metric(&d, "hyper").await, 4);
}

/// A client that goes away (or half-closes, which hyper's server takes the
/// same way) while the sandbox has not answered abandons the request: the
/// daemon closes the sandbox's connection at once.
#[tokio::test]
async fn a_client_that_goes_away_abandons_its_request() {
    {
        let relay = "hyper";
        let (d, mut rx) = daemon(&[]).await;
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

/// The Unix socket listener is served the same way: proxied requests on a
/// kept connection, then another route.
#[tokio::test]
async fn the_unix_socket_is_served_the_same_way() {
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
    assert_eq!(metric(&d, "hyper").await, 2);
}

/// An upstream connection the sandbox closed while it was kept (deleted,
/// or a short keep-alive) is let go when it closes, not held until the
/// client leaves.
#[tokio::test]
async fn kept_connections_closed_by_the_sandbox_are_let_go() {
    let (d, mut rx) = daemon(&[]).await;
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
    let before = fds();
    ask("/api/sandboxes/rl/proxy/drop-idle").await;
    // Until the sandbox closed it.
    while tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the sandbox closes its connection")
        .unwrap()
        .1
        != "dropped"
    {}
    // The daemon lets it go without another request.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fds() != before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fds(), before, "the closed upstream connection was kept");
    // The one to rl2 is still kept (no new connection).
    ask("/api/sandboxes/rl2/proxy/length").await;
    assert_eq!(fds(), before);
}

/// Connections are served on `SANDBOXD_WORKER_THREADS` connection workers
/// (threads `sandboxd-conn-N`) sharing the proxy's one pool of idle
/// upstream connections: a connection reuses the one a closed connection
/// parked on its own worker, and never one parked on another worker (its
/// socket belongs to that worker's I/O driver: every response would wake
/// the other thread).
#[tokio::test]
async fn parked_upstream_connections_are_reused_on_their_own_connection_worker() {
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
    // a and b on one worker each (A and B); a's upstream connection is
    // parked on A when a closes.
    let mut a = open().await;
    let b = open().await;
    ask(&mut a).await;
    drop(a);
    settle().await;
    // c goes to A (the least busy) and takes the connection parked there.
    let mut c = open().await;
    ask(&mut c).await;
    drop(c);
    settle().await;
    // x keeps A busy; once b is gone, e goes to B: the connection parked
    // on A is not for it, it opens its own.
    let _x = open().await;
    drop(b);
    settle().await;
    let mut e = open().await;
    ask(&mut e).await;
    let mut seen = Vec::new();
    while let Ok((conn, path)) = rx.try_recv() {
        seen.push((conn, path));
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0].0, seen[1].0, "reused on its own worker: {seen:?}");
    assert_ne!(
        seen[0].0, seen[2].0,
        "a connection parked on another worker was used: {seen:?}"
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

/// Reads from `c` until `buf` holds a whole response head; returns it
/// (the rest stays in `buf`).
async fn read_head(c: &mut TcpStream, buf: &mut Vec<u8>) -> String {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf.drain(..i + 4).collect()).unwrap();
            return head;
        }
        assert!(fill(c, buf).await, "closed before a head: {buf:?}");
    }
}

/// An HTTP Upgrade (a WebSocket handshake) passes the proxy: the sandbox
/// is asked for the upgrade, its `101` reaches the client with the
/// headers the switch needs (and not the ones the allow-list keeps out),
/// then bytes go both ways; a delete of the sandbox cuts the upgraded
/// connection once its grace is over, and the delete goes through.
#[tokio::test]
async fn an_upgrade_passes_the_proxy_and_a_delete_cuts_it() {
    let (d, mut rx) = daemon(&[("SANDBOXD_DELETE_GRACE_SECONDS", "1")]).await;
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let req = get(
        "/api/sandboxes/rl/proxy/ws",
        "upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZQ==\r\nsec-websocket-version: 13\r\n",
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut c, &mut buf).await.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert!(head.contains("upgrade: websocket\r\n"), "{head}");
    assert!(head.contains("connection: upgrade\r\n"), "{head}");
    assert!(head.contains("sec-websocket-accept: abc=\r\n"), "{head}");
    assert!(!head.contains("set-cookie"), "{head}");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(rx.recv().await.unwrap().1);
    }
    assert_eq!(seen, ["/rl/ws", "upgrade asked: true"]);
    // Both ways, several times, on the switched connection.
    for msg in ["ping", "hello over the upgrade", "x"] {
        c.write_all(msg.as_bytes()).await.unwrap();
        while buf.len() < msg.len() {
            assert!(fill(&mut c, &mut buf).await, "closed mid-echo");
        }
        assert_eq!(
            String::from_utf8(buf.drain(..msg.len()).collect()).unwrap(),
            msg.to_uppercase()
        );
    }
    // A delete waits for the upgraded connection (a pinned request) for
    // its grace, then cuts it: both sides see the end.
    let (s, v) = d.json("DELETE", "/api/sandboxes/rl", None).await;
    assert_eq!(s, 200, "{v}");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest))
        .await
        .expect("the upgraded connection was closed")
        .unwrap_or(0);
    assert_eq!(n, 0, "{rest:?}");
    let closed = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the sandbox's side was closed")
        .unwrap();
    assert_eq!(closed.1, "closed");
}

/// An upgrade a client asks for that the sandbox refuses is an ordinary
/// response; and the upgraded connection ends when the client closes it.
#[tokio::test]
async fn a_refused_upgrade_is_an_ordinary_response_and_the_client_may_end_one() {
    let (d, mut rx) = daemon(&[("SANDBOXD_DELETE_GRACE_SECONDS", "60")]).await;
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    c.write_all(
        get(
            "/api/sandboxes/rl/proxy/length",
            "upgrade: websocket\r\nconnection: upgrade\r\n",
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let r = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
    // The client connection goes on.
    c.write_all(get("/api/sandboxes/rl/proxy/length", "").as_bytes())
        .await
        .unwrap();
    let r = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!(r.status, 200);
    while rx.try_recv().is_ok() {}
    // An upgraded connection the client closes is closed on the sandbox's
    // side too.
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    c.write_all(
        get(
            "/api/sandboxes/rl/proxy/ws",
            "upgrade: websocket\r\nconnection: upgrade\r\n",
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut c, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    drop(c);
    loop {
        let (_, m) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the sandbox's side was closed")
            .unwrap();
        if m == "closed" {
            break;
        }
    }
    // Nothing stays pinned: the delete does not wait for its grace (60 s).
    let started = std::time::Instant::now();
    let (s, _) = d.json("DELETE", "/api/sandboxes/rl", None).await;
    assert_eq!(s, 200);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the delete waited for a pin"
    );
}

/// Request and response bodies are streamed, not gathered: a chunked
/// upload's first chunk reaches the sandbox before the client sent the
/// rest, a response's first chunk reaches the client before the sandbox
/// sent the rest, and large bodies (8 MiB each way, chunked) pass whole.
#[tokio::test]
async fn request_and_response_bodies_are_streamed() {
    let (d, mut rx) = daemon(&[]).await;
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    // Upload: the head and a first chunk, then the rest only once the
    // sandbox reported the first.
    let head = format!(
        "POST /api/sandboxes/rl/proxy/upload-stream HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\
         transfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    loop {
        let (_, m) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the first chunk reached the sandbox on its own")
            .unwrap();
        if m == "first-chunk" {
            break;
        }
    }
    c.write_all(b"4\r\nrest\r\n0\r\n\r\n").await.unwrap();
    let r = read_response(&mut c, &mut buf, false).await.unwrap();
    assert_eq!(r.status, 404, "the script's answer to an unknown name");
    // Download: the first chunk arrives while the sandbox holds the rest.
    c.write_all(get("/api/sandboxes/rl/proxy/stream", "").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut c, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    while !buf.windows(5).any(|w| w == b"first") {
        assert!(fill(&mut c, &mut buf).await);
    }
    go().notify_one();
    while !buf.ends_with(b"0\r\n\r\n") {
        assert!(fill(&mut c, &mut buf).await);
    }
    let (body, _) = dechunk(&buf).unwrap();
    assert_eq!(body, b"firstrest");
    buf.clear();
    // 8 MiB up (chunked) and back (chunked), byte for byte.
    let big: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut up = format!(
        "POST /api/sandboxes/rl/proxy/echo HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\
         transfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for part in big.chunks(100_000) {
        up.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        up.extend_from_slice(part);
        up.extend_from_slice(b"\r\n");
    }
    up.extend_from_slice(b"0\r\n\r\n");
    let (mut rd, mut wr) = c.split();
    let send = async {
        wr.write_all(&up).await.unwrap();
    };
    let recv = async {
        let mut s = Vec::new();
        // Read until the response's last chunk.
        loop {
            let mut more = vec![0u8; 256 * 1024];
            let k = tokio::time::timeout(Duration::from_secs(30), rd.read(&mut more))
                .await
                .expect("no answer within 30 s")
                .unwrap();
            assert!(k > 0, "closed mid-response");
            s.extend_from_slice(&more[..k]);
            if let Some(i) = s.windows(4).position(|w| w == b"\r\n\r\n") {
                if let Some((body, _)) = dechunk(&s[i + 4..]) {
                    return (String::from_utf8(s[..i].to_vec()).unwrap(), body);
                }
            }
        }
    };
    let ((), (head, body)) = tokio::join!(send, recv);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(
        body == big,
        "the echoed body differs ({} bytes)",
        body.len()
    );
}

/// A client's malformed chunked body is the client's fault: a 400 (it was
/// a 502 "sandbox unreachable" before, issue #32 §3), counted as a bad
/// request and not logged as a server error.
#[tokio::test]
async fn a_malformed_chunked_request_body_is_a_400() {
    let (d, _rx) = daemon(&[]).await;
    for bad in [
        "zz\r\nhello\r\n0\r\n\r\n",
        "5\r\nhelloXX0\r\n\r\n",
        "ffffffffffffffffffff\r\n",
    ] {
        let mut c = TcpStream::connect(d.addr).await.unwrap();
        let req = format!(
            "POST /api/sandboxes/rl/proxy/malformed HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\
             transfer-encoding: chunked\r\n\r\n{bad}"
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut c, &mut buf, false)
            .await
            .unwrap_or_else(|| panic!("{bad:?}: closed without a response"));
        assert_eq!(r.status, 400, "{bad:?}: {r:?}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(
            v["detail"].as_str().unwrap().contains("request body"),
            "{v}"
        );
    }
    // A server error after them is logged; none of them was.
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    c.write_all(get("/api/sandboxes/rl/proxy/garbage", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        read_response(&mut c, &mut buf, false).await.unwrap().status,
        502
    );
    assert!(d.wait_log("/proxy/garbage", Duration::from_secs(10)));
    assert!(
        !d.log_contains("/proxy/malformed"),
        "logged as a server error"
    );
    let (_, _, b) = d.call("GET", "/metrics", None, None).await;
    let text = String::from_utf8(b.to_vec()).unwrap();
    assert!(
        text.contains("sandboxd_errors_total{kind=\"bad_request\"} 3"),
        "{text}"
    );
}

/// The smuggling corpus of issue #31 on the wire, each case on a
/// connection of its own: what the daemon answers (every status in order,
/// then whether it closed), and what reached the sandbox. A request hidden
/// in a body never reaches it as a request; what is forwarded is re-framed
/// by the daemon (one framing, no extensions), whatever the client sent.
#[tokio::test]
async fn the_smuggling_corpus_is_refused_or_reframed() {
    let (d, mut rx) = daemon(&[]).await;
    let hidden = get("/api/sandboxes/rl/proxy/length?hidden", "");
    let head = |extra: &str| {
        format!("POST /api/sandboxes/rl/proxy/echo HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n{extra}")
    };
    let chunked_smuggle = format!("0\r\n\r\n{hidden}");
    let many: String = (0..200).map(|i| format!("x-h{i}: {i}\r\n")).collect();
    let cases: Vec<(&str, String, &[u16])> = vec![
        // CL.TE: hyper takes the chunked framing (RFC 9112 §6.1) and closes
        // the connection after the response; the hidden request is never
        // read as one.
        (
            "content-length and transfer-encoding",
            format!(
                "{}content-length: {}\r\ntransfer-encoding: chunked\r\n\r\n{chunked_smuggle}",
                head(""),
                chunked_smuggle.len()
            ),
            &[200],
        ),
        (
            "chunked, identity",
            format!(
                "{}transfer-encoding: chunked, identity\r\n\r\n{chunked_smuggle}",
                head("")
            ),
            &[400],
        ),
        (
            "obs-fold",
            format!("{}x-a: 1\r\n folded\r\ncontent-length: 0\r\n\r\n", head("")),
            &[400],
        ),
        (
            "NUL in a header",
            format!("{}x-a: a\0b\r\ncontent-length: 0\r\n\r\n", head("")),
            &[400],
        ),
        (
            "huge header count",
            format!("{}{many}content-length: 0\r\n\r\n", head("")),
            &[431],
        ),
        (
            "chunk extensions",
            format!(
                "{}transfer-encoding: chunked\r\nconnection: close\r\n\r\n5;ext=\"1\"\r\nhello\r\n0\r\n\r\n",
                head("")
            ),
            &[200],
        ),
        (
            "bare LF",
            head("content-length: 5\r\nconnection: close\r\n\r\nhello").replace("\r\n", "\n"),
            &[200],
        ),
    ];
    let mut report = Vec::new();
    for (name, raw, want) in &cases {
        let mut c = TcpStream::connect(d.addr).await.unwrap();
        c.write_all(raw.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut statuses = Vec::new();
        let mut bodies = Vec::new();
        while let Some(r) = read_response(&mut c, &mut buf, false).await {
            statuses.push(r.status);
            bodies.push(String::from_utf8_lossy(&r.body).into_owned());
        }
        report.push(format!("{name}: {statuses:?} {bodies:?}"));
        assert_eq!(&statuses[..], *want, "{name}: {bodies:?}");
        if *name == "chunk extensions" || *name == "bare LF" {
            assert_eq!(bodies, ["hello"], "{name}: forwarded as sent");
        }
    }
    // A sandbox whose response carries more than its length says: the
    // extra bytes never reach the client as a response.
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    let mut buf = Vec::new();
    let mut conn = (&mut c, &mut buf, "hyper");
    let r = exchange(&mut conn, "long", "GET").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
    let r = exchange(&mut conn, "length", "GET").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]), "{r:?}");
    // What reached the sandbox: the three served requests, the two probes,
    // nothing hidden.
    let mut paths = Vec::new();
    while let Ok((_, p)) = rx.try_recv() {
        paths.push(p);
    }
    assert_eq!(
        paths,
        ["/rl/echo", "/rl/echo", "/rl/echo", "/rl/long", "/rl/length"],
        "{report:#?}"
    );
}
