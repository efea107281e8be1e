//! Per-id serialization and operation pins.
//!
//! Every sandbox id that is being operated on has a slot with two locks:
//! - `op`: serializes create/delete of that id;
//! - `pins`: proxy requests hold it shared for their whole exchange (until
//!   the response body is finished); a delete takes it exclusively, so it
//!   waits for in-flight requests and, because tokio's `RwLock` is fair,
//!   new requests queue behind the delete.
//!
//! Different ids have different slots and never wait for each other. A slot
//! is dropped from the map when nobody holds it any more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, OwnedRwLockReadGuard, RwLock};

#[derive(Default)]
struct Slot {
    op: Arc<AsyncMutex<()>>,
    pins: Arc<RwLock<()>>,
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

/// A proxy request's guard: holds the id's pin lock shared. Owns its slot
/// reference so it can outlive the borrow of the lock table (it travels
/// with a response body).
pub struct ProxyGuard {
    _guard: OwnedRwLockReadGuard<()>,
    _slot: OwnedSlot,
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

impl IdLocks {
    fn acquire(&self, id: &str) -> Arc<Slot> {
        let mut map = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id.to_string()).or_default().clone()
    }

    fn release(&self, id: &str, slot: Arc<Slot>) {
        let mut map = self.slots.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Waits until no proxy request of `id` is in flight and blocks new ones
    /// until the returned guard is dropped.
    pub async fn exclusive(slot: &SlotRef<'_>) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        let pins = slot
            .slot
            .as_ref()
            .expect("slot present while referenced")
            .pins
            .clone();
        pins.write_owned().await
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
        ProxyGuard {
            _guard: guard,
            _slot: owned,
        }
    }

    /// Number of ids with a live slot (tests and leak checks).
    pub fn live_slots(&self) -> usize {
        self.slots.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn slots_are_released() {
        let locks = Arc::new(IdLocks::default());
        {
            let (_r, _g) = locks.operation("a").await;
            let _p = locks.pin("b").await;
            assert_eq!(locks.live_slots(), 2);
        }
        assert_eq!(locks.live_slots(), 0);
    }

    #[tokio::test]
    async fn exclusive_waits_for_pins_and_blocks_new_ones() {
        let locks = Arc::new(IdLocks::default());
        let pin = locks.pin("a").await;
        let l2 = locks.clone();
        let deleter = tokio::spawn(async move {
            let (r, _g) = l2.operation("a").await;
            let _w = IdLocks::exclusive(&r).await;
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
}
