//! The create path, in this order: remove a legacy provisioner Pod of the
//! id; POST the Pod (recovering from 409 AlreadyExists with an identity
//! check; checking that `hostUsers: false` survived); then, owned by the
//! Pod's UID, the Secret holding the agent credential, the NetworkPolicy
//! and the Service; wait for the Pod to be Ready. On any failure after the
//! Pod exists, everything is removed (Pod fenced on its UID, each other
//! object fenced on its own UID and only if that Pod owns it).
//!
//! The Secret comes after the Pod because its owner reference needs the
//! Pod's UID. That is safe: the sandbox container reads it through
//! `secretKeyRef`, and the kubelet does not start a container whose
//! referenced Secret does not exist yet (it retries), so the agent never
//! runs without its credential.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, PostParams, Preconditions, PropagationPolicy};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::error::api_code;
use super::status::{self, PodState};
use super::{legacy, names, spec, KubeBackend, KubeError};
use crate::backend::AgentCredential;
use crate::model::SandboxSpec;
use sandbox_abi::credential;

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

/// The pod UID an object is owned by.
pub fn pod_owner<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta()
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

pub fn cluster_ip(svc: &Service) -> Option<String> {
    svc.spec
        .as_ref()?
        .cluster_ip
        .clone()
        .filter(|ip| !ip.is_empty() && ip != "None")
}

/// The credential a Secret holds, if it is well-formed.
pub fn secret_credential(secret: &Secret) -> Option<AgentCredential> {
    let bytes = &secret.data.as_ref()?.get(credential::SECRET_KEY)?.0;
    let s = String::from_utf8(bytes.clone()).ok()?;
    (s.len() >= credential::MIN_LEN && s.bytes().all(|b| b.is_ascii_graphic()))
        .then_some(AgentCredential(s))
}

/// Creates `obj` (owned by the Pod `pod_uid`) or finds it; a leftover of
/// another incarnation with that name is removed first.
pub(super) async fn ensure_owned<K>(
    api: &Api<K>,
    kind: &'static str,
    obj: &K,
    pod_uid: &str,
) -> Result<K, KubeError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    for _ in 0..5 {
        let existing = match api.create(&PostParams::default(), obj).await {
            Ok(s) => return Ok(s),
            Err(e) if api_code(&e) == Some(409) => api
                .get_opt(&name)
                .await
                .map_err(|e| KubeError::api("get", kind, &name, e))?,
            Err(e) => return Err(KubeError::api("create", kind, &name, e)),
        };
        let Some(existing) = existing else { continue };
        if pod_owner(&existing) == Some(pod_uid) {
            return Ok(existing);
        }
        let uid = existing.meta().uid.clone().unwrap_or_default();
        info!(kind, name = %name, "removing a leftover object of an earlier incarnation");
        match api.delete(&name, &fenced(&uid)).await {
            Ok(_) => {}
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
            Err(e) => return Err(KubeError::api("delete", kind, &name, e)),
        }
        tokio::time::sleep(POLL_MIN).await;
    }
    Err(KubeError::Config(format!(
        "{kind} {name} keeps conflicting with another object"
    )))
}

/// Deletes the object `name` if the Pod `pod_uid` owns it (fenced on its
/// own UID); absent objects are fine.
pub(super) async fn delete_owned<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    pod_uid: &str,
) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let obj = api
        .get_opt(name)
        .await
        .map_err(|e| KubeError::api("get", kind, name, e))?;
    let Some(obj) = obj else { return Ok(()) };
    if pod_owner(&obj) != Some(pod_uid) {
        // Another incarnation's: not ours to remove.
        return Ok(());
    }
    let uid = obj.meta().uid.clone().unwrap_or_default();
    match api.delete(name, &fenced(&uid)).await {
        Ok(_) => Ok(()),
        Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
        Err(e) => Err(KubeError::api("delete", kind, name, e)),
    }
}

/// Whether the API server's answer to a Pod POST is about `hostUsers`.
fn refuses_host_users(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if matches!(r.code, 400 | 422) && r.message.contains("hostUsers"))
}

impl KubeBackend {
    /// Deletes the replaced provisioner's Pod and Service of `id`, if any.
    pub(super) async fn remove_legacy(&self, id: &str) -> Result<(), KubeError> {
        let selector = &self.legacy_selector;
        if selector.is_empty() {
            return Ok(());
        }
        let name = names::legacy_name(id);
        if let Some(pod) = self
            .pods
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::api("get", "pod", &name, e))?
            .filter(|p| legacy::matches(selector, p.metadata.labels.as_ref()))
        {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            info!(pod = %name, generation = %uid, "deleting the replaced provisioner's pod of this id");
            match self.pods.delete(&name, &fenced(&uid)).await {
                Ok(_) => {}
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => return Err(KubeError::api("delete", "pod", &name, e)),
            }
        }
        self.remove_legacy_service(id).await?;
        self.forget_legacy(id);
        Ok(())
    }

    /// Deletes the replaced provisioner's Service of `id`, if any.
    pub(super) async fn remove_legacy_service(&self, id: &str) -> Result<(), KubeError> {
        let name = names::legacy_name(id);
        if let Some(svc) = self
            .services
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::api("get", "service", &name, e))?
            .filter(|s| legacy::matches(&self.legacy_selector, s.metadata.labels.as_ref()))
        {
            let uid = svc.metadata.uid.clone().unwrap_or_default();
            match self.services.delete(&name, &fenced(&uid)).await {
                Ok(_) => {}
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => return Err(KubeError::api("delete", "service", &name, e)),
            }
        }
        Ok(())
    }

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
                Ok(p) => return self.check_host_users(p).await,
                Err(e) if refuses_host_users(&e) => {
                    return Err(KubeError::HostUsersRefused("refused"))
                }
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

    /// An API server without user-namespace support drops `hostUsers`
    /// from what it stores: that Pod is removed and the create fails,
    /// never run without the user namespace the operator asked for.
    async fn check_host_users(&self, pod: Pod) -> Result<Pod, KubeError> {
        let kept = pod.spec.as_ref().and_then(|s| s.host_users) == Some(false);
        if !self.spec.user_namespaces || kept {
            return Ok(pod);
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = status::uid(&pod).unwrap_or_default().to_string();
        warn!(pod = %name, "the API server dropped hostUsers=false: removing the pod");
        match self.pods.delete(&name, &fenced(&uid)).await {
            Ok(_) => {}
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
            Err(e) => return Err(KubeError::api("delete", "pod", &name, e)),
        }
        Err(KubeError::HostUsersRefused("dropped"))
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
                PodState::NotWritable => return Err(KubeError::NotWritable(id.to_string())),
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
    /// the objects it owns. Failures are logged; the caller reports the
    /// cause.
    pub(super) async fn cleanup(&self, id: &str, uid: &str) {
        if let Err(e) = self.delete_fenced(id, uid).await {
            warn!(sandbox_id = %id, generation = %uid, error = %e, "cleanup after a failed create failed");
        }
    }

    /// The objects owned by the Pod `uid`: Secret (returns its credential),
    /// NetworkPolicy, Service; then readiness.
    async fn ensure_owned_objects(
        &self,
        spec: &SandboxSpec,
        uid: &str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(Pod, AgentCredential), KubeError> {
        let id = &spec.sandbox_id;
        let objects = spec::build_objects(spec, uid, &credential::generate(), &self.spec);
        let secret = ensure_owned(&self.secrets, "secret", &objects.secret, uid).await?;
        let cred = secret_credential(&secret).ok_or_else(|| KubeError::Credential {
            id: id.clone(),
            reason: "its secret holds no credential".into(),
        })?;
        self.cache.set_credential(id, uid, cred.clone());
        if let Some(np) = &objects.network_policy {
            ensure_owned(&self.netpols, "networkpolicy", np, uid).await?;
        }
        let svc = ensure_owned(&self.services, "service", &objects.service, uid).await?;
        let pod = self.wait_ready(id, uid, deadline, timeout).await?;
        self.cache
            .set_service(id, uid, node_port(&svc), cluster_ip(&svc));
        Ok((pod, cred))
    }

    /// Runs the whole create; cleans up on error.
    pub(super) async fn create_inner(
        &self,
        spec: &SandboxSpec,
        timeout: Duration,
    ) -> Result<Pod, KubeError> {
        let deadline = Instant::now() + timeout;
        self.remove_legacy(&spec.sandbox_id).await?;
        let pod = self.ensure_pod(spec, deadline, timeout).await?;
        let id = &spec.sandbox_id;
        let uid = status::uid(&pod).unwrap_or_default().to_string();
        match self
            .ensure_owned_objects(spec, &uid, deadline, timeout)
            .await
        {
            Ok((pod, _)) => Ok(pod),
            Err(e) => {
                warn!(sandbox_id = %id, generation = %uid, error = %e, "create failed: removing the pod and what it owns");
                self.cleanup(id, &uid).await;
                Err(e)
            }
        }
    }
}
