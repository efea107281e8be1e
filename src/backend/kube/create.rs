//! The create path: POST the Pod (recovering from 409 AlreadyExists with an
//! identity check), POST its Service, wait for the Pod to be Ready, and on
//! any failure remove what was made (Pod fenced on its UID, Service fenced
//! on its owner).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, PostParams, Preconditions, PropagationPolicy};
use tracing::{debug, info, warn};

use super::error::api_code;
use super::status::{self, PodState};
use super::{names, spec, KubeBackend, KubeError};
use crate::model::SandboxSpec;

/// First and largest pause between readiness polls.
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_millis(1000);

/// Delete parameters fenced on `uid` (the API server refuses with 409
/// when the object has another UID).
pub fn fenced(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    }
}

/// The pod UID a Service is owned by.
pub fn service_owner(svc: &Service) -> Option<&str> {
    svc.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Pod")
        .map(|o| o.uid.as_str())
}

pub fn node_port(svc: &Service) -> Option<u16> {
    let p = svc.spec.as_ref()?.ports.as_ref()?.first()?.node_port?;
    u16::try_from(p).ok()
}

impl KubeBackend {
    /// Creates (or adopts) the Pod of `spec`; returns it with its UID.
    pub(super) async fn ensure_pod(
        &self,
        spec: &SandboxSpec,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Pod, KubeError> {
        let id = &spec.sandbox_id;
        let name = names::object_name(id);
        let pod = spec::build_pod(spec, &self.spec);
        let mut pause = POLL_MIN;
        loop {
            let existing = match self.pods.create(&PostParams::default(), &pod).await {
                Ok(p) => return Ok(p),
                Err(e) if api_code(&e) == Some(409) => self
                    .pods
                    .get_opt(&name)
                    .await
                    .map_err(|e| KubeError::api("get", "pod", &name, e))?,
                Err(e) => return Err(KubeError::api("create", "pod", &name, e)),
            };
            if let Some(existing) = existing {
                let uid = status::uid(&existing).unwrap_or_default().to_string();
                let state = status::pod_state(&existing);
                if existing.metadata.deletion_timestamp.is_some() {
                    debug!(pod = %name, "waiting for a terminating pod of this name to go");
                } else {
                    let same = existing
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(names::identity_from_annotations)
                        .is_some_and(|(eid, ident)| &eid == id && ident == spec.identity);
                    if !same {
                        return Err(KubeError::IdentityMismatch(id.clone()));
                    }
                    if state != PodState::Ended {
                        info!(pod = %name, generation = %uid, "pod already exists with this identity: adopting it");
                        return Ok(existing);
                    }
                    info!(pod = %name, generation = %uid, "replacing an ended pod of this identity");
                    match self.pods.delete(&name, &fenced(&uid)).await {
                        Ok(_) => {}
                        Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                        Err(e) => return Err(KubeError::api("delete", "pod", &name, e)),
                    }
                }
            }
            if Instant::now() + pause >= deadline {
                return Err(KubeError::NotReady(id.clone(), timeout));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Creates the Service of the Pod `pod_uid` (or finds it); a leftover
    /// Service owned by another Pod is removed first.
    pub(super) async fn ensure_service(
        &self,
        id: &str,
        pod_uid: &str,
    ) -> Result<Service, KubeError> {
        let name = names::object_name(id);
        let svc = spec::build_service(id, pod_uid, &self.spec);
        for _ in 0..5 {
            let existing = match self.services.create(&PostParams::default(), &svc).await {
                Ok(s) => return Ok(s),
                Err(e) if api_code(&e) == Some(409) => self
                    .services
                    .get_opt(&name)
                    .await
                    .map_err(|e| KubeError::api("get", "service", &name, e))?,
                Err(e) => return Err(KubeError::api("create", "service", &name, e)),
            };
            let Some(existing) = existing else { continue };
            if service_owner(&existing) == Some(pod_uid) {
                return Ok(existing);
            }
            let svc_uid = existing.metadata.uid.clone().unwrap_or_default();
            info!(service = %name, "removing a leftover service of an earlier incarnation");
            match self.services.delete(&name, &fenced(&svc_uid)).await {
                Ok(_) => {}
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => return Err(KubeError::api("delete", "service", &name, e)),
            }
            tokio::time::sleep(POLL_MIN).await;
        }
        Err(KubeError::Config(format!(
            "service {name} keeps conflicting with another object"
        )))
    }

    /// Polls the Pod until it is Ready (returns it), ends, or `deadline`.
    pub(super) async fn wait_ready(
        &self,
        id: &str,
        uid: &str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Pod, KubeError> {
        let name = names::object_name(id);
        let mut pause = POLL_MIN;
        loop {
            // Never wait on one call past the deadline.
            let left = deadline.saturating_duration_since(Instant::now()) + POLL_MIN;
            let pod = tokio::time::timeout(left, self.pods.get_opt(&name))
                .await
                .map_err(|_| KubeError::NotReady(id.to_string(), timeout))?
                .map_err(|e| KubeError::api("get", "pod", &name, e))?;
            let Some(pod) = pod.filter(|p| status::uid(p) == Some(uid)) else {
                return Err(KubeError::Ended(name));
            };
            self.cache.observe(id, &pod);
            match status::pod_state(&pod) {
                PodState::Ready => return Ok(pod),
                PodState::Starting => {}
                PodState::Ended => return Err(KubeError::Ended(name)),
                PodState::UnsafeUserDir => return Err(KubeError::UnsafeUserDir(id.to_string())),
                PodState::BadWorkdir => {
                    let workdir = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(names::ANN_WORKDIR).cloned())
                        .unwrap_or_default();
                    return Err(KubeError::BadWorkdir {
                        id: id.to_string(),
                        workdir,
                    });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(KubeError::NotReady(id.to_string(), timeout));
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Removes what a failed create made: the Pod (fenced on `uid`) and
    /// its Service. Failures are logged; the caller reports the cause.
    pub(super) async fn cleanup(&self, id: &str, uid: &str) {
        if let Err(e) = self.delete_fenced(id, uid).await {
            warn!(sandbox_id = %id, generation = %uid, error = %e, "cleanup after a failed create failed");
        }
    }

    /// Runs the whole create: Pod, Service, readiness; cleans up on error.
    pub(super) async fn create_inner(
        &self,
        spec: &SandboxSpec,
        timeout: Duration,
    ) -> Result<Pod, KubeError> {
        let deadline = Instant::now() + timeout;
        let pod = self.ensure_pod(spec, deadline, timeout).await?;
        let id = &spec.sandbox_id;
        let uid = status::uid(&pod).unwrap_or_default().to_string();
        let rest = async {
            let svc = self.ensure_service(id, &uid).await?;
            let pod = self.wait_ready(id, &uid, deadline, timeout).await?;
            if let Some(port) = node_port(&svc) {
                self.cache.set_node_port(id, &uid, port);
            }
            Ok(pod)
        };
        match rest.await {
            Ok(pod) => Ok(pod),
            Err(e) => {
                warn!(sandbox_id = %id, generation = %uid, error = %e, "create failed: removing the pod and service");
                self.cleanup(id, &uid).await;
                Err(e)
            }
        }
    }
}
