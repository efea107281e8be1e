//! Per-id serialization and operation pins.
//!
//! Every sandbox id that is being operated on has a slot with two locks:
//! - `op`: serializes create/delete of that id;
//! - `pins`: proxy requests hold it shared for their whole exchange (until
//!   the response body is finished); a delete takes it exclusively, so it
//!   waits for in-flight requests and, because tokio's `RwLock` is fair,
//!   new requests queue behind the delete.
//!
//! A delete waits for in-flight requests at most a grace period: then it
//! *cancels* them. Each request's share of `pins` lives in a [`PinState`]
//! the slot also lists, so the delete can release it from outside, whether
//! or not anyone still polls the request (a client that stopped reading a
//! download never polls its body again); the request sees the cancellation
//! through [`ProxyGuard::cancellation`] and ends its response with an error.
//!
//! Different ids have different slots and never wait for each other. A slot
//! is dropped from the map when nobody holds it any more.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{
    Mutex as AsyncMutex, Notify, OwnedMutexGuard, OwnedRwLockReadGuard, OwnedRwLockWriteGuard,
    RwLock,
};

/// How often a delete past its grace cancels the requests it waits for
/// (one admitted just before the cancellation registers right after it).
const CANCEL_AGAIN: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct Slot {
    op: Arc<AsyncMutex<()>>,
    pins: Arc<RwLock<()>>,
    /// The proxy requests holding `pins` shared, so that a delete whose
    /// grace ran out can cancel them.
    inflight: Mutex<Vec<Arc<PinState>>>,
}

impl Slot {
    /// Cancels every in-flight request; returns how many it cancelled.
    fn cancel_inflight(&self) -> usize {
        let pins: Vec<Arc<PinState>> = lock(&self.inflight).clone();
        pins.iter().filter(|p| p.cancel()).count()
    }
}

#[derive(Default)]
pub struct IdLocks {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

/// Held while an operation owns a slot; releases the map entry on drop when
/// it was the last user.
pub struct SlotRef<'a> {
    locks: &'a IdLocks,
    id: String,
    slot: Option<Arc<Slot>>,
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.locks.release(&self.id, slot);
        }
    }
}

/// One proxy request's share of its sandbox's `pins` lock, releasable by a
/// delete that cancels the request.
struct PinState {
    guard: Mutex<Option<OwnedRwLockReadGuard<()>>>,
    cancelled: AtomicBool,
    notify: Notify,
}

impl PinState {
    /// Marks the request cancelled, releases its share of the lock and
    /// wakes whoever waits for the cancellation. False if it already was.
    fn cancel(&self) -> bool {
        if self.cancelled.swap(true, Ordering::SeqCst) {
            return false;
        }
        drop(lock(&self.guard).take());
        self.notify.notify_waiters();
        true
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// A proxy request's guard: holds the id's pin lock shared until it is
/// dropped or a delete cancels it. Owns its slot reference so it can
/// outlive the borrow of the lock table (it travels with a response body).
pub struct ProxyGuard {
    state: Arc<PinState>,
    _slot: OwnedSlot,
}

impl ProxyGuard {
    /// True once a delete cancelled this request (its grace ran out).
    pub fn is_cancelled(&self) -> bool {
        self.state.is_cancelled()
    }

    /// Resolves when a delete cancels this request; owns what it needs, so
    /// it can be kept in a response body.
    pub fn cancellation(&self) -> impl Future<Output = ()> + Send + 'static {
        let state = self.state.clone();
        async move { state.cancelled().await }
    }
}

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        if let Some(slot) = &self._slot.slot {
            lock(&slot.inflight).retain(|p| !Arc::ptr_eq(p, &self.state));
        }
        drop(lock(&self.state.guard).take());
    }
}

struct OwnedSlot {
    locks: Arc<IdLocks>,
    id: String,
    slot: Option<Arc<Slot>>,
}

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.locks.release(&self.id, slot);
        }
    }
}

/// A delete's exclusive hold on an id: no proxy request of it is in flight
/// and new ones wait until it is dropped.
pub struct Exclusive {
    _guard: OwnedRwLockWriteGuard<()>,
    /// In-flight requests cancelled because the grace ran out.
    pub cancelled: usize,
}

impl IdLocks {
    fn acquire(&self, id: &str) -> Arc<Slot> {
        let mut map = lock(&self.slots);
        if let Some(slot) = map.get(id) {
            return slot.clone();
        }
        map.entry(id.to_string()).or_default().clone()
    }

    fn release(&self, id: &str, slot: Arc<Slot>) {
        let mut map = lock(&self.slots);
        drop(slot);
        if let Some(s) = map.get(id) {
            // Only the map itself still refers to it.
            if Arc::strong_count(s) == 1 {
                map.remove(id);
            }
        }
    }

    /// Serializes create/delete of `id`: returns once no other such
    /// operation on `id` runs. The guard also keeps the slot alive.
    pub async fn operation(&self, id: &str) -> (SlotRef<'_>, OwnedMutexGuard<()>) {
        let slot = self.acquire(id);
        let op = slot.op.clone();
        let r = SlotRef {
            locks: self,
            id: id.to_string(),
            slot: Some(slot),
        };
        let g = op.lock_owned().await;
        (r, g)
    }

    /// Waits until no proxy request of `id` is in flight, at most `grace`:
    /// then cancels the ones still in flight (their responses end with an
    /// error). New requests wait from the start until the returned guard is
    /// dropped. Other ids are never involved.
    pub async fn exclusive(slot: &SlotRef<'_>, grace: Duration) -> Exclusive {
        let slot = slot.slot.as_ref().expect("slot present while referenced");
        // Queued at once (and never dropped before it is acquired), so new
        // readers wait behind it from now on.
        let acquire = slot.pins.clone().write_owned();
        tokio::pin!(acquire);
        if let Ok(guard) = tokio::time::timeout(grace, &mut acquire).await {
            return Exclusive {
                _guard: guard,
                cancelled: 0,
            };
        }
        let mut cancelled = 0;
        loop {
            cancelled += slot.cancel_inflight();
            if let Ok(guard) = tokio::time::timeout(CANCEL_AGAIN, &mut acquire).await {
                return Exclusive {
                    _guard: guard,
                    cancelled,
                };
            }
        }
    }

    /// Like [`exclusive`](Self::exclusive) but never cancels anything:
    /// `None` when requests are still in flight after `within` (new ones
    /// waited meanwhile and go on).
    pub async fn exclusive_within(slot: &SlotRef<'_>, within: Duration) -> Option<Exclusive> {
        let slot = slot.slot.as_ref().expect("slot present while referenced");
        let guard = tokio::time::timeout(within, slot.pins.clone().write_owned())
            .await
            .ok()?;
        Some(Exclusive {
            _guard: guard,
            cancelled: 0,
        })
    }

    /// Pins `id` for a proxy request (waits while a delete holds it).
    pub async fn pin(self: &Arc<Self>, id: &str) -> ProxyGuard {
        let slot = self.acquire(id);
        let pins = slot.pins.clone();
        let owned = OwnedSlot {
            locks: self.clone(),
            id: id.to_string(),
            slot: Some(slot),
        };
        let guard = pins.read_owned().await;
        let state = Arc::new(PinState {
            guard: Mutex::new(Some(guard)),
            cancelled: AtomicBool::new(false),
            notify: Notify::new(),
        });
        if let Some(slot) = &owned.slot {
            lock(&slot.inflight).push(state.clone());
        }
        ProxyGuard {
            state,
            _slot: owned,
        }
    }

    /// Proxy requests of `id` in flight (and not cancelled).
    pub fn inflight(&self, id: &str) -> usize {
        let map = lock(&self.slots);
        map.get(id).map_or(0, |s| {
            lock(&s.inflight)
                .iter()
                .filter(|p| !p.is_cancelled())
                .count()
        })
    }

    /// Number of ids with a live slot (tests and leak checks).
    pub fn live_slots(&self) -> usize {
        self.slots.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn slots_are_released() {
        let locks = Arc::new(IdLocks::default());
        {
            let (_r, _g) = locks.operation("a").await;
            let _p = locks.pin("b").await;
            assert_eq!(locks.live_slots(), 2);
            assert_eq!(locks.inflight("b"), 1);
        }
        assert_eq!(locks.live_slots(), 0);
        assert_eq!(locks.inflight("b"), 0);
    }

    #[tokio::test]
    async fn exclusive_waits_for_pins_and_blocks_new_ones() {
        let locks = Arc::new(IdLocks::default());
        let pin = locks.pin("a").await;
        let l2 = locks.clone();
        let deleter = tokio::spawn(async move {
            let (r, _g) = l2.operation("a").await;
            let x = IdLocks::exclusive(&r, LONG).await;
            assert_eq!(x.cancelled, 0);
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!deleter.is_finished(), "delete must wait for the pin");
        // A new pin queues behind the waiting delete.
        let l3 = locks.clone();
        let newcomer = tokio::spawn(async move {
            let _p = l3.pin("a").await;
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!newcomer.is_finished());
        drop(pin);
        deleter.await.unwrap();
        newcomer.await.unwrap();
        // Other ids never wait.
        let (_r, _g) = locks.operation("a").await;
        let _p = tokio::time::timeout(Duration::from_millis(100), locks.pin("b"))
            .await
            .expect("other id must not wait");
    }

    #[tokio::test]
    async fn exclusive_cancels_pins_after_the_grace() {
        let locks = Arc::new(IdLocks::default());
        // Held and never dropped: as a body nobody polls any more.
        let stuck = locks.pin("a").await;
        let watcher = tokio::spawn(stuck.cancellation());
        let other = locks.pin("b").await;
        let started = std::time::Instant::now();
        let (r, _g) = locks.operation("a").await;
        let x = IdLocks::exclusive(&r, Duration::from_millis(100)).await;
        assert_eq!(x.cancelled, 1);
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(stuck.is_cancelled());
        tokio::time::timeout(Duration::from_secs(1), watcher)
            .await
            .expect("the cancellation was not announced")
            .unwrap();
        assert!(!other.is_cancelled(), "another id's request was cancelled");
        assert_eq!(locks.inflight("a"), 0);
        assert_eq!(locks.inflight("b"), 1);
        drop(x);
        drop(stuck);
        drop((r, _g));
        drop(other);
        assert_eq!(locks.live_slots(), 0);
    }
}
