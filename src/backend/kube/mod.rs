//! The `kubernetes` backend: each sandbox is a Pod plus a Service in one
//! namespace, made through kube-rs.
//!
//! It owns the cluster objects of sandboxes (labels `app=sandboxd-sandbox`,
//! `managed-by=sandboxd`) and nothing else: no PVC, no node state, and never
//! user files. The generation of a sandbox is its Pod's UID, and every Pod
//! delete carries a UID precondition, so the API server itself refuses to
//! delete a newer incarnation. Pod/Service shapes are built by the pure
//! [`spec`] module; [`status`] reads Pods back.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use tokio::net::TcpStream;
use tracing::{info, warn, Instrument};

use super::{Backend, BackendError, Upstream};
use crate::config::{Config, ConnectMode};
use crate::model::{SandboxRecord, SandboxSpec, SandboxStatus};

mod cache;
pub mod client;
mod create;
mod error;
pub mod names;
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
    spec: SpecConfig,
    node_host: String,
    cache: Arc<Cache>,
}

impl KubeBackend {
    /// Connects with the credentials named by `cfg` (see [`client`]).
    pub async fn from_config(cfg: &Config) -> Result<KubeBackend, KubeError> {
        let kcfg = client::load_config(cfg.kubernetes.kubeconfig_path.as_deref()).await?;
        KubeBackend::with_client(client::client(kcfg)?, cfg)
    }

    /// A backend over an existing client (tests point it at a fake API
    /// server).
    pub fn with_client(client: kube::Client, cfg: &Config) -> Result<KubeBackend, KubeError> {
        let spec = SpecConfig::from_config(cfg);
        if spec.user_data_pvc.is_none() {
            warn!("USER_DATA_PVC is not set: persistent sandboxes get scratch space only");
        }
        Ok(KubeBackend {
            pods: Api::namespaced(client.clone(), &spec.namespace),
            services: Api::namespaced(client, &spec.namespace),
            node_host: cfg.kubernetes.node_host.clone(),
            spec,
            cache: Arc::new(Cache::default()),
        })
    }

    /// The latest known entry of `record`'s incarnation, asking the API
    /// server only when the cached one is stale. `None`: the Pod is gone
    /// or is another incarnation. `Err`: the API server could not tell.
    async fn observe(&self, record: &SandboxRecord) -> Result<Option<cache::Entry>, KubeError> {
        let id = &record.sandbox_id;
        if let Some(e) = self.cache.get(id, &record.generation) {
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
            Some(p) if status::uid(&p) == Some(record.generation.as_str()) => {
                Ok(self.cache.observe(id, &p))
            }
            _ => {
                self.cache.forget(id, &record.generation);
                Ok(None)
            }
        }
    }

    /// Deletes the Pod fenced on `generation`, then its Service if that
    /// Service belongs to this Pod. Absent objects are fine.
    async fn delete_fenced(&self, id: &str, generation: &str) -> Result<(), KubeError> {
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
        let svc = self
            .services
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::api("get", "service", &name, e))?;
        let Some(svc) = svc else { return Ok(()) };
        if create::service_owner(&svc) != Some(generation) {
            // Another incarnation's Service: not ours to remove.
            return Ok(());
        }
        let svc_uid = svc.metadata.uid.clone().unwrap_or_default();
        match self.services.delete(&name, &create::fenced(&svc_uid)).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(KubeError::api("delete", "service", &name, e)),
        }
    }

    /// The node port of `record`'s Service (cached, else asked for).
    async fn node_port(&self, record: &SandboxRecord) -> Result<u16, KubeError> {
        let id = &record.sandbox_id;
        if let Some(p) = self
            .cache
            .get(id, &record.generation)
            .and_then(|e| e.node_port)
        {
            return Ok(p);
        }
        let name = names::object_name(id);
        let unreachable = |reason: &str| KubeError::Unreachable {
            id: id.clone(),
            reason: reason.to_string(),
        };
        let svc = self
            .services
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::api("get", "service", &name, e))?
            .ok_or_else(|| unreachable("its service is gone"))?;
        let port =
            create::node_port(&svc).ok_or_else(|| unreachable("its service has no node port"))?;
        self.cache.set_node_port(id, &record.generation, port);
        Ok(port)
    }

    async fn connect_inner(&self, record: &SandboxRecord) -> Result<TcpStream, KubeError> {
        let id = &record.sandbox_id;
        let addr = match self.spec.connect_mode {
            ConnectMode::NodePort => {
                format!("{}:{}", self.node_host, self.node_port(record).await?)
            }
            ConnectMode::PodIp => {
                let ip = self
                    .observe(record)
                    .await?
                    .and_then(|e| e.pod_ip)
                    .ok_or_else(|| KubeError::Unreachable {
                        id: id.clone(),
                        reason: "the pod has no IP".into(),
                    })?;
                if ip.contains(':') {
                    format!("[{ip}]:{}", self.spec.container_port)
                } else {
                    format!("{ip}:{}", self.spec.container_port)
                }
            }
        };
        TcpStream::connect(&addr)
            .await
            .map_err(|e| KubeError::Unreachable {
                id: id.clone(),
                reason: format!("{addr}: {e}"),
            })
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
                BackendError::Internal(format!(
                    "pod of sandbox {} has no uid or identity annotations",
                    spec.sandbox_id
                ))
            })?;
            info!(generation = %record.generation, "pod ready");
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
                    out.push(r);
                }
                None => {
                    warn!(pod = ?pod.metadata.name, "labelled pod without a uid or identity annotations: ignored")
                }
            }
        }
        Ok(out)
    }

    async fn status(&self, record: &SandboxRecord) -> SandboxStatus {
        match self.observe(record).await {
            Ok(Some(e)) => status::sandbox_status(e.state),
            Ok(None) => SandboxStatus::Exited,
            Err(e) => {
                // Unknown is not "exited": that would make a create replace
                // a healthy sandbox while the API server is unreachable.
                warn!(sandbox_id = %record.sandbox_id, error = %e, "status check failed; keeping the last known status");
                self.cache
                    .get(&record.sandbox_id, &record.generation)
                    .map(|e| status::sandbox_status(e.state))
                    .unwrap_or(record.status)
            }
        }
    }

    async fn refresh(&self, record: &SandboxRecord) -> SandboxRecord {
        let mut r = record.clone();
        r.status = self.status(record).await;
        if let Some(e) = self.cache.get(&record.sandbox_id, &record.generation) {
            if e.oom {
                r.oom_killed = Some(true);
            }
        }
        r
    }

    async fn delete(&self, sandbox_id: &str, generation: &str) -> Result<(), BackendError> {
        let span =
            tracing::info_span!("kube_delete", sandbox_id = %sandbox_id, generation = %generation);
        self.delete_fenced(sandbox_id, generation)
            .instrument(span)
            .await
            .map_err(BackendError::from)
    }

    async fn connect(&self, record: &SandboxRecord) -> Result<Upstream, BackendError> {
        let stream = self.connect_inner(record).await?;
        let _ = stream.set_nodelay(true);
        Ok(Upstream { stream })
    }
}
