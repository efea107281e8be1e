//! What the backend last saw of each sandbox's Pod and Service, so that
//! status checks (discover, reuse, reaper) and every proxied request's
//! connect do not each cost an API round trip.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::status::{self, PodState};

/// How long an observed Pod state is trusted before a status check asks
/// the API server again.
pub const STATUS_TTL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Entry {
    pub generation: String,
    pub state: PodState,
    pub oom: bool,
    pub pod_ip: Option<String>,
    pub node_port: Option<u16>,
    pub checked: Instant,
}

impl Entry {
    pub fn fresh(&self) -> bool {
        self.checked.elapsed() < STATUS_TTL
    }
}

#[derive(Default)]
pub struct Cache {
    map: Mutex<HashMap<String, Entry>>,
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry of `id` if it is about `generation`.
    pub fn get(&self, id: &str, generation: &str) -> Option<Entry> {
        self.lock()
            .get(id)
            .filter(|e| e.generation == generation)
            .cloned()
    }

    /// Records what `pod` (of sandbox `id`) shows now; keeps a known node
    /// port of the same generation.
    pub fn observe(&self, id: &str, pod: &Pod) -> Option<Entry> {
        let generation = status::uid(pod)?.to_string();
        let mut map = self.lock();
        let node_port = map
            .get(id)
            .filter(|e| e.generation == generation)
            .and_then(|e| e.node_port);
        let entry = Entry {
            generation,
            state: status::pod_state(pod),
            oom: status::oom_killed(pod),
            pod_ip: status::pod_ip(pod).map(str::to_string),
            node_port,
            checked: Instant::now(),
        };
        map.insert(id.to_string(), entry.clone());
        Some(entry)
    }

    pub fn set_node_port(&self, id: &str, generation: &str, port: u16) {
        if let Some(e) = self.lock().get_mut(id) {
            if e.generation == generation {
                e.node_port = Some(port);
            }
        }
    }

    /// Forgets `id` when it is (still) about `generation`.
    pub fn forget(&self, id: &str, generation: &str) {
        let mut map = self.lock();
        if map.get(id).is_some_and(|e| e.generation == generation) {
            map.remove(id);
        }
    }
}
