//! The `memory` backend (tests only): a registry of sandboxes whose HTTP
//! server is a real upstream named by `MEMORY_SANDBOX_URL_TEMPLATE`
//! (e.g. `http://127.0.0.1:9000/{sandbox_id}`), as the old provisioner's
//! test backend did, so the proxy can be tested against a real server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpStream;

use super::{Backend, BackendError, Running, SandboxRef, Upstream};
use crate::model::{new_generation, unix_now, SandboxRecord, SandboxSpec, SandboxStatus};

pub struct MemoryBackend {
    template: String,
    /// Artificial create latency (widens races in tests).
    create_delay: Duration,
    sandboxes: Mutex<HashMap<String, SandboxRecord>>,
}

/// `http://host:port/path` split into its authority and path.
fn split_url(url: &str) -> Result<(String, String), BackendError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        BackendError::Internal(format!("memory URL {url:?} must start with http://").into())
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(BackendError::Internal(
            format!("memory URL {url:?} has no host").into(),
        ));
    }
    Ok((
        authority.to_string(),
        path.trim_end_matches('/').to_string(),
    ))
}

impl MemoryBackend {
    pub fn new(template: &str, create_delay: Duration) -> Result<Self, BackendError> {
        split_url(&template.replace("{sandbox_id}", "x"))?;
        Ok(MemoryBackend {
            template: template.to_string(),
            create_delay,
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    fn url_of(&self, id: &str) -> String {
        self.template.replace("{sandbox_id}", id)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, SandboxRecord>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks sandbox `id` exited, as a real backend does when its PID 1
    /// dies (tests); false when there is none.
    pub fn exit(&self, id: &str) -> bool {
        match self.map().get_mut(id) {
            Some(r) => {
                r.status = SandboxStatus::Exited;
                true
            }
            None => false,
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn create(
        &self,
        spec: &SandboxSpec,
        _health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        if !self.create_delay.is_zero() {
            // What a test waits on to know the create passed the lifecycle's
            // gates and is held here.
            tracing::info!(sandbox_id = %spec.sandbox_id, delay_ms = self.create_delay.as_millis() as u64,
                           "memory backend: create held for its delay");
            tokio::time::sleep(self.create_delay).await;
        }
        let record = SandboxRecord {
            sandbox_id: spec.sandbox_id.clone(),
            generation: new_generation(),
            identity: spec.identity.clone(),
            status: SandboxStatus::Running,
            created_at: unix_now(),
            oom_killed: None,
            idle: None,
        };
        self.map().insert(spec.sandbox_id.clone(), record.clone());
        Ok(record)
    }

    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        Ok(self.map().values().cloned().collect())
    }

    async fn running(&self, sandbox: &SandboxRef) -> Running {
        let running = self.map().get(&sandbox.sandbox_id).is_some_and(|r| {
            r.generation == sandbox.generation && r.status == SandboxStatus::Running
        });
        running.into()
    }

    async fn status(&self, sandboxes: &[SandboxRef]) -> Vec<Option<SandboxRecord>> {
        let map = self.map();
        sandboxes
            .iter()
            .map(|s| {
                map.get(&s.sandbox_id)
                    .filter(|r| r.generation == s.generation)
                    .cloned()
            })
            .collect()
    }

    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError> {
        let mut map = self.map();
        match map.get(sandbox_id) {
            Some(r) if r.generation != generation => Err(BackendError::Conflict(
                format!("sandbox {sandbox_id} is at another generation").into(),
            )),
            Some(_) => {
                map.remove(sandbox_id);
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn connect(&self, sandbox: &SandboxRef) -> Result<Upstream, BackendError> {
        let (authority, _) = split_url(&self.url_of(&sandbox.sandbox_id))?;
        let stream = TcpStream::connect(&authority)
            .await
            .map_err(|e| BackendError::Unreachable(format!("{authority}: {e}").into()))?;
        let _ = stream.set_nodelay(true);
        Ok(Upstream { stream })
    }

    fn path_prefix(&self, sandbox: &SandboxRef) -> String {
        split_url(&self.url_of(&sandbox.sandbox_id))
            .map(|(_, p)| p)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://127.0.0.1:9/a/b/").unwrap(),
            ("127.0.0.1:9".to_string(), "/a/b".to_string())
        );
        assert_eq!(
            split_url("http://h:1").unwrap(),
            ("h:1".to_string(), String::new())
        );
        assert!(split_url("https://h").is_err());
        assert!(MemoryBackend::new("ftp://x", Duration::ZERO).is_err());
    }
}
