//! Golden tests of the Pod and Service the kube backend generates
//! (serialized with k8s-openapi), explicit checks of the hardening fields,
//! and the shipped manifests: they deserialize into k8s-openapi types and
//! pass `kubectl apply --dry-run=client --validate=false` (skipped loudly
//! where kubectl is absent). Regenerate with `UPDATE_GOLDEN=1`.

use crate::kube_fake;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use sandboxd::backend::kube::spec::{build_pod, build_service, SpecConfig};
use sandboxd::config::Config;
use sandboxd::model::SandboxSpec;

const OWNER_UID: &str = "6f1c2a4e-0d0b-4c55-9a3e-5b7f0c1d2e3f";

fn config() -> Config {
    let mut cfg = Config {
        sandbox_image: "registry.example.com/sandbox:1.0".into(),
        ..Config::default()
    };
    cfg.kubernetes.namespace = "sandboxes".into();
    cfg.kubernetes.user_data_pvc = Some("sandbox-user-data".into());
    cfg.kubernetes.skills_pvc = Some("sandbox-skills".into());
    cfg
}

fn spec_of(body: serde_json::Value) -> SandboxSpec {
    let cfg = config();
    let global = BTreeMap::from([("NODE_GLOBAL".to_string(), "g".to_string())]);
    SandboxSpec::from_request(
        serde_json::from_value(body).unwrap(),
        &global,
        &cfg.limits.resources(),
    )
    .unwrap()
}

fn persistent() -> SandboxSpec {
    spec_of(
        serde_json::json!({"sandbox_id": "3f2a9c1b7d44", "thread_id": "thread-1",
        "uid": "alice", "env": {"FOO": "bar"}}),
    )
}

fn workdir() -> SandboxSpec {
    spec_of(
        serde_json::json!({"sandbox_id": "Wd_Sandbox_1", "thread_id": "thread-2",
        "uid": "bob", "workdir_path": "projects/p1", "resources": {"memory_mb": 1024, "cpus": 0.5}}),
    )
}

fn ephemeral() -> SandboxSpec {
    spec_of(
        serde_json::json!({"sandbox_id": "eph1", "thread_id": "thread-3",
        "uid": "carol", "inherit_env": false, "env": {"SECRET": "dropped"}}),
    )
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kube")
}

fn check_golden(file: &str, value: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(value).unwrap() + "\n";
    let path = golden_dir().join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, &text).unwrap();
        eprintln!("updated {}", path.display());
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        text, want,
        "{file} differs from the generated object (UPDATE_GOLDEN=1 regenerates)"
    );
}

fn pods() -> [(&'static str, Pod); 3] {
    let c = SpecConfig::from_config(&config());
    [
        ("pod-persistent.json", build_pod(&persistent(), &c)),
        ("pod-workdir.json", build_pod(&workdir(), &c)),
        ("pod-ephemeral.json", build_pod(&ephemeral(), &c)),
    ]
}

#[test]
fn golden_pods_and_service() {
    for (file, pod) in pods() {
        check_golden(file, &pod);
    }
    let c = SpecConfig::from_config(&config());
    check_golden(
        "service.json",
        &build_service("3f2a9c1b7d44", OWNER_UID, &c),
    );
}

#[test]
fn every_pod_is_hardened() {
    for (file, pod) in pods() {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false), "{file}");
        assert_eq!(spec.enable_service_links, Some(false), "{file}");
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (Some(1000), Some(1000), Some(1000)),
            "{file}"
        );
        assert_eq!(psc.run_as_non_root, Some(true), "{file}");
        let seccomp = psc.seccomp_profile.as_ref().unwrap();
        assert_eq!(seccomp.type_, "Localhost", "{file}");
        assert_eq!(
            seccomp.localhost_profile.as_deref(),
            Some("sandboxd/default.json")
        );
        let c = &spec.containers[0];
        // The agent's exec cap follows SANDBOX_EXEC_TIMEOUT_SECONDS (180 - 10).
        assert_eq!(
            c.args.as_deref(),
            Some(&["--exec-cap-seconds".to_string(), "170".to_string()][..]),
            "{file}"
        );
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{file}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{file}");
        assert_eq!(sc.run_as_non_root, Some(true), "{file}");
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(caps.add.is_none(), "{file}");
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert!(limits.contains_key("cpu") && limits.contains_key("memory"));
        let probe = c
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(probe.path.as_deref(), Some("/v1/sandbox"));
        let mounts: BTreeMap<String, _> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.mount_path.clone(), m))
            .collect();
        for p in ["/home/gem", "/tmp"] {
            let vol = &mounts[p].name;
            let v = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| &v.name == vol)
                .unwrap();
            assert!(v.empty_dir.is_some(), "{file}: {p} is not an emptyDir");
        }
        // The init container is the only root part, with 3 capabilities.
        for ic in spec.init_containers.iter().flatten() {
            let sc = ic.security_context.as_ref().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            let caps = sc.capabilities.as_ref().unwrap();
            assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
            let mut add = caps.add.clone().unwrap();
            add.sort();
            assert_eq!(add, ["CHOWN", "DAC_OVERRIDE", "FOWNER"]);
        }
    }
}

#[test]
fn mounts_follow_storage_mode() {
    let [(_, p), (_, w), (_, e)] = pods();
    let sub = |pod: &Pod, path: &str| {
        pod.spec.as_ref().unwrap().containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == path)
            .map(|m| (m.sub_path.clone(), m.read_only))
    };
    assert_eq!(
        sub(&p, "/home/gem/user-data"),
        Some((Some("shared/alice/workspace".into()), None))
    );
    assert_eq!(
        sub(&p, "/home/gem/skills"),
        Some((Some("skill-projections/alice".into()), Some(true)))
    );
    let wc = &w.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        wc.working_dir.as_deref(),
        Some("/home/gem/user-data/projects/p1")
    );
    let init_args = w.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(init_args, ["prepare", "bob", "projects/p1", "1"]);
    // Ephemeral: no PVC at all, no init step, only the fixed env.
    let es = e.spec.as_ref().unwrap();
    assert!(es
        .volumes
        .iter()
        .flatten()
        .all(|v| v.persistent_volume_claim.is_none()));
    assert!(es.init_containers.is_none());
    assert_eq!(sub(&e, "/home/gem/skills"), None);
    let env: Vec<String> = es.containers[0]
        .env
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(env, ["HOME", "USER", "USER_GID", "USER_UID"]);
}

#[test]
fn golden_files_deserialize_into_k8s_types() {
    for f in [
        "pod-persistent.json",
        "pod-workdir.json",
        "pod-ephemeral.json",
    ] {
        let text = std::fs::read_to_string(golden_dir().join(f)).unwrap();
        let pod: Pod = serde_json::from_str(&text).unwrap();
        assert!(pod.spec.is_some(), "{f}");
    }
    let text = std::fs::read_to_string(golden_dir().join("service.json")).unwrap();
    let svc: Service = serde_json::from_str(&text).unwrap();
    assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("NodePort"));
}

fn rbac_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/kubernetes/rbac.yaml")
}

#[test]
fn rbac_manifest_deserializes_and_grants_exactly_what_the_code_calls() {
    let text = std::fs::read_to_string(rbac_path()).unwrap();
    let mut kinds = Vec::new();
    let mut role = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        let kind = v["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "ServiceAccount" => {
                serde_yaml::from_value::<ServiceAccount>(v).unwrap();
            }
            "Role" => role = Some(serde_yaml::from_value::<Role>(v).unwrap()),
            "RoleBinding" => {
                serde_yaml::from_value::<RoleBinding>(v).unwrap();
            }
            other => panic!("unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding"]);
    let rules = role.unwrap().rules.unwrap();
    let grants: BTreeMap<String, Vec<String>> = rules
        .iter()
        .flat_map(|r| {
            assert_eq!(r.api_groups.as_deref(), Some(&[String::new()][..]));
            let mut verbs = r.verbs.clone();
            verbs.sort();
            r.resources
                .iter()
                .flatten()
                .map(move |res| (res.clone(), verbs.clone()))
        })
        .collect();
    assert_eq!(grants["pods"], ["create", "delete", "get", "list"]);
    assert_eq!(grants["services"], ["create", "delete", "get"]);
    assert_eq!(grants.len(), 2);
}

use serde::Deserialize;

/// `kubectl apply --dry-run=client --validate=false -f FILE` against the
/// fake API server (kubectl needs discovery even for a client dry run).
#[test]
fn kubectl_accepts_the_manifests() {
    let Some(kubectl) = ["/usr/bin/kubectl", "/usr/local/bin/kubectl"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        eprintln!("SKIPPED: kubectl not found; manifests not checked with kubectl");
        println!("SKIPPED: kubectl not found");
        return;
    };
    let fake = kube_fake::FakeApi::start();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    fake.write_kubeconfig(&kc, "sandboxes");
    let mut files = vec![rbac_path()];
    for f in [
        "pod-persistent.json",
        "pod-workdir.json",
        "pod-ephemeral.json",
        "service.json",
    ] {
        files.push(golden_dir().join(f));
    }
    for f in files {
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&kc)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(["apply", "--dry-run=client", "--validate=false", "-f"])
            .arg(&f)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl rejected {}: {}{}",
            f.display(),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("(dry run)"), "{stdout}");
    }
}
