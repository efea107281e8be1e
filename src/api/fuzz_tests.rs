//! Property tests (proptest) of what a caller without a token reaches: the
//! HTTP request line and headers as hyper parses them on a served
//! connection, the bearer check, the route parser, and the id and
//! workdir validators. None may panic; without the token nothing but the
//! three open routes answers 2xx, and nothing answers 5xx.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::routes::Route;
use super::*;
use crate::backend::memory::MemoryBackend;
use crate::model::{validate_sandbox_id, validate_workdir};

const TOKEN: &str = "fuzz-token-0123456789abcdef0123456789abcdef";
/// Panics on the threads of the runtime serving the fuzzed connections.
static PANICS: AtomicUsize = AtomicUsize::new(0);
const THREAD: &str = "fuzz-conn";

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(THREAD) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info)
        }));
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(THREAD)
        .enable_all()
        .build()
        .unwrap()
}

fn state() -> Arc<AppState> {
    let backend = MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap();
    AppState::for_tests(Arc::new(backend), TOKEN)
}

/// Writes `input` to a connection the daemon serves, closes the writing
/// half when `half_close` (else the request asks for `connection: close`)
/// and reads everything the daemon answers until it closes. (hyper closes
/// a connection whose client half-closed before the response was
/// written, without answering: its default `half_close(false)`.)
async fn serve_bytes(state: &Arc<AppState>, input: &[u8], half_close: bool) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let (_drain_tx, drain) = tokio::sync::watch::channel(false);
    spawn_conn(state, &drain, server);
    client.write_all(input).await.unwrap();
    if half_close {
        client.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut out))
        .await
        .expect("the daemon neither answered nor closed within 10 s")
        .unwrap();
    out
}

/// The status codes of every response in `out`.
fn statuses(out: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(out);
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

fn open_route(path: &str) -> bool {
    ["/health", "/metrics", "/openapi.json"].contains(&path)
}

proptest! {
    // 256 cases each (`PROPTEST_CASES` sets more for a longer run).
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary bytes: no panic; the answer is nothing (closed) or
    /// HTTP/1.1 error responses, never a 5xx.
    #[test]
    fn random_bytes_on_a_connection(input in proptest::collection::vec(any::<u8>(), 0..2048)) {
        count_panics();
        let rt = runtime();
        let state = state();
        let out = rt.block_on(serve_bytes(&state, &input, true));
        drop(rt);
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0);
        if !out.is_empty() {
            prop_assert!(out.starts_with(b"HTTP/1.1 "), "not HTTP: {:?}", String::from_utf8_lossy(&out));
        }
        for s in statuses(&out) {
            prop_assert!((400..500).contains(&s) || s == 200, "status {}", s);
        }
    }

    /// Request lines and headers that hyper accepts, with random methods,
    /// paths and headers (a wrong bearer token among them): 2xx only on
    /// the open routes, never 5xx, no panic.
    #[test]
    fn requests_without_the_token(
        method in prop_oneof![
            Just("GET".to_string()), Just("POST".to_string()), Just("DELETE".to_string()),
            Just("PUT".to_string()), Just("HEAD".to_string()), "[A-Z]{1,10}",
        ],
        path in prop_oneof![
            Just("/health".to_string()), Just("/api/sandboxes".to_string()),
            Just("/api/sandboxes/quiesce".to_string()), "/api/sandboxes/[a-z0-9_./%-]{0,70}",
            "/api/sandboxes/[a-z0-9]{1,8}/(touch|logs|proxy|proxy/v1/shell/exec)",
            "/[ -~&&[^ #?]]{0,80}",
        ],
        query in proptest::option::of("[a-z_=&0-9%]{0,40}"),
        headers in proptest::collection::vec(("[A-Za-z-]{1,20}", "[ -~]{0,60}"), 0..6),
        auth in proptest::option::of(prop_oneof![
            Just("Bearer ".to_string()),
            Just(format!("bearer {TOKEN}")),
            // (Trailing white space is not a wrong token: HTTP strips it
            // from header values before the daemon sees them.)
            Just(format!("Bearer {TOKEN}x")),
            Just(format!("Bearer  {TOKEN}")),
            Just(format!("Bearer {}", &TOKEN[1..])),
            "[ -~]{0,80}",
        ]),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        count_panics();
        let mut req = format!("{method} {path}");
        if let Some(q) = &query {
            req.push('?');
            req.push_str(q);
        }
        req.push_str(" HTTP/1.1\r\nhost: x\r\n");
        for (k, v) in &headers {
            let lower = k.to_ascii_lowercase();
            if ["content-length", "transfer-encoding", "authorization", "host"].contains(&lower.as_str()) {
                continue;
            }
            req.push_str(&format!("{k}: {}\r\n", v.trim()));
        }
        if let Some(a) = &auth {
            req.push_str(&format!("authorization: {a}\r\n"));
        }
        req.push_str(&format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()));
        let mut input = req.into_bytes();
        input.extend_from_slice(&body);

        let rt = runtime();
        let state = state();
        let out = rt.block_on(serve_bytes(&state, &input, false));
        drop(rt);
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0);
        let got = statuses(&out);
        prop_assert!(!got.is_empty(), "no response to {:?}", String::from_utf8_lossy(&input));
        for s in got {
            prop_assert!(s < 500, "status {} for {} {}", s, method, path);
            if (200..300).contains(&s) {
                prop_assert!(open_route(&path) && (method == "GET"),
                    "{} {} answered {} without the token", method, path, s);
            }
        }
    }

    /// The bearer check accepts exactly `Bearer <token>`.
    #[test]
    fn the_bearer_check_accepts_only_the_exact_header(header in proptest::collection::vec(any::<u8>(), 0..100)) {
        let token = auth::Token::new(TOKEN.into()).unwrap();
        let exact = format!("Bearer {TOKEN}");
        prop_assert_eq!(token.check(Some(&header)), header == exact.as_bytes());
        let mut near = exact.clone().into_bytes();
        if !header.is_empty() {
            let i = header[0] as usize % near.len();
            near[i] ^= 1 | header[header.len() - 1];
            prop_assert_eq!(token.check(Some(&near)), near == exact.as_bytes());
        }
        prop_assert!(token.check(Some(exact.as_bytes())));
        prop_assert!(!token.check(None));
    }

    /// Route parsing never panics; an id it extracts never contains `/`,
    /// and the id validator accepts exactly `[A-Za-z0-9_-]{1,63}`.
    #[test]
    fn routes_and_ids(path in "\\PC{0,100}", id in "\\PC{0,70}") {
        if let Some(r) = Route::parse(&path) {
            if let Some(id) = r.id() {
                prop_assert!(!id.contains('/'));
            }
        }
        let want = !id.is_empty() && id.len() <= 63
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        prop_assert_eq!(validate_sandbox_id(&id).is_ok(), want, "{:?}", id);
    }

    /// An accepted workdir is relative, normalized and cannot climb.
    #[test]
    fn workdirs(path in "[a-z./\\\\:\\x00-]{0,40}") {
        if let Ok(p) = validate_workdir(&path) {
            prop_assert!(!p.starts_with('/') && !p.is_empty() && !p.ends_with('/'));
            prop_assert!(!p.contains('\0') && !p.contains('\\') && !p.contains("://"));
            prop_assert!(p.split('/').all(|c| !c.is_empty() && c != "." && c != ".."), "{:?}", p);
        }
    }
}
