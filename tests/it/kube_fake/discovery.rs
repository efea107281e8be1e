//! The discovery documents `kubectl` reads before a client-side dry run
//! (legacy `/api` and `/apis` forms): just the resources our manifests use.

use serde_json::{json, Value};

fn res(name: &str, kind: &str, namespaced: bool) -> Value {
    json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
           "verbs": ["create", "delete", "get", "list", "patch", "update"]})
}

fn group(name: &str) -> Value {
    let gv = format!("{name}/v1");
    json!({"name": name, "versions": [{"groupVersion": gv, "version": "v1"}],
           "preferredVersion": {"groupVersion": gv, "version": "v1"}})
}

fn list(group_version: &str, resources: Vec<Value>) -> Value {
    json!({"kind": "APIResourceList", "groupVersion": group_version, "resources": resources})
}

pub fn discovery(path: &str) -> Option<Value> {
    Some(match path {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            group("rbac.authorization.k8s.io"), group("networking.k8s.io"), group("apps"),
            group("batch")]}),
        "/api/v1" => list(
            "v1",
            vec![
                res("pods", "Pod", true),
                res("services", "Service", true),
                res("serviceaccounts", "ServiceAccount", true),
                res("secrets", "Secret", true),
                res("persistentvolumeclaims", "PersistentVolumeClaim", true),
                res("configmaps", "ConfigMap", true),
                res("namespaces", "Namespace", false),
            ],
        ),
        "/apis/rbac.authorization.k8s.io/v1" => list(
            "rbac.authorization.k8s.io/v1",
            vec![
                res("roles", "Role", true),
                res("rolebindings", "RoleBinding", true),
            ],
        ),
        "/apis/networking.k8s.io/v1" => list(
            "networking.k8s.io/v1",
            vec![res("networkpolicies", "NetworkPolicy", true)],
        ),
        "/apis/apps/v1" => list(
            "apps/v1",
            vec![
                res("deployments", "Deployment", true),
                res("daemonsets", "DaemonSet", true),
            ],
        ),
        "/apis/batch/v1" => list("batch/v1", vec![res("jobs", "Job", true)]),
        _ => return None,
    })
}
