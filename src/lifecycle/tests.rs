//! Lifecycle semantics over a scriptable in-process backend.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::memory::MemoryBackend;

fn settings(idle: Option<Duration>) -> Settings {
    Settings {
        allowed_images: Vec::new(),
        health_timeout: Duration::from_secs(5),
        idle_timeout: idle,
        idle_check_interval: Duration::from_millis(50),
        global_env: BTreeMap::new(),
        limits: ResourceLimits::default(),
        delete_grace: Duration::from_secs(10),
        stop_timeout: Duration::from_secs(10),
    }
}

fn lc(delay_ms: u64, idle: Option<Duration>) -> Arc<Lifecycle> {
    lc_and_backend(delay_ms, idle).0
}

/// A lifecycle over a memory backend, and that backend.
fn lc_and_backend(delay_ms: u64, idle: Option<Duration>) -> (Arc<Lifecycle>, Arc<MemoryBackend>) {
    let b = MemoryBackend::new("http://127.0.0.1:9", Duration::from_millis(delay_ms)).unwrap();
    let b = Arc::new(b);
    let lc = Lifecycle::new(b.clone(), settings(idle), Arc::new(Metrics::new()));
    (Arc::new(lc), b)
}

fn req(id: &str, thread: &str) -> CreateRequest {
    serde_json::from_value(serde_json::json!({
        "sandbox_id": id, "thread_id": thread, "uid": "u1"
    }))
    .unwrap()
}

#[tokio::test]
async fn reuse_keeps_generation_and_mismatch_is_refused() {
    let lc = lc(0, None);
    let a = lc.create(req("s1", "t1")).await.unwrap();
    let b = lc.create(req("s1", "t1")).await.unwrap();
    assert_eq!(a.generation, b.generation);
    let e = lc.create(req("s1", "t2")).await.unwrap_err();
    assert!(matches!(e, LifecycleError::IdentityMismatch(_)));
    assert_eq!(lc.discover("s1").await.unwrap().generation, a.generation);
}

#[tokio::test]
async fn stale_incarnation_is_absent_listed_and_replaced() {
    let (lc, backend) = lc_and_backend(0, None);
    let a = lc.create(req("s1", "t1")).await.unwrap();
    // Its process died: discover and the proxy say it is absent (and that
    // is no activity); the list still shows it ...
    assert!(backend.exit("s1"));
    let touches = lc.observe().pop().unwrap().touches;
    assert!(matches!(
        lc.discover("s1").await,
        Err(LifecycleError::NotFound)
    ));
    assert!(matches!(lc.pin("s1").await, Err(LifecycleError::NotFound)));
    assert_eq!(lc.observe().pop().unwrap().touches, touches);
    let listed = lc.list().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, SandboxStatus::Exited);
    assert_eq!(listed[0].generation, a.generation);
    // ... and the next create makes a new one.
    let b = lc.create(req("s1", "t1")).await.unwrap();
    assert_ne!(a.generation, b.generation);
    assert_eq!(b.status, SandboxStatus::Running);
    assert_eq!(lc.discover("s1").await.unwrap().generation, b.generation);
    // An explicit delete of an exited sandbox still succeeds.
    assert!(backend.exit("s1"));
    assert!(lc.delete("s1", Some(&b.generation)).await.unwrap());
    assert!(lc.list().await.is_empty());
}

#[tokio::test]
async fn fenced_delete() {
    let lc = lc(0, None);
    let a = lc.create(req("s1", "t1")).await.unwrap();
    let e = lc.delete("s1", Some("0000")).await.unwrap_err();
    assert!(matches!(e, LifecycleError::GenerationMismatch { .. }));
    assert!(lc.discover("s1").await.is_ok(), "stale delete touched it");
    assert!(lc.delete("s1", Some(&a.generation)).await.unwrap());
    assert!(!lc.delete("s1", Some(&a.generation)).await.unwrap());
    assert!(matches!(
        lc.discover("s1").await,
        Err(LifecycleError::NotFound)
    ));
    assert_eq!(lc.live_lock_slots(), 0);
}

#[tokio::test]
async fn concurrent_creates_make_one_generation() {
    let lc = lc(50, None);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let lc = lc.clone();
        tasks.push(tokio::spawn(
            async move { lc.create(req("s1", "t1")).await },
        ));
    }
    let mut gens = std::collections::HashSet::new();
    for t in tasks {
        gens.insert(t.await.unwrap().unwrap().generation);
    }
    assert_eq!(gens.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn delete_waits_for_pins() {
    let lc = lc(0, None);
    lc.create(req("s1", "t1")).await.unwrap();
    let pin = lc.pin("s1").await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let (lc2, d2) = (lc.clone(), done.clone());
    let del = tokio::spawn(async move {
        lc2.delete("s1", None).await.unwrap();
        d2.store(1, Ordering::SeqCst);
    });
    // The paused clock runs everything ready first: 9 s later (the grace
    // is 10 s) the delete is still waiting for the pin.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(done.load(Ordering::SeqCst), 0, "delete did not wait");
    // A second sandbox is unaffected meanwhile.
    lc.create(req("s2", "t1")).await.unwrap();
    lc.pin("s2").await.unwrap();
    drop(pin);
    del.await.unwrap();
    assert!(matches!(lc.pin("s1").await, Err(LifecycleError::NotFound)));
}

#[tokio::test]
async fn reaper_spares_touched() {
    let lc = lc(0, Some(Duration::from_millis(300)));
    lc.create(req("idle", "t")).await.unwrap();
    lc.create(req("busy", "t")).await.unwrap();
    let _h = lc.spawn_reaper().unwrap();
    // Real time: idleness is measured on the std clock. Touch "busy" every
    // 100 ms (the idle timeout is 300) until the reaper has taken "idle"
    // (its counter is the barrier), then for five more touches.
    let mut after = 0;
    for i in 0.. {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(lc.touch("busy"), "busy reaped although touched");
        if lc.metrics().reaped.get() > 0 {
            after += 1;
            if after == 5 {
                break;
            }
        }
        assert!(i < 600, "idle not reaped within a minute");
    }
    assert!(lc.discover("busy").await.is_ok());
    assert!(matches!(
        lc.discover("idle").await,
        Err(LifecycleError::NotFound)
    ));
    assert_eq!(lc.metrics().reaped.get(), 1);
}

#[tokio::test]
async fn reap_skips_when_touched_after_observation() {
    let lc = lc(0, Some(Duration::from_secs(1000)));
    lc.create(req("s1", "t")).await.unwrap();
    let obs = lc.observe().pop().unwrap();
    lc.touch("s1");
    assert!(!lc.reap(&obs).await.unwrap());
    assert!(lc.discover("s1").await.is_ok());
    let obs = lc.observe().pop().unwrap();
    assert!(lc.reap(&obs).await.unwrap());
}

#[tokio::test]
async fn quiesce_closes_gate_and_deletes_all() {
    let lc = lc(0, None);
    lc.create(req("a", "t")).await.unwrap();
    lc.create(req("b", "t")).await.unwrap();
    assert_eq!(lc.quiesce(Duration::from_secs(5)).await.unwrap(), 2);
    assert!(matches!(
        lc.create(req("c", "t")).await,
        Err(LifecycleError::Quiescing)
    ));
    assert_eq!(lc.tracked_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn quiesce_waits_for_creates_in_flight() {
    let lc = lc(300, None);
    let lc2 = lc.clone();
    let create = tokio::spawn(async move { lc2.create(req("late", "t")).await });
    // Paused clock: 50 ms on, the create is inside the backend's 300 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!create.is_finished());
    // The create passed the gate: quiesce waits for it, then deletes it.
    assert_eq!(lc.quiesce(Duration::from_secs(5)).await.unwrap(), 1);
    assert!(create.await.unwrap().is_ok());
    assert_eq!(lc.tracked_count(), 0);
    assert!(lc.backend().list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_proxied_response_ending_marks_activity() {
    let lc = lc(0, None);
    let a = lc.create(req("s1", "t")).await.unwrap();
    let before = lc.observe().pop().unwrap().touches;
    lc.touch_generation("s1", &a.generation);
    assert_eq!(lc.observe().pop().unwrap().touches, before + 1);
    // Another generation's response does not count.
    lc.touch_generation("s1", "0000");
    assert_eq!(lc.observe().pop().unwrap().touches, before + 1);
}

#[tokio::test]
async fn a_sandbox_serving_a_request_is_not_reaped() {
    let lc = lc(0, Some(Duration::from_millis(200)));
    lc.create(req("busy", "t")).await.unwrap();
    let pin = lc.pin("busy").await.unwrap();
    let _h = lc.spawn_reaper().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(lc.observe().pop().unwrap().inflight, 1);
    assert_eq!(lc.tracked_count(), 1, "reaped while serving a request");
    drop(pin);
    // Once idle it goes: wait for it (no fixed sleep before the check).
    let mut waited = 0;
    while lc.tracked_count() != 0 {
        assert!(waited < 600, "not reaped once idle");
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
}

#[tokio::test(start_paused = true)]
async fn the_reaper_never_cancels_a_request() {
    let mut s = settings(Some(Duration::from_secs(1000)));
    s.delete_grace = Duration::from_millis(200);
    let b = MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap();
    let lc = Arc::new(Lifecycle::new(Arc::new(b), s, Arc::new(Metrics::new())));
    lc.create(req("s1", "t")).await.unwrap();
    // Admitted after the reaper looked: kept at once, not cut.
    let obs = lc.observe().pop().unwrap();
    let pin = lc.pin("s1").await.unwrap();
    let started = tokio::time::Instant::now();
    assert!(!lc.reap(&obs).await.unwrap());
    assert_eq!(started.elapsed(), Duration::ZERO, "did not keep it at once");
    assert!(!pin.is_cancelled());
    // Even when the touch went unnoticed, it gives up after the grace
    // rather than cancelling.
    let obs = lc.observe().pop().unwrap();
    assert_eq!(obs.inflight, 1);
    let started = tokio::time::Instant::now();
    assert!(!lc.reap(&obs).await.unwrap());
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(200),
        "not after the grace"
    );
    assert!(!pin.is_cancelled(), "the reaper cancelled a request");
    drop(pin);
    let obs = lc.observe().pop().unwrap();
    assert!(lc.reap(&obs).await.unwrap());
}

/// A lifecycle whose deletes cancel after 200 ms, with sandboxes `s1`
/// and `s2`.
async fn two_sandboxes_with_a_short_grace() -> Arc<Lifecycle> {
    let mut s = settings(None);
    s.delete_grace = Duration::from_millis(200);
    let b = MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap();
    let lc = Arc::new(Lifecycle::new(Arc::new(b), s, Arc::new(Metrics::new())));
    lc.create(req("s1", "t")).await.unwrap();
    lc.create(req("s2", "t")).await.unwrap();
    lc
}

#[tokio::test(start_paused = true)]
async fn delete_cancels_pins_after_the_grace() {
    let lc = two_sandboxes_with_a_short_grace().await;
    let stuck = lc.pin("s1").await.unwrap();
    let other = lc.pin("s2").await.unwrap();
    let started = tokio::time::Instant::now();
    assert!(lc.delete("s1", None).await.unwrap());
    // Exactly one grace on the paused clock.
    assert_eq!(started.elapsed(), Duration::from_millis(200));
    assert!(stuck.is_cancelled());
    assert!(!other.is_cancelled());
    drop(stuck);
    assert!(matches!(lc.pin("s1").await, Err(LifecycleError::NotFound)));
}

#[tokio::test(start_paused = true)]
async fn stop_all_deletes_concurrently_within_the_deadline() {
    let mut s = settings(None);
    s.delete_grace = Duration::from_millis(300);
    s.stop_timeout = Duration::from_secs(5);
    let b = MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap();
    let lc = Arc::new(Lifecycle::new(Arc::new(b), s, Arc::new(Metrics::new())));
    let mut pins = Vec::new();
    for i in 0..10 {
        let id = format!("s{i}");
        lc.create(req(&id, "t")).await.unwrap();
        pins.push(lc.pin(&id).await.unwrap());
    }
    let started = tokio::time::Instant::now();
    assert_eq!(lc.stop_all().await, 10);
    // Two rounds of 8 at most, each one grace long (the paused clock
    // counts exactly); one after the other would take 10 graces.
    assert!(
        started.elapsed() <= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(lc.tracked_count(), 0);

    // The overall deadline wins over a longer grace.
    let mut s = settings(None);
    s.delete_grace = Duration::from_secs(60);
    s.stop_timeout = Duration::from_millis(300);
    let b = MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap();
    let lc = Arc::new(Lifecycle::new(Arc::new(b), s, Arc::new(Metrics::new())));
    lc.create(req("held", "t")).await.unwrap();
    let _pin = lc.pin("held").await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(lc.stop_all().await, 0);
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn quiesce_times_out_behind_a_pin() {
    let lc = lc(0, None);
    lc.create(req("a", "t")).await.unwrap();
    let _pin = lc.pin("a").await.unwrap();
    let started = tokio::time::Instant::now();
    let e = lc.quiesce(Duration::from_millis(200)).await.unwrap_err();
    assert!(matches!(e, LifecycleError::QuiesceTimeout(..)));
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

/// A backend whose delete of a stale incarnation reports a conflict (it
/// was replaced behind our back), as the Kubernetes API server does.
struct ReplacedBehindOurBack {
    inner: MemoryBackend,
}

#[async_trait::async_trait]
impl crate::backend::Backend for ReplacedBehindOurBack {
    fn name(&self) -> &'static str {
        "test"
    }
    async fn create(
        &self,
        spec: &crate::model::SandboxSpec,
        t: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        self.inner.create(spec, t).await
    }
    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        self.inner.list().await
    }
    async fn running(&self, _sandbox: &crate::backend::SandboxRef) -> bool {
        false
    }
    async fn status(&self, sandboxes: &[crate::backend::SandboxRef]) -> Vec<Option<SandboxRecord>> {
        let mut records = self.inner.status(sandboxes).await;
        for r in records.iter_mut().flatten() {
            r.status = SandboxStatus::Exited;
        }
        records
    }
    async fn delete(&self, _id: &str, _g: &str) -> Result<(), BackendError> {
        Err(BackendError::Conflict("replaced".into()))
    }
    async fn connect(
        &self,
        r: &crate::backend::SandboxRef,
    ) -> Result<crate::backend::Upstream, BackendError> {
        self.inner.connect(r).await
    }
}

#[tokio::test]
async fn stale_incarnation_replaced_elsewhere_is_forgotten_not_fatal() {
    let b = ReplacedBehindOurBack {
        inner: MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap(),
    };
    let lc = Lifecycle::new(Arc::new(b), settings(None), Arc::new(Metrics::new()));
    let a = lc.create(req("s1", "t1")).await.unwrap();
    // Status says exited, delete says conflict: the create still succeeds
    // with a new generation.
    let b = lc.create(req("s1", "t1")).await.unwrap();
    assert_ne!(a.generation, b.generation);
}

#[tokio::test]
async fn delete_of_an_incarnation_replaced_elsewhere() {
    let b = ReplacedBehindOurBack {
        inner: MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap(),
    };
    let lc = Lifecycle::new(Arc::new(b), settings(None), Arc::new(Metrics::new()));
    let a = lc.create(req("s1", "t1")).await.unwrap();
    // The backend lists nothing else for s1 here (its inner registry holds
    // the same generation, but deletes always conflict): a fenced delete
    // on what we saw is refused with 409 only if something else lives.
    let r = lc.delete("s1", Some(&a.generation)).await;
    assert!(r.is_err(), "{r:?}");
}

#[tokio::test]
async fn a_cached_pin_follows_the_incarnation() {
    let lc = lc(0, None);
    let a = lc.create(req("s1", "t1")).await.unwrap();
    let mut cache = None;
    let p = lc.pin_cached("s1", &mut cache).await.unwrap();
    assert_eq!(p.sandbox.generation, a.generation);
    drop(p);
    // From the cache: the same incarnation, activity marked as before.
    let touches = lc.observe().pop().unwrap().touches;
    let p = lc.pin_cached("s1", &mut cache).await.unwrap();
    assert_eq!(p.sandbox.generation, a.generation);
    assert_eq!(lc.observe().pop().unwrap().touches, touches + 1);
    assert_eq!(lc.observe().pop().unwrap().inflight, 1);
    drop(p);
    assert_eq!(lc.observe().pop().unwrap().inflight, 0);
    // Deleted and made anew while the cache holds the old one: the next
    // request reads the new record.
    assert!(lc.delete("s1", None).await.unwrap());
    let b = lc.create(req("s1", "t1")).await.unwrap();
    assert_ne!(a.generation, b.generation);
    let p = lc.pin_cached("s1", &mut cache).await.unwrap();
    assert_eq!(p.sandbox.generation, b.generation);
    drop(p);
    // Deleted: absent, and the cache is emptied.
    assert!(lc.delete("s1", None).await.unwrap());
    assert!(matches!(
        lc.pin_cached("s1", &mut cache).await,
        Err(LifecycleError::NotFound)
    ));
    assert!(cache.is_none());
    // Another id through the same cache.
    lc.create(req("s1", "t1")).await.unwrap();
    lc.create(req("s2", "t1")).await.unwrap();
    let p = lc.pin_cached("s1", &mut cache).await.unwrap();
    drop(p);
    let p = lc.pin_cached("s2", &mut cache).await.unwrap();
    assert_eq!(p.sandbox.sandbox_id, "s2");
    drop(p);
    // The cache keeps its slot (only that); dropping it lets it go.
    assert_eq!(lc.live_lock_slots(), 1);
    drop(cache);
    assert_eq!(lc.live_lock_slots(), 0);
}

#[tokio::test]
async fn a_cached_pin_of_a_sandbox_that_exited_is_absent() {
    let (lc, backend) = lc_and_backend(0, None);
    lc.create(req("s1", "t1")).await.unwrap();
    let mut cache = None;
    drop(lc.pin_cached("s1", &mut cache).await.unwrap());
    // The process died: the backend says so at once, no activity counts.
    assert!(backend.exit("s1"));
    let touches = lc.observe().pop().unwrap().touches;
    assert!(matches!(
        lc.pin_cached("s1", &mut cache).await,
        Err(LifecycleError::NotFound)
    ));
    assert!(cache.is_none());
    assert_eq!(lc.observe().pop().unwrap().touches, touches);
    assert_eq!(lc.observe().pop().unwrap().inflight, 0);
}

#[tokio::test]
async fn a_cached_pin_waits_behind_a_delete() {
    let lc = lc(0, None);
    lc.create(req("s1", "t1")).await.unwrap();
    let mut cache = None;
    drop(lc.pin_cached("s1", &mut cache).await.unwrap());
    let held = lc.pin("s1").await.unwrap();
    let lc2 = lc.clone();
    let delete = tokio::spawn(async move { lc2.delete("s1", None).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!delete.is_finished(), "the delete did not wait for the pin");
    // A request from the cache now waits behind the delete ...
    let lc3 = lc.clone();
    let cached = tokio::spawn(async move { lc3.pin_cached("s1", &mut cache).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!cached.is_finished(), "a cached pin passed a closed gate");
    // ... and finds the sandbox gone once the delete is done.
    drop(held);
    assert!(delete.await.unwrap().unwrap());
    assert!(matches!(
        cached.await.unwrap(),
        Err(LifecycleError::NotFound)
    ));
}

#[tokio::test]
async fn a_delete_cancels_a_cached_pin_after_the_grace() {
    let lc = two_sandboxes_with_a_short_grace().await;
    let (mut c1, mut c2) = (None, None);
    // Filled by an earlier request, then the one that gets stuck.
    drop(lc.pin_cached("s1", &mut c1).await.unwrap());
    let stuck = lc.pin_cached("s1", &mut c1).await.unwrap();
    let other = lc.pin_cached("s2", &mut c2).await.unwrap();
    let watcher = tokio::spawn(stuck.cancellation());
    let bystander = tokio::spawn(other.cancellation());
    assert!(lc.delete("s1", None).await.unwrap());
    assert!(stuck.is_cancelled());
    tokio::time::timeout(Duration::from_secs(1), watcher)
        .await
        .expect("the cancellation did not wake the cached request")
        .unwrap();
    assert!(!other.is_cancelled());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!bystander.is_finished(), "another id's request was woken");
    // The cancelled request leaving later takes nothing off the next
    // incarnation's count.
    lc.create(req("s1", "t")).await.unwrap();
    let next = lc.pin_cached("s1", &mut c1).await.unwrap();
    drop(stuck);
    assert_eq!(
        lc.observe()
            .into_iter()
            .find(|o| o.id == "s1")
            .unwrap()
            .inflight,
        1
    );
    assert!(!next.is_cancelled());
    drop((next, other));
    bystander.abort();
}
