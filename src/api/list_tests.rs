//! The list (`GET /api/sandboxes`, [`routes::list`]) after every change of
//! what it lists: the rendering of the records the backend has now.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::backend::Backend;
use crate::model::{CreateRequest, SandboxRecord, SandboxSpec};

fn memory() -> MemoryBackend {
    MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap()
}

fn state(backend: Arc<dyn Backend>) -> Arc<AppState> {
    AppState::for_tests(backend, "list-token-0123456789abcdef0123456789abcdef")
}

fn req(id: &str, thread: &str) -> CreateRequest {
    serde_json::from_value(serde_json::json!({"sandbox_id": id, "thread_id": thread, "uid": "u1"}))
        .unwrap()
}

/// What serde renders for `records` as a `SandboxList`.
fn rendered(st: &AppState, records: &[SandboxRecord]) -> Vec<u8> {
    let sandboxes: Vec<_> = records.iter().map(|r| routes::record_json(st, r)).collect();
    serde_json::to_vec(&openapi::SandboxList {
        count: sandboxes.len(),
        sandboxes,
    })
    .unwrap()
}

/// The body `GET /api/sandboxes` serves now, checked against a fresh
/// rendering of a fresh list taken right after it.
async fn listed(st: &AppState) -> Bytes {
    let body = routes::list(st).await;
    let records = st.lifecycle.list().await;
    assert_eq!(
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&rendered(st, &records)),
        "the list served is not the list"
    );
    body
}

fn json(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap()
}

#[tokio::test]
async fn the_list_shows_every_change_at_once() {
    let backend = Arc::new(memory());
    let st = state(backend.clone());
    let lc = st.lifecycle.clone();
    assert_eq!(json(&listed(&st).await)["count"], 0);

    // Creates.
    let a = lc.create(req("a", "t")).await.unwrap();
    assert_eq!(json(&listed(&st).await)["count"], 1);
    let b = lc.create(req("b", "t")).await.unwrap();
    let before = listed(&st).await;
    assert_eq!(json(&before)["count"], 2);
    // A reuse changes nothing.
    lc.create(req("b", "t")).await.unwrap();
    assert_eq!(listed(&st).await, before);

    // b is lost behind the lifecycle's back (its PID 1 exited): listed as
    // exited at once.
    assert!(backend.exit("b"));
    let v = json(&listed(&st).await);
    assert_eq!(v["sandboxes"][1]["status"], "exited", "{v}");

    // The next create of b replaces it: a new generation, running.
    let b2 = lc.create(req("b", "t")).await.unwrap();
    assert_ne!(b2.generation, b.generation);
    let v = json(&listed(&st).await);
    assert_eq!(v["sandboxes"][1]["generation"], b2.generation.as_str());
    assert_eq!(v["sandboxes"][1]["status"], "running");

    // A delete (API, reaper and quiesce share it).
    assert!(lc.delete("a", Some(&a.generation)).await.unwrap());
    let v = json(&listed(&st).await);
    assert_eq!(v["count"], 1, "{v}");
    assert_eq!(v["sandboxes"][0]["sandbox_id"], "b");

    // Adoption of what the backend runs and the lifecycle did not admit
    // (a restart).
    let spec =
        SandboxSpec::from_request(req("c", "t"), &BTreeMap::new(), &Default::default()).unwrap();
    backend.create(&spec, Duration::from_secs(1)).await.unwrap();
    assert_eq!(json(&listed(&st).await)["count"], 1, "not admitted yet");
    assert_eq!(lc.adopt_existing().await.unwrap(), 2);
    assert_eq!(json(&listed(&st).await)["count"], 2);

    // Quiesce deletes everything.
    lc.quiesce(Duration::from_secs(5)).await.unwrap();
    assert_eq!(json(&listed(&st).await)["count"], 0);
}
