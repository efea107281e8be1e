//! The `kubernetes` backend: each sandbox is a Pod in one namespace, with
//! a Secret (its agent credential), a NetworkPolicy and a Service owned by
//! the Pod, made through kube-rs.
//!
//! It owns the cluster objects of sandboxes (labels `app=sandboxd-sandbox`,
//! `managed-by=sandboxd`) and nothing else: no PVC, no node state, and never
//! user files; the replaced provisioner's Pods are adopted read-only
//! ([`legacy`]). The generation of a sandbox is its Pod's UID, and every Pod
//! delete carries a UID precondition, so the API server itself refuses to
//! delete a newer incarnation. Object shapes are built by the pure
//! [`spec`] and [`netpol`] modules; [`status`] reads Pods back; [`preflight`]
//! refuses to start when the daemon could not run sandboxes safely.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use tokio::net::TcpStream;
use tracing::{info, warn, Instrument};

use super::{AgentCredential, Backend, BackendError, Running, SandboxRef, Upstream};
use crate::backend::kube_config::ConnectMode;
use crate::config::Config;
use crate::model::{SandboxRecord, SandboxSpec, SandboxStatus};

mod cache;
pub mod client;
mod create;
mod error;
pub mod legacy;
pub mod migrate;
pub mod names;
pub mod netpol;
pub mod preflight;
pub mod prepare;
pub mod spec;
pub mod status;

pub use error::KubeError;
pub use spec::SpecConfig;

use cache::Cache;

/// Bound on the one API call a status check may make.
const STATUS_CALL_TIMEOUT: Duration = Duration::from_secs(3);
use error::api_code;

pub struct KubeBackend {
    pods: Api<Pod>,
    services: Api<Service>,
    secrets: Api<Secret>,
    netpols: Api<NetworkPolicy>,
    spec: SpecConfig,
    node_host: String,
    legacy_selector: String,
    /// Legacy sandboxes seen by `list`: id → Pod UID.
    legacy: Mutex<HashMap<String, String>>,
    /// The records of the sandboxes it made or found (`create`, `list`),
    /// by id, until deleted: the backend's table, which `status` reads
    /// (their Pods' state comes from `cache`).
    records: Mutex<HashMap<String, SandboxRecord>>,
    cache: Arc<Cache>,
}

impl KubeBackend {
    /// Connects with the credentials named by `cfg` (see [`client`]) and
    /// runs the start-up checks ([`preflight`]).
    pub async fn from_config(cfg: &Config) -> Result<KubeBackend, KubeError> {
        preflight::check_config(cfg)?;
        let kcfg = client::load_config(cfg.kubernetes.kubeconfig_path.as_deref()).await?;
        let client = client::client(kcfg)?;
        preflight::check_permissions(&client, cfg).await?;
        KubeBackend::with_client(client, cfg)
    }

    /// A backend over an existing client (no start-up checks).
    pub fn with_client(client: kube::Client, cfg: &Config) -> Result<KubeBackend, KubeError> {
        let spec = SpecConfig::from_config(cfg)?;
        let ns = spec.namespace.clone();
        Ok(KubeBackend {
            pods: Api::namespaced(client.clone(), &ns),
            services: Api::namespaced(client.clone(), &ns),
            secrets: Api::namespaced(client.clone(), &ns),
            netpols: Api::namespaced(client, &ns),
            node_host: cfg.kubernetes.node_host.clone(),
            legacy_selector: cfg.kubernetes.legacy_selector.clone(),
            legacy: Mutex::new(HashMap::new()),
            records: Mutex::new(HashMap::new()),
            spec,
            cache: Arc::new(Cache::default()),
        })
    }

    fn legacy_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.legacy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget_legacy(&self, id: &str) {
        self.legacy_map().remove(id);
    }

    fn is_legacy(&self, sandbox: &SandboxRef) -> bool {
        self.legacy_map().get(&sandbox.sandbox_id) == Some(&sandbox.generation)
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `record` in the table (replacing another incarnation's).
    fn remember(&self, record: &SandboxRecord) {
        self.records()
            .insert(record.sandbox_id.clone(), record.clone());
    }

    /// Drops the record of `id` when it is of `generation`.
    fn forget_record(&self, id: &str, generation: &str) {
        let mut records = self.records();
        if records.get(id).is_some_and(|r| r.generation == generation) {
            records.remove(id);
        }
    }

    /// The status of `sandbox` (whose table record says `known`): its
    /// Pod's, from the cache or one API call when the entry is stale.
    async fn current_status(&self, sandbox: &SandboxRef, known: SandboxStatus) -> SandboxStatus {
        if self.is_legacy(sandbox) {
            return SandboxStatus::Exited;
        }
        match self.observe(sandbox).await {
            Ok(Some(e)) => status::sandbox_status(e.state),
            Ok(None) => SandboxStatus::Exited,
            Err(e) => {
                // Unknown is not "exited": that would make a create replace
                // a healthy sandbox while the API server is unreachable.
                warn!(sandbox_id = %sandbox.sandbox_id, error = %e, "status check failed; keeping the last known status");
                self.cache
                    .get(&sandbox.sandbox_id, &sandbox.generation)
                    .map(|e| status::sandbox_status(e.state))
                    .unwrap_or(known)
            }
        }
    }

    /// The latest known entry of `sandbox`'s incarnation, asking the API
    /// server only when the cached one is stale. `None`: the Pod is gone
    /// or is another incarnation. `Err`: the API server could not tell.
    async fn observe(&self, sandbox: &SandboxRef) -> Result<Option<cache::Entry>, KubeError> {
        let id = &sandbox.sandbox_id;
        if let Some(e) = self.cache.get(id, &sandbox.generation) {
            if e.fresh() {
                return Ok(Some(e));
            }
        }
        let name = names::object_name(id);
        // A status check never blocks a discover for long.
        let pod = tokio::time::timeout(STATUS_CALL_TIMEOUT, self.pods.get_opt(&name))
            .await
            .map_err(|_| KubeError::Timeout {
                op: "get",
                name: name.clone(),
            })?
            .map_err(|e| KubeError::api("get", "pod", &name, e))?;
        match pod {
            Some(p) if status::uid(&p) == Some(sandbox.generation.as_str()) => {
                Ok(self.cache.observe(id, &p))
            }
            _ => {
                self.cache.forget(id, &sandbox.generation);
                Ok(None)
            }
        }
    }

    /// Deletes the Pod fenced on `generation`, then the Service, Secret and
    /// NetworkPolicy that this Pod owns (the garbage collector would remove
    /// them too, later). Absent objects are fine. A legacy sandbox's Pod
    /// and Service go the same way.
    async fn delete_fenced(&self, id: &str, generation: &str) -> Result<(), KubeError> {
        let legacy = self.legacy_map().get(id) == Some(&generation.to_string());
        if legacy {
            let pod_name = names::legacy_name(id);
            match self
                .pods
                .delete(&pod_name, &create::fenced(generation))
                .await
            {
                Ok(_) => info!(pod = %pod_name, "pod of the replaced provisioner deleted"),
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) if api_code(&e) == Some(409) => {
                    return Err(KubeError::Fenced {
                        name: pod_name,
                        generation: generation.to_string(),
                    })
                }
                Err(e) => return Err(KubeError::api("delete", "pod", &pod_name, e)),
            }
            self.remove_legacy_service(id).await?;
            self.forget_legacy(id);
            self.forget_record(id, generation);
            return Ok(());
        }
        let name = names::object_name(id);
        match self.pods.delete(&name, &create::fenced(generation)).await {
            Ok(_) => info!(pod = %name, "pod deleted"),
            Err(e) if api_code(&e) == Some(404) => info!(pod = %name, "pod already gone"),
            Err(e) if api_code(&e) == Some(409) => {
                return Err(KubeError::Fenced {
                    name,
                    generation: generation.to_string(),
                })
            }
            Err(e) => return Err(KubeError::api("delete", "pod", &name, e)),
        }
        self.cache.forget(id, generation);
        self.forget_record(id, generation);
        create::delete_owned(&self.services, "service", &name, generation).await?;
        create::delete_owned(&self.secrets, "secret", &name, generation).await?;
        if self.spec.network.is_some() {
            create::delete_owned(&self.netpols, "networkpolicy", &name, generation).await?;
        }
        Ok(())
    }

    /// The Service of `sandbox` (node port and cluster IP cached).
    async fn service_entry(&self, sandbox: &SandboxRef) -> Result<cache::Entry, KubeError> {
        let id = &sandbox.sandbox_id;
        if let Some(e) = self
            .cache
            .get(id, &sandbox.generation)
            .filter(|e| e.node_port.is_some() || e.cluster_ip.is_some())
        {
            return Ok(e);
        }
        let name = names::object_name(id);
        let svc = self
            .services
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::api("get", "service", &name, e))?
            .filter(|s| create::pod_owner(s) == Some(sandbox.generation.as_str()))
            .ok_or_else(|| KubeError::Unreachable {
                id: id.clone(),
                reason: "its service is gone".into(),
            })?;
        self.cache.set_service(
            id,
            &sandbox.generation,
            create::node_port(&svc),
            create::cluster_ip(&svc),
        );
        self.cache
            .get(id, &sandbox.generation)
            .ok_or_else(|| KubeError::Unreachable {
                id: id.clone(),
                reason: "its service is gone".into(),
            })
    }

    async fn connect_inner(&self, sandbox: &SandboxRef) -> Result<TcpStream, KubeError> {
        let id = &sandbox.sandbox_id;
        let unreachable = |reason: &str| KubeError::Unreachable {
            id: id.clone(),
            reason: reason.to_string(),
        };
        let port = self.spec.container_port;
        let host_port = |ip: &str, port: u16| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        };
        let addr = match self.spec.connect_mode {
            ConnectMode::NodePort => {
                let p = self
                    .service_entry(sandbox)
                    .await?
                    .node_port
                    .ok_or_else(|| unreachable("its service has no node port"))?;
                host_port(&self.node_host, p)
            }
            ConnectMode::Service => {
                let ip = self
                    .service_entry(sandbox)
                    .await?
                    .cluster_ip
                    .ok_or_else(|| unreachable("its service has no cluster IP"))?;
                host_port(&ip, port)
            }
            ConnectMode::PodIp => {
                let ip = self
                    .observe(sandbox)
                    .await?
                    .and_then(|e| e.pod_ip)
                    .ok_or_else(|| unreachable("the pod has no IP"))?;
                host_port(&ip, port)
            }
        };
        TcpStream::connect(&addr)
            .await
            .map_err(|e| KubeError::Unreachable {
                id: id.clone(),
                reason: format!("{addr}: {e}"),
            })
    }

    /// The credential of `sandbox`'s incarnation: cached, else read back
    /// from its Secret (after a daemon restart), which must be owned by
    /// that very Pod.
    async fn credential(&self, sandbox: &SandboxRef) -> Result<AgentCredential, KubeError> {
        let id = &sandbox.sandbox_id;
        if let Some(c) = self
            .cache
            .get(id, &sandbox.generation)
            .and_then(|e| e.credential)
        {
            return Ok(c);
        }
        let name = names::object_name(id);
        let failed = |reason: &str| KubeError::Credential {
            id: id.clone(),
            reason: reason.to_string(),
        };
        let secret = self
            .secrets
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::api("get", "secret", &name, e))?
            .ok_or_else(|| failed("its secret is gone"))?;
        if create::pod_owner(&secret) != Some(sandbox.generation.as_str()) {
            return Err(failed("its secret belongs to another incarnation"));
        }
        let c = create::secret_credential(&secret)
            .ok_or_else(|| failed("its secret holds no credential"))?;
        self.cache
            .set_credential(id, &sandbox.generation, c.clone());
        Ok(c)
    }
}

#[async_trait]
impl Backend for KubeBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn create(
        &self,
        spec: &SandboxSpec,
        health_timeout: Duration,
    ) -> Result<SandboxRecord, BackendError> {
        let span = tracing::info_span!("kube_create", sandbox_id = %spec.sandbox_id);
        async {
            let pod = self.create_inner(spec, health_timeout).await?;
            let record = status::record_from_pod(&pod).ok_or_else(|| {
                BackendError::Internal(
                    format!(
                        "pod of sandbox {} has no uid or identity annotations",
                        spec.sandbox_id
                    )
                    .into(),
                )
            })?;
            info!(generation = %record.generation, "pod ready");
            self.remember(&record);
            Ok(record)
        }
        .instrument(span)
        .await
    }

    async fn list(&self) -> Result<Vec<SandboxRecord>, BackendError> {
        let pods = self
            .pods
            .list(&ListParams::default().labels(names::SELECTOR))
            .await
            .map_err(|e| KubeError::api("list", "pods", names::SELECTOR, e))?;
        let mut out = Vec::new();
        for pod in &pods.items {
            match status::record_from_pod(pod) {
                Some(r) => {
                    self.cache.observe(&r.sandbox_id, pod);
                    self.remember(&r);
                    out.push(r);
                }
                None => {
                    warn!(pod = ?pod.metadata.name, "labelled pod without a uid or identity annotations: ignored")
                }
            }
        }
        if !self.legacy_selector.is_empty() {
            let legacy = self
                .pods
                .list(&ListParams::default().labels(&self.legacy_selector))
                .await
                .map_err(|e| KubeError::api("list", "pods", &self.legacy_selector, e))?;
            let mut map = self.legacy_map();
            map.clear();
            for pod in &legacy.items {
                let Some(r) = legacy::record(pod) else {
                    warn!(pod = ?pod.metadata.name, "pod of the replaced provisioner not named sandbox-<id>: ignored");
                    continue;
                };
                if out.iter().any(|o| o.sandbox_id == r.sandbox_id) {
                    continue;
                }
                map.insert(r.sandbox_id.clone(), r.generation.clone());
                self.remember(&r);
                out.push(r);
            }
        }
        Ok(out)
    }

    async fn running(&self, sandbox: &SandboxRef) -> Running {
        let known = self
            .records()
            .get(&sandbox.sandbox_id)
            .filter(|r| r.generation == sandbox.generation)
            .map(|r| r.status);
        let running = match known {
            Some(k) => self.current_status(sandbox, k).await == SandboxStatus::Running,
            None => false,
        };
        running.into()
    }

    async fn status(&self, sandboxes: &[SandboxRef]) -> Vec<Option<SandboxRecord>> {
        // Each from the table, its status from the cache or one API call
        // when its entry is stale.
        let known: Vec<Option<SandboxRecord>> = {
            let records = self.records();
            sandboxes
                .iter()
                .map(|s| {
                    records
                        .get(&s.sandbox_id)
                        .filter(|r| r.generation == s.generation)
                        .cloned()
                })
                .collect()
        };
        let statuses = futures_util::future::join_all(
            sandboxes
                .iter()
                .zip(&known)
                .filter_map(|(s, r)| Some(self.current_status(s, r.as_ref()?.status))),
        )
        .await;
        let mut statuses = statuses.into_iter();
        known
            .into_iter()
            .map(|r| {
                let mut r = r?;
                r.status = statuses.next()?;
                if let Some(e) = self.cache.get(&r.sandbox_id, &r.generation) {
                    if e.oom {
                        r.oom_killed = Some(true);
                    }
                }
                Some(r)
            })
            .collect()
    }

    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError> {
        let span =
            tracing::info_span!("kube_delete", sandbox_id = %sandbox_id, generation = %generation);
        self.delete_fenced(sandbox_id, generation)
            .instrument(span)
            .await
            .map_err(BackendError::from)
    }

    async fn connect(&self, sandbox: &SandboxRef) -> Result<Upstream, BackendError> {
        if self.is_legacy(sandbox) {
            return Err(BackendError::Unreachable(
                format!(
                    "sandbox {} was made by the replaced provisioner",
                    sandbox.sandbox_id
                )
                .into(),
            ));
        }
        let stream = self.connect_inner(sandbox).await?;
        let _ = stream.set_nodelay(true);
        Ok(Upstream { stream })
    }

    async fn agent_credential(
        &self,
        sandbox: &SandboxRef,
    ) -> Result<Option<AgentCredential>, BackendError> {
        Ok(Some(self.credential(sandbox).await?))
    }

    fn rebindable(&self, sandbox: &SandboxRef) -> bool {
        self.is_legacy(sandbox)
    }
}
