//! Lifecycle semantics over a scriptable in-process backend.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::model::{IdleMark, IdleState};

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
        ladder: Ladder::OFF,
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
    let touches = lc.observe().await.pop().unwrap().touches;
    assert!(matches!(
        lc.discover("s1").await,
        Err(LifecycleError::NotFound)
    ));
    assert!(matches!(lc.pin("s1").await, Err(LifecycleError::NotFound)));
    assert_eq!(lc.observe().await.pop().unwrap().touches, touches);
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
    let obs = lc.observe().await.pop().unwrap();
    lc.touch("s1");
    assert!(!lc.reap(&obs).await.unwrap());
    assert!(lc.discover("s1").await.is_ok());
    let obs = lc.observe().await.pop().unwrap();
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
    let before = lc.observe().await.pop().unwrap().touches;
    lc.touch_generation("s1", &a.generation);
    assert_eq!(lc.observe().await.pop().unwrap().touches, before + 1);
    // Another generation's response does not count.
    lc.touch_generation("s1", "0000");
    assert_eq!(lc.observe().await.pop().unwrap().touches, before + 1);
}

#[tokio::test]
async fn a_sandbox_serving_a_request_is_not_reaped() {
    let lc = lc(0, Some(Duration::from_millis(200)));
    lc.create(req("busy", "t")).await.unwrap();
    let pin = lc.pin("busy").await.unwrap();
    let _h = lc.spawn_reaper().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(lc.observe().await.pop().unwrap().inflight, 1);
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
    let obs = lc.observe().await.pop().unwrap();
    let pin = lc.pin("s1").await.unwrap();
    let started = tokio::time::Instant::now();
    assert!(!lc.reap(&obs).await.unwrap());
    assert_eq!(started.elapsed(), Duration::ZERO, "did not keep it at once");
    assert!(!pin.is_cancelled());
    // Even when the touch went unnoticed, it gives up after the grace
    // rather than cancelling.
    let obs = lc.observe().await.pop().unwrap();
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
    let obs = lc.observe().await.pop().unwrap();
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
    async fn running(&self, _sandbox: &crate::backend::SandboxRef) -> Running {
        Running::No
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
    let touches = lc.observe().await.pop().unwrap().touches;
    let p = lc.pin_cached("s1", &mut cache).await.unwrap();
    assert_eq!(p.sandbox.generation, a.generation);
    assert_eq!(lc.observe().await.pop().unwrap().touches, touches + 1);
    assert_eq!(lc.observe().await.pop().unwrap().inflight, 1);
    drop(p);
    assert_eq!(lc.observe().await.pop().unwrap().inflight, 0);
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
    let touches = lc.observe().await.pop().unwrap().touches;
    assert!(matches!(
        lc.pin_cached("s1", &mut cache).await,
        Err(LifecycleError::NotFound)
    ));
    assert!(cache.is_none());
    assert_eq!(lc.observe().await.pop().unwrap().touches, touches);
    assert_eq!(lc.observe().await.pop().unwrap().inflight, 0);
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
            .await
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

/// A memory backend with a hibernation ladder: it keeps each incarnation's
/// idle state as a record would (absent: active), counts freezes and
/// thaws, serializes wakes like the native backend (concurrent wakes wait
/// for one thaw), can hold a thaw at a gate (a wake in progress), reports
/// a CPU time set by the test, and can be told to fail its reclaims.
#[derive(Default)]
struct Freezer {
    asleep: std::sync::Mutex<std::collections::HashMap<String, IdleState>>,
    wakes: tokio::sync::Mutex<()>,
    freezes: AtomicUsize,
    thaws: AtomicUsize,
    /// While set, a thaw waits until it is notified.
    hold_thaw: std::sync::atomic::AtomicBool,
    thaw_gate: tokio::sync::Notify,
    cpu_usec: std::sync::atomic::AtomicU64,
    reclaim_fails: std::sync::atomic::AtomicBool,
}

impl Freezer {
    fn key(s: &SandboxRef) -> String {
        format!("{}/{}", s.sandbox_id, s.generation)
    }

    fn state(&self, s: &SandboxRef) -> IdleState {
        let asleep = self.asleep.lock().unwrap();
        asleep
            .get(&Self::key(s))
            .copied()
            .unwrap_or(IdleState::Active)
    }

    fn set(&self, s: &SandboxRef, state: IdleState) {
        let mut asleep = self.asleep.lock().unwrap();
        match state {
            IdleState::Active => asleep.remove(&Self::key(s)),
            _ => asleep.insert(Self::key(s), state),
        };
    }
}

struct FreezingBackend {
    inner: MemoryBackend,
    f: Arc<Freezer>,
}

#[async_trait::async_trait]
impl crate::backend::Backend for FreezingBackend {
    async fn create(
        &self,
        spec: &crate::model::SandboxSpec,
        t: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        let mut r = self.inner.create(spec, t).await?;
        r.idle = Some(IdleMark::now(IdleState::Active));
        Ok(r)
    }
    fn name(&self) -> &'static str {
        "freezing"
    }
    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        self.inner.list().await
    }
    async fn status(&self, sandboxes: &[SandboxRef]) -> Vec<Option<SandboxRecord>> {
        let mut records = self.inner.status(sandboxes).await;
        for r in records.iter_mut().flatten() {
            let state = self.f.state(&SandboxRef::of(r));
            r.idle = Some(IdleMark::now(state));
        }
        records
    }
    async fn running(&self, s: &SandboxRef) -> Running {
        match self.inner.running(s).await {
            Running::Yes if self.f.state(s).asleep() => Running::Asleep,
            r => r,
        }
    }
    async fn delete(&self, id: &str, g: &str) -> Result<(), BackendError> {
        self.f.asleep.lock().unwrap().remove(&format!("{id}/{g}"));
        self.inner.delete(id, g).await
    }
    async fn connect(&self, s: &SandboxRef) -> Result<crate::backend::Upstream, BackendError> {
        self.inner.connect(s).await
    }
    fn can_freeze(&self) -> bool {
        true
    }
    fn swap(&self) -> Option<crate::backend::SwapInfo> {
        Some(crate::backend::SwapInfo {
            devices: vec![("/dev/zram0".into(), "zram".into())],
            total_bytes: 1 << 30,
            free_bytes: 1 << 30,
        })
    }
    async fn idle(&self, sandboxes: &[SandboxRef]) -> Vec<Option<crate::backend::IdleSample>> {
        let mut out = Vec::new();
        for s in sandboxes {
            let running = self.inner.running(s).await == Running::Yes;
            out.push(running.then(|| crate::backend::IdleSample {
                state: self.f.state(s),
                cpu_usec: Some(self.f.cpu_usec.load(Ordering::SeqCst)),
            }));
        }
        out
    }
    async fn freeze(&self, s: &SandboxRef) -> Result<(), BackendError> {
        self.f.freezes.fetch_add(1, Ordering::SeqCst);
        self.f.set(s, IdleState::Frozen);
        Ok(())
    }
    async fn reclaim(
        &self,
        s: &SandboxRef,
    ) -> Result<crate::backend::ReclaimOutcome, BackendError> {
        if self.f.reclaim_fails.load(Ordering::SeqCst) {
            return Ok(crate::backend::ReclaimOutcome {
                bytes: 1 << 20,
                failure: Some("swap_full"),
                detail: "test".into(),
            });
        }
        self.f.set(s, IdleState::Reclaimed);
        Ok(crate::backend::ReclaimOutcome {
            bytes: 100 << 20,
            failure: None,
            detail: String::new(),
        })
    }
    async fn wake(&self, s: &SandboxRef) -> Result<Option<IdleState>, BackendError> {
        let _one = self.f.wakes.lock().await;
        let from = self.f.state(s);
        if !from.asleep() {
            return Ok(None);
        }
        if self.f.hold_thaw.load(Ordering::SeqCst) {
            self.f.thaw_gate.notified().await;
        }
        if self.inner.running(s).await != Running::Yes {
            return Err(BackendError::Unreachable("gone".into()));
        }
        self.f.thaws.fetch_add(1, Ordering::SeqCst);
        self.f.set(s, IdleState::Active);
        Ok(Some(from))
    }
}

/// A lifecycle over a [`FreezingBackend`] whose ladder freezes after 1 ms
/// idle and reclaims after 2 ms (idle times are on the real clock).
fn freezing(idle: Option<Duration>) -> (Arc<Lifecycle>, Arc<Freezer>, Arc<FreezingBackend>) {
    let f = Arc::new(Freezer::default());
    let b = Arc::new(FreezingBackend {
        inner: MemoryBackend::new("http://127.0.0.1:9", Duration::ZERO).unwrap(),
        f: f.clone(),
    });
    let mut s = settings(idle);
    s.ladder = Ladder {
        freeze_after: Some(Duration::from_millis(1)),
        reclaim_after: Some(Duration::from_millis(2)),
        busy_cpu_percent: 2.0,
    };
    let lc = Arc::new(Lifecycle::new(b.clone(), s, Arc::new(Metrics::new())));
    (lc, f, b)
}

/// The idle state of `id` as the list shows it (no wake).
async fn idle_state(lc: &Lifecycle, id: &str) -> IdleState {
    let listed = lc.list().await;
    let r = listed.iter().find(|r| r.sandbox_id == id).unwrap();
    r.idle.unwrap().state
}

/// Runs reaper rounds until `id` is in `state` (at most 1000 rounds, each
/// after 2 ms: the ladder's steps are 1 ms apart).
async fn until_state(lc: &Lifecycle, id: &str, state: IdleState) {
    for _ in 0..1000 {
        if idle_state(lc, id).await == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        lc.check_idle().await;
    }
    panic!("{id} never {state:?}, still {:?}", idle_state(lc, id).await);
}

#[tokio::test]
async fn the_ladder_freezes_reclaims_and_a_request_wakes() {
    let (lc, f, _) = freezing(None);
    let created = lc.create(req("s1", "t")).await.unwrap();
    assert_eq!(created.idle.unwrap().state, IdleState::Active);
    until_state(&lc, "s1", IdleState::Frozen).await;
    assert_eq!(f.freezes.load(Ordering::SeqCst), 1);
    // Status stays running; the list shows the state without waking.
    assert_eq!(lc.list().await[0].status, SandboxStatus::Running);
    until_state(&lc, "s1", IdleState::Reclaimed).await;
    assert_eq!(lc.metrics().reclaimed_bytes.get(), 100 << 20);
    assert_eq!(
        lc.idle_counts(&lc.list().await),
        vec![("active", 0), ("frozen", 0), ("reclaimed", 1)]
    );
    assert_eq!(f.thaws.load(Ordering::SeqCst), 0, "the list woke it");
    // A proxied request wakes it before it is admitted.
    let pin = lc.pin("s1").await.unwrap();
    assert_eq!(f.thaws.load(Ordering::SeqCst), 1);
    assert_eq!(idle_state(&lc, "s1").await, IdleState::Active);
    drop(pin);
    // Down again; discover wakes it too, and answers it awake.
    until_state(&lc, "s1", IdleState::Frozen).await;
    let found = lc.discover("s1").await.unwrap();
    assert_eq!(found.idle.unwrap().state, IdleState::Active);
    assert_eq!(f.thaws.load(Ordering::SeqCst), 2);
    // And a create's reuse.
    until_state(&lc, "s1", IdleState::Frozen).await;
    let reused = lc.create(req("s1", "t")).await.unwrap();
    assert_eq!(reused.generation, created.generation);
    assert_eq!(reused.idle.unwrap().state, IdleState::Active);
    assert_eq!(f.thaws.load(Ordering::SeqCst), 3);
    let text = lc.metrics().render(&[], &[]);
    for from in ["frozen", "reclaimed"] {
        let series = format!("sandboxd_wake_duration_seconds_count{{from=\"{from}\"}}");
        assert!(text.contains(&series), "{from}: {text}");
    }
}

#[tokio::test]
async fn a_busy_sandbox_is_not_frozen_nor_reaped() {
    // The idle timeout well above a round's spacing on a loaded machine
    // (the first rounds must meet the freeze step, not the delete).
    let (lc, f, _) = freezing(Some(Duration::from_millis(500)));
    lc.create(req("s1", "t")).await.unwrap();
    let refused = |step: &str| {
        lc.metrics()
            .idle_steps_refused
            .get_or_create(&crate::metrics::StepReasonLabel {
                step: step.into(),
                reason: "cpu".into(),
            })
            .get()
    };
    // A second of CPU between every two rounds (busy whatever the rounds'
    // spacing), until its requests alone would have had it deleted, and
    // some more rounds.
    let mut rounds_past_the_timeout = 0;
    while rounds_past_the_timeout < 5 {
        tokio::time::sleep(Duration::from_millis(4)).await;
        f.cpu_usec.fetch_add(1_000_000, Ordering::SeqCst);
        lc.check_idle().await;
        if refused("delete") > 0 {
            rounds_past_the_timeout += 1;
        }
    }
    assert_eq!(f.freezes.load(Ordering::SeqCst), 0);
    assert_eq!(lc.metrics().reaped.get(), 0);
    assert_eq!(idle_state(&lc, "s1").await, IdleState::Active);
    assert!(refused("freeze") > 0);
    // Once it stops using CPU, it is frozen, then reaped.
    until_state(&lc, "s1", IdleState::Frozen).await;
    while lc.tracked_count() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        lc.check_idle().await;
    }
    assert_eq!(lc.metrics().reaped.get(), 1);
}

#[tokio::test]
async fn a_sandbox_serving_a_request_is_not_frozen() {
    let (lc, f, _) = freezing(None);
    lc.create(req("s1", "t")).await.unwrap();
    let pin = lc.pin("s1").await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        lc.check_idle().await;
    }
    assert_eq!(f.freezes.load(Ordering::SeqCst), 0);
    drop(pin);
    until_state(&lc, "s1", IdleState::Frozen).await;
}

#[tokio::test]
async fn concurrent_requests_share_one_wake() {
    let (lc, f, _) = freezing(None);
    lc.create(req("s1", "t")).await.unwrap();
    until_state(&lc, "s1", IdleState::Frozen).await;
    f.hold_thaw.store(true, Ordering::SeqCst);
    let mut reqs = Vec::new();
    for _ in 0..8 {
        let lc = lc.clone();
        reqs.push(tokio::spawn(async move { lc.pin("s1").await.map(drop) }));
    }
    // All eight wait behind the one thaw in progress.
    while lc.observe().await[0].inflight < 8 {
        tokio::task::yield_now().await;
    }
    assert!(reqs.iter().all(|r| !r.is_finished()));
    f.hold_thaw.store(false, Ordering::SeqCst);
    f.thaw_gate.notify_one();
    for r in reqs {
        r.await.unwrap().unwrap();
    }
    assert_eq!(f.thaws.load(Ordering::SeqCst), 1);
    let records = lc.list().await;
    let text = lc.metrics().render(&[], &lc.idle_counts(&records));
    assert!(
        text.contains("sandboxd_wake_duration_seconds_count{from=\"frozen\"} 1\n"),
        "one wake observed: {text}"
    );
    assert!(
        text.contains("sandboxd_sandboxes{idle_state=\"active\"} 1\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_delete_racing_a_wake_wins_and_never_thaws_a_successor() {
    let (lc, f, _) = freezing(None);
    let a = lc.create(req("s1", "t")).await.unwrap();
    until_state(&lc, "s1", IdleState::Frozen).await;
    f.hold_thaw.store(true, Ordering::SeqCst);
    let lc2 = lc.clone();
    let wake = tokio::spawn(async move { lc2.pin("s1").await.map(drop) });
    while lc.observe().await[0].inflight < 1 {
        tokio::task::yield_now().await;
    }
    // The delete waits for the waking request (it holds a pin), at most
    // its grace; the thaw goes on once the delete closed the gate (no new
    // request gets in).
    let lc3 = lc.clone();
    let gen = a.generation.clone();
    let del = tokio::spawn(async move { lc3.delete("s1", Some(&gen)).await });
    let hold = lc.locks.hold("s1");
    let watch = hold.watch();
    while let Some(pinned) = hold.try_pin(&watch) {
        drop(pinned);
        tokio::task::yield_now().await;
    }
    drop((hold, watch));
    f.hold_thaw.store(false, Ordering::SeqCst);
    f.thaw_gate.notify_one();
    wake.await.unwrap().unwrap();
    assert!(del.await.unwrap().unwrap(), "the delete won");
    assert!(matches!(lc.pin("s1").await, Err(LifecycleError::NotFound)));
    // A successor; a wake fenced on the old generation (a discover that
    // read the old incarnation) touches nothing of it, nor does a touch
    // at the end of an old response.
    let b = lc.create(req("s1", "t")).await.unwrap();
    until_state(&lc, "s1", IdleState::Frozen).await;
    let thaws = f.thaws.load(Ordering::SeqCst);
    lc.touch_generation("s1", &a.generation);
    let mut old = b.clone();
    old.generation = a.generation.clone();
    old.idle = Some(IdleMark::now(IdleState::Frozen));
    assert!(matches!(lc.awake(old).await, Err(LifecycleError::NotFound)));
    assert_eq!(
        f.thaws.load(Ordering::SeqCst),
        thaws,
        "the old generation woke the new one"
    );
    assert_eq!(idle_state(&lc, "s1").await, IdleState::Frozen);
    // A delete of a frozen sandbox needs no wake.
    assert!(lc.delete("s1", Some(&b.generation)).await.unwrap());
    assert_eq!(f.thaws.load(Ordering::SeqCst), thaws);
}

#[tokio::test]
async fn a_failed_reclaim_leaves_it_frozen_and_is_tried_again() {
    let (lc, f, _) = freezing(None);
    f.reclaim_fails.store(true, Ordering::SeqCst);
    lc.create(req("s1", "t")).await.unwrap();
    until_state(&lc, "s1", IdleState::Frozen).await;
    let failures = || {
        lc.metrics()
            .reclaim_failures
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: "swap_full".into(),
            })
            .get()
    };
    // Failed, then tried again (reclaim_after later): frozen throughout.
    while failures() < 2 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        lc.check_idle().await;
        assert_eq!(idle_state(&lc, "s1").await, IdleState::Frozen);
    }
    assert_eq!(lc.metrics().reclaimed_bytes.get(), 2 << 20);
    assert_eq!(f.thaws.load(Ordering::SeqCst), 0);
    // Once swap has room, the next try goes through.
    f.reclaim_fails.store(false, Ordering::SeqCst);
    until_state(&lc, "s1", IdleState::Reclaimed).await;
}

#[tokio::test]
async fn a_frozen_sandbox_is_adopted_frozen_and_reaped_without_a_wake() {
    // Reclaimed (2 ms) long before the idle timeout, even when the rounds
    // of a loaded machine are late.
    let (lc, f, b) = freezing(Some(Duration::from_millis(500)));
    lc.create(req("s1", "t")).await.unwrap();
    until_state(&lc, "s1", IdleState::Reclaimed).await;
    // A restarted daemon adopts it as the backend has it.
    let again = Lifecycle::new(b.clone(), lc.settings().clone(), Arc::new(Metrics::new()));
    again.adopt_existing().await.unwrap();
    assert_eq!(idle_state(&again, "s1").await, IdleState::Reclaimed);
    // The reaper deletes it past the idle timeout, no wake.
    while again.tracked_count() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        again.check_idle().await;
    }
    assert_eq!(again.metrics().reaped.get(), 1);
    assert_eq!(f.thaws.load(Ordering::SeqCst), 0);
}
