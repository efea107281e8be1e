//! What the backend last saw of each sandbox's Pod and Service, so that
//! status checks (discover, reuse, reaper) and every proxied request's
//! connect do not each cost an API round trip.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::status::{self, PodState};
use crate::backend::AgentCredential;

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
    pub cluster_ip: Option<String>,
    pub credential: Option<AgentCredential>,
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
        let kept = map.get(id).filter(|e| e.generation == generation);
        let node_port = kept.and_then(|e| e.node_port);
        let cluster_ip = kept.and_then(|e| e.cluster_ip.clone());
        let credential = kept.and_then(|e| e.credential.clone());
        let entry = Entry {
            generation,
            state: status::pod_state(pod),
            oom: status::oom_killed(pod),
            pod_ip: status::pod_ip(pod).map(str::to_string),
            node_port,
            cluster_ip,
            credential,
            checked: Instant::now(),
        };
        map.insert(id.to_string(), entry.clone());
        Some(entry)
    }

    /// The entry of `id` for `generation`, made (stale, so the next status
    /// check asks) when there is none.
    fn entry_mut<'a>(
        map: &'a mut HashMap<String, Entry>,
        id: &str,
        generation: &str,
    ) -> &'a mut Entry {
        let fresh = || Entry {
            generation: generation.to_string(),
            state: PodState::Starting,
            oom: false,
            pod_ip: None,
            node_port: None,
            cluster_ip: None,
            credential: None,
            checked: Instant::now()
                .checked_sub(STATUS_TTL)
                .unwrap_or_else(Instant::now),
        };
        let e = map.entry(id.to_string()).or_insert_with(fresh);
        if e.generation != generation {
            *e = fresh();
        }
        e
    }

    /// Records the Service's node port and cluster IP (when it has them).
    pub fn set_service(
        &self,
        id: &str,
        generation: &str,
        node_port: Option<u16>,
        cluster_ip: Option<String>,
    ) {
        let mut map = self.lock();
        let e = Self::entry_mut(&mut map, id, generation);
        e.node_port = node_port.or(e.node_port);
        e.cluster_ip = cluster_ip.or(e.cluster_ip.take());
    }

    pub fn set_credential(&self, id: &str, generation: &str, c: AgentCredential) {
        let mut map = self.lock();
        Self::entry_mut(&mut map, id, generation).credential = Some(c);
    }

    /// Forgets `id` when it is (still) about `generation`.
    pub fn forget(&self, id: &str, generation: &str) {
        let mut map = self.lock();
        if map.get(id).is_some_and(|e| e.generation == generation) {
            map.remove(id);
        }
    }
}
