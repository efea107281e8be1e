//! The discovery documents `kubectl` reads before a client-side dry run
//! (legacy `/api` and `/apis` forms): just the resources our manifests use.

use serde_json::{json, Value};

pub fn discovery(path: &str) -> Option<Value> {
    let res = |name: &str, kind: &str| {
        json!({"name": name, "singularName": "", "namespaced": true, "kind": kind,
               "verbs": ["create", "delete", "get", "list", "patch", "update"]})
    };
    Some(match path {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "rbac.authorization.k8s.io",
             "versions": [{"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"}}]}),
        "/api/v1" => json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            res("pods", "Pod"), res("services", "Service"), res("serviceaccounts", "ServiceAccount")]}),
        "/apis/rbac.authorization.k8s.io/v1" => json!({"kind": "APIResourceList",
            "groupVersion": "rbac.authorization.k8s.io/v1", "resources": [
            res("roles", "Role"), res("rolebindings", "RoleBinding")]}),
        _ => return None,
    })
}
