//! Per-id serialization and operation pins.
//!
//! Every sandbox id that is being operated on has a slot with:
//! - `op`: serializes create/delete of that id;
//! - `gate`: proxy requests pass it for their whole exchange (until the
//!   response body is finished); a delete closes it, so new requests wait
//!   from then on, and waits until the requests inside have left.
//!
//! A delete waits for in-flight requests at most a grace period: then it
//! *cancels* them. The gate counts the requests inside in one atomic word
//! with a cancellation epoch beside the count; cancelling bumps the epoch
//! and zeroes the count in one step, so the delete goes on whether or not
//! anyone still polls those requests (a client that stopped reading a
//! download never polls its body again), and a cancelled request that
//! leaves later takes nothing more off the count. The request sees the
//! cancellation through [`ProxyGuard::cancellation`] and ends its response
//! with an error.
//!
//! Passing the gate takes no lock: one compare-and-swap on the slot's own
//! word. Different ids have different slots and never wait for each other.
//! A slot is dropped from the map when nobody holds it any more; a client
//! connection may hold the slot of the sandbox it talks to between its
//! requests ([`SlotHold`], see `Lifecycle::pin_cached`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

/// How often a delete past its grace cancels the requests it waits for
/// (kept from when a request admitted just before a cancellation could
/// register right after it; the gate admits none once closed, so one
/// cancellation normally suffices).
const CANCEL_AGAIN: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The gate's word: requests inside in the low 32 bits, "closed" in bit
/// 32, the cancellation epoch in the bits above.
const COUNT: u64 = 0xffff_ffff;
const CLOSED: u64 = 1 << 32;
const EPOCH_SHIFT: u32 = 33;

fn epoch_of(state: u64) -> u64 {
    state >> EPOCH_SHIFT
}

/// Where proxy requests of one id pass and a delete of it waits.
#[derive(Default)]
struct Gate {
    state: AtomicU64,
    /// Woken when the gate opens again.
    opened: Notify,
    /// Woken when the last request inside a closed gate leaves.
    drained: Notify,
}

impl Gate {
    /// Enters unless the gate is closed; the epoch entered in.
    fn try_enter(&self) -> Option<u64> {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return None;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(epoch_of(cur)),
                Err(now) => cur = now,
            }
        }
    }

    /// Enters, waiting while the gate is closed.
    async fn enter(&self) -> u64 {
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if let Some(epoch) = self.try_enter() {
                return epoch;
            }
            opened.await;
        }
    }

    /// Leaves what was entered in `epoch`; nothing when that request was
    /// cancelled meanwhile (its share is already off the count).
    fn leave(&self, epoch: u64) {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if epoch_of(cur) != epoch {
                return;
            }
            debug_assert!(cur & COUNT > 0, "leaving an empty gate");
            match self.state.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if cur & CLOSED != 0 && cur & COUNT == 1 {
                        self.drained.notify_waiters();
                    }
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Requests inside (and not cancelled).
    fn inside(&self) -> usize {
        (self.state.load(Ordering::Acquire) & COUNT) as usize
    }

    fn is_cancelled(&self, epoch: u64) -> bool {
        epoch_of(self.state.load(Ordering::Acquire)) != epoch
    }

    /// Closes the gate: nobody enters until [`open`](Self::open). One
    /// closer at a time (the id's operation lock).
    fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
    }

    fn open(&self) {
        self.state.fetch_and(!CLOSED, Ordering::AcqRel);
        self.opened.notify_waiters();
    }

    /// Waits until nobody is inside, at most `within`.
    async fn drain(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let drained = self.drained.notified();
                tokio::pin!(drained);
                drained.as_mut().enable();
                if self.inside() == 0 {
                    return;
                }
                drained.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    /// Cancels every request inside: a new epoch, an empty count, in one
    /// step. Returns how many it cancelled.
    fn cancel(&self) -> usize {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let inside = cur & COUNT;
            if inside == 0 {
                return 0;
            }
            let next = (cur & CLOSED) | ((epoch_of(cur) + 1) << EPOCH_SHIFT);
            match self
                .state
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return inside as usize,
                Err(now) => cur = now,
            }
        }
    }
}

#[derive(Default)]
struct Slot {
    op: Arc<AsyncMutex<()>>,
    gate: Gate,
    /// Bumped on every change of the id's admitted incarnation, so that a
    /// connection that cached it knows whether it still is the
    /// current one.
    version: AtomicU64,
    /// The cancellation wakers of the client connections that hold the
    /// slot between their requests (gone with the connection's cache).
    watchers: Mutex<Vec<Weak<CancelWatch>>>,
}

impl Slot {
    /// Cancels the requests inside the gate and wakes them.
    fn cancel(&self) -> usize {
        let n = self.gate.cancel();
        if n > 0 {
            for w in lock(&self.watchers).iter().filter_map(Weak::upgrade) {
                w.waker.wake();
            }
        }
        n
    }
}

/// How a proxy request learns that a delete cancelled it: a waker
/// registered with the slot (without a lock, once it is registered). A
/// client connection that holds the slot between its requests registers
/// one for all of them; it serves one request at a time.
#[derive(Default)]
pub struct CancelWatch {
    waker: futures_util::task::AtomicWaker,
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

/// A hold on an id's slot that can outlive the borrow of the lock table:
/// what a proxy request's guard keeps, and what a client connection keeps
/// of the sandbox it talks to between requests. Shared (`Arc`): taking one
/// more costs no lock.
pub struct SlotHold {
    locks: Arc<IdLocks>,
    id: String,
    slot: Option<Arc<Slot>>,
}

impl SlotHold {
    fn slot(&self) -> &Slot {
        self.slot.as_ref().expect("slot present while held")
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The version of the id's admitted incarnation (see [`IdLocks::bump`]).
    pub fn version(&self) -> u64 {
        self.slot().version.load(Ordering::Acquire)
    }

    /// A cancellation waker for the requests of one client connection,
    /// registered with the slot while it lives.
    pub fn watch(&self) -> Arc<CancelWatch> {
        let w = Arc::new(CancelWatch::default());
        let mut watchers = lock(&self.slot().watchers);
        watchers.retain(|o| o.strong_count() > 0);
        watchers.push(Arc::downgrade(&w));
        w
    }

    /// Pins the id for a proxy request when no delete holds it; `watch`
    /// (this hold's, see [`watch`](Self::watch)) is how the request learns
    /// of a cancellation.
    pub fn try_pin(self: &Arc<Self>, watch: &Arc<CancelWatch>) -> Option<ProxyGuard> {
        let epoch = self.slot().gate.try_enter()?;
        Some(ProxyGuard {
            hold: self.clone(),
            epoch,
            watch: watch.clone(),
        })
    }

    /// Pins the id for a proxy request (waits while a delete holds it).
    pub async fn pin(self: &Arc<Self>, watch: &Arc<CancelWatch>) -> ProxyGuard {
        let epoch = self.slot().gate.enter().await;
        ProxyGuard {
            hold: self.clone(),
            epoch,
            watch: watch.clone(),
        }
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.locks.release(&self.id, slot);
        }
    }
}

/// A proxy request's guard: keeps it inside its id's gate until it is
/// dropped or a delete cancels it. Owns its slot hold so it can travel with
/// a response body.
pub struct ProxyGuard {
    hold: Arc<SlotHold>,
    epoch: u64,
    watch: Arc<CancelWatch>,
}

impl ProxyGuard {
    /// True once a delete cancelled this request (its grace ran out).
    pub fn is_cancelled(&self) -> bool {
        self.hold.slot().gate.is_cancelled(self.epoch)
    }

    /// Resolves when a delete cancels this request; owns what it needs, so
    /// it can be kept in a response body.
    pub fn cancellation(&self) -> impl Future<Output = ()> + Send + 'static {
        let hold = self.hold.clone();
        let epoch = self.epoch;
        let watch = self.watch.clone();
        // Registered, then checked: a cancellation after the check wakes
        // the waker registered before it.
        std::future::poll_fn(move |cx| {
            watch.waker.register(cx.waker());
            if hold.slot().gate.is_cancelled(epoch) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        self.hold.slot().gate.leave(self.epoch);
    }
}

/// A delete's exclusive hold on an id: no proxy request of it is in flight
/// and new ones wait until it is dropped.
pub struct Exclusive {
    slot: Arc<Slot>,
    /// In-flight requests cancelled because the grace ran out.
    pub cancelled: usize,
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        self.slot.gate.open();
    }
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

    /// Notes a change of `id`'s admitted incarnation: a connection holding its
    /// slot with an older version reads it again. Nothing when
    /// nobody holds the slot (nobody cached anything of it).
    pub fn bump(&self, id: &str) {
        if let Some(s) = lock(&self.slots).get(id) {
            s.version.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A hold on `id`'s slot (made if there is none).
    pub fn hold(self: &Arc<Self>, id: &str) -> Arc<SlotHold> {
        Arc::new(SlotHold {
            locks: self.clone(),
            id: id.to_string(),
            slot: Some(self.acquire(id)),
        })
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
        slot.gate.close();
        let inflight = slot.gate.inside();
        if inflight > 0 {
            tracing::info!(
                inflight,
                grace_ms = grace.as_millis() as u64,
                "delete waits for in-flight proxy requests"
            );
        }
        let mut x = Exclusive {
            slot: slot.clone(),
            cancelled: 0,
        };
        if slot.gate.drain(grace).await {
            return x;
        }
        loop {
            x.cancelled += slot.cancel();
            if slot.gate.drain(CANCEL_AGAIN).await {
                return x;
            }
        }
    }

    /// Like [`exclusive`](Self::exclusive) but never cancels anything:
    /// `None` when requests are still in flight after `within` (new ones
    /// waited meanwhile and go on).
    pub async fn exclusive_within(slot: &SlotRef<'_>, within: Duration) -> Option<Exclusive> {
        let slot = slot.slot.as_ref().expect("slot present while referenced");
        slot.gate.close();
        // Opens the gate again when dropped, whatever happens next.
        let x = Exclusive {
            slot: slot.clone(),
            cancelled: 0,
        };
        slot.gate.drain(within).await.then_some(x)
    }

    /// Pins `id` for a proxy request (waits while a delete holds it).
    pub async fn pin(self: &Arc<Self>, id: &str) -> ProxyGuard {
        let hold = self.hold(id);
        let watch = hold.watch();
        hold.pin(&watch).await
    }

    /// Proxy requests of `id` in flight (and not cancelled).
    pub fn inflight(&self, id: &str) -> usize {
        let map = lock(&self.slots);
        map.get(id).map_or(0, |s| s.gate.inside())
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

    #[tokio::test]
    async fn a_cancelled_request_leaving_late_takes_nothing_off() {
        let locks = Arc::new(IdLocks::default());
        let stuck = locks.pin("a").await;
        let (r, _g) = locks.operation("a").await;
        let x = IdLocks::exclusive(&r, Duration::from_millis(50)).await;
        assert_eq!(x.cancelled, 1);
        assert_eq!(locks.inflight("a"), 0);
        drop(x);
        // The gate is open again: a new request enters, in a new epoch.
        let fresh = locks.pin("a").await;
        assert!(!fresh.is_cancelled());
        assert_eq!(locks.inflight("a"), 1);
        drop(stuck);
        assert_eq!(locks.inflight("a"), 1, "a cancelled request left twice");
        drop(fresh);
        assert_eq!(locks.inflight("a"), 0);
    }

    #[tokio::test]
    async fn an_exclusive_within_that_gives_up_opens_the_gate() {
        let locks = Arc::new(IdLocks::default());
        let held = locks.pin("a").await;
        let (r, _g) = locks.operation("a").await;
        let l2 = locks.clone();
        // Queued behind the closed gate while the reaper-style hold waits.
        let waiter = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(l2.pin("a").await);
        });
        assert!(IdLocks::exclusive_within(&r, Duration::from_millis(100))
            .await
            .is_none());
        assert!(!held.is_cancelled(), "exclusive_within cancelled a request");
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("the waiting request never entered")
            .unwrap();
        drop(held);
        let x = IdLocks::exclusive_within(&r, Duration::from_millis(100)).await;
        assert!(x.is_some());
    }

    #[tokio::test]
    async fn a_watched_request_is_woken_by_the_cancellation() {
        let locks = Arc::new(IdLocks::default());
        let hold = locks.hold("a");
        let watch = hold.watch();
        let stuck = hold.try_pin(&watch).expect("the gate is open");
        let woken = tokio::spawn(stuck.cancellation());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!woken.is_finished());
        let (r, _g) = locks.operation("a").await;
        let x = IdLocks::exclusive(&r, Duration::from_millis(50)).await;
        assert_eq!(x.cancelled, 1);
        tokio::time::timeout(Duration::from_secs(1), woken)
            .await
            .expect("the watch was not woken")
            .unwrap();
        // Closed: nobody enters, not even from a hold.
        assert!(hold.try_pin(&watch).is_none());
        drop(x);
        assert!(hold.try_pin(&watch).is_some());
    }
}
