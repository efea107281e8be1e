//! The list body served again ([`routes::list`]): never stale after any
//! change of what it lists, byte for byte a fresh rendering, and served
//! again only when the backend can stamp its answers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, BackendError, Upstream};
use crate::model::{CreateRequest, SandboxRecord, SandboxSpec, SandboxStatus};

/// The memory backend with a stamp that moves only when a sandbox is lost
/// behind the lifecycle's back (its PID 1 "exited"): whatever goes through
/// the lifecycle (create, delete, replace, adoption, a refreshed status)
/// must change the lifecycle's own part of the list stamp, or the tests
/// below see a stale body.
struct Stamped {
    inner: MemoryBackend,
    exits: AtomicU64,
}

impl Stamped {
    /// The sandbox's process is gone (the lifecycle still tracks it).
    async fn lose(&self, id: &str, generation: &str) {
        self.inner.delete(id, generation).await.unwrap();
        self.exits.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for Stamped {
    fn name(&self) -> &'static str {
        "memory"
    }
    async fn create(
        &self,
        spec: &SandboxSpec,
        health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        self.inner.create(spec, health_timeout).await
    }
    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        self.inner.list().await
    }
    async fn status(&self, record: &SandboxRecord) -> SandboxStatus {
        self.inner.status(record).await
    }
    async fn refresh_stamp(&self) -> Option<u64> {
        Some(self.exits.load(Ordering::SeqCst))
    }
    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError> {
        self.inner.delete(sandbox_id, generation).await
    }
    async fn connect(&self, record: &SandboxRecord) -> Result<Upstream, BackendError> {
        self.inner.connect(record).await
    }
}

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

/// Lists again until the body is served again (a list that stored a
/// refreshed record changed the table once), and returns it.
async fn settled(st: &AppState) -> Bytes {
    let mut body = listed(st).await;
    for _ in 0..3 {
        let again = listed(st).await;
        if again.as_ptr() == body.as_ptr() {
            return again;
        }
        body = again;
    }
    panic!("an unchanged list is never served again");
}

fn json(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap()
}

#[tokio::test]
async fn the_list_served_again_is_never_stale() {
    let backend = Arc::new(Stamped {
        inner: memory(),
        exits: AtomicU64::new(0),
    });
    let st = state(backend.clone());
    let lc = st.lifecycle.clone();
    assert_eq!(json(&settled(&st).await)["count"], 0);

    // Creates.
    let a = lc.create(req("a", "t")).await.unwrap();
    assert_eq!(json(&listed(&st).await)["count"], 1);
    let b = lc.create(req("b", "t")).await.unwrap();
    let before = settled(&st).await;
    assert_eq!(json(&before)["count"], 2);
    // A reuse changes nothing: the same body.
    lc.create(req("b", "t")).await.unwrap();
    assert_eq!(listed(&st).await.as_ptr(), before.as_ptr());

    // b's PID 1 exits: listed as exited at once.
    backend.lose("b", &b.generation).await;
    let v = json(&listed(&st).await);
    assert_eq!(v["sandboxes"][1]["status"], "exited", "{v}");
    settled(&st).await;

    // The next create of b replaces it: a new generation, running.
    let b2 = lc.create(req("b", "t")).await.unwrap();
    assert_ne!(b2.generation, b.generation);
    let v = json(&settled(&st).await);
    assert_eq!(v["sandboxes"][1]["generation"], b2.generation.as_str());
    assert_eq!(v["sandboxes"][1]["status"], "running");

    // A delete (API, reaper and quiesce share it).
    assert!(lc.delete("a", Some(&a.generation)).await.unwrap());
    let v = json(&settled(&st).await);
    assert_eq!(v["count"], 1, "{v}");
    assert_eq!(v["sandboxes"][0]["sandbox_id"], "b");

    // Adoption of what the backend runs and the table did not track (a
    // restart).
    let spec = SandboxSpec::from_request(
        req("c", "t"),
        &BTreeMap::new(),
        &crate::config::Limits::default().resources(),
    )
    .unwrap();
    backend
        .inner
        .create(&spec, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(json(&settled(&st).await)["count"], 1, "not tracked yet");
    assert_eq!(lc.adopt_existing().await.unwrap(), 2);
    assert_eq!(json(&settled(&st).await)["count"], 2);

    // Quiesce deletes everything.
    lc.quiesce(Duration::from_secs(5)).await.unwrap();
    assert_eq!(json(&settled(&st).await)["count"], 0);
}

/// A backend without a stamp (memory, kubernetes): every list refreshes
/// every record and renders, as before.
#[tokio::test]
async fn without_a_stamp_every_list_is_fresh() {
    let backend = Arc::new(memory());
    let st = state(backend.clone());
    let a = st.lifecycle.create(req("a", "t")).await.unwrap();
    let one = listed(&st).await;
    let two = listed(&st).await;
    assert_ne!(one.as_ptr(), two.as_ptr(), "rendered again");
    assert!(st.list_last.lock().unwrap().is_none());
    // Lost behind the lifecycle's back: the next list says so.
    backend.delete("a", &a.generation).await.unwrap();
    let v = json(&listed(&st).await);
    assert_eq!(v["sandboxes"][0]["status"], "exited", "{v}");
}
