//! Golden tests of every object the kube backend generates (Pod, Secret,
//! NetworkPolicy, Service; serialized with k8s-openapi), explicit checks of
//! the hardening fields (PSS "restricted"), and the shipped manifests of
//! `deploy/kubernetes/`: they deserialize strictly into k8s-openapi types
//! and pass `kubectl apply --dry-run=client --validate=false` (a failure
//! under `CI=true` where kubectl is absent, a loud skip elsewhere); the
//! Dockerfile's paths are checked against the build. Regenerate the golden files with `UPDATE_GOLDEN=1`.

use crate::kube_fake;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use sandboxd::backend::kube::spec::{build_objects, build_pod, SpecConfig};
use sandboxd::config::Config;
use sandboxd::model::SandboxSpec;

const OWNER_UID: &str = "6f1c2a4e-0d0b-4c55-9a3e-5b7f0c1d2e3f";
const CREDENTIAL: &str = "golden-credential-0123456789abcdef0123456789abcdef0123456789abcdef";

fn config() -> Config {
    let mut cfg = Config {
        sandbox_image: "registry.example.com/sandbox:1.0".into(),
        ..Config::default()
    };
    cfg.kubernetes.agent_image = "registry.example.com/sandboxd:1.0".into();
    cfg.kubernetes.egress_allow = vec!["10.1.2.3/32:3306".into(), "10.9.0.0/16".into()];
    cfg.kubernetes.namespace = "sandboxes".into();
    cfg.kubernetes.user_data_pvc = Some("sandbox-user-data".into());
    cfg.kubernetes.skills_pvc = Some("sandbox-skills".into());
    cfg
}

fn spec_of(body: serde_json::Value) -> SandboxSpec {
    let cfg = config();
    let global = BTreeMap::from([("NODE_GLOBAL".to_string(), "g".to_string())]);
    SandboxSpec::from_request(serde_json::from_value(body).unwrap(), &global, &cfg.limits).unwrap()
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
    let c = SpecConfig::from_config(&config()).unwrap();
    [
        ("pod-persistent.json", build_pod(&persistent(), &c)),
        ("pod-workdir.json", build_pod(&workdir(), &c)),
        ("pod-ephemeral.json", build_pod(&ephemeral(), &c)),
    ]
}

#[test]
fn golden_objects() {
    for (file, pod) in pods() {
        check_golden(file, &pod);
    }
    let c = SpecConfig::from_config(&config()).unwrap();
    let o = build_objects(&persistent(), OWNER_UID, CREDENTIAL, &c);
    check_golden("service.json", &o.service);
    check_golden("secret.json", &o.secret);
    check_golden("networkpolicy.json", &o.network_policy.unwrap());
    // Everything but the Pod is owned by it (garbage-collected with it).
    let o = build_objects(&persistent(), OWNER_UID, CREDENTIAL, &c);
    for refs in [
        &o.secret.metadata.owner_references,
        &o.service.metadata.owner_references,
        &o.network_policy.unwrap().metadata.owner_references,
    ] {
        let r = &refs.as_ref().unwrap()[0];
        assert_eq!((r.kind.as_str(), r.uid.as_str()), ("Pod", OWNER_UID));
        assert_eq!(Some(r.name.clone()), o.pod.metadata.name);
    }
}

#[test]
fn the_network_policy_admits_the_daemon_only_and_denies_private_egress() {
    let c = SpecConfig::from_config(&config()).unwrap();
    let np = build_objects(&persistent(), OWNER_UID, CREDENTIAL, &c)
        .network_policy
        .unwrap();
    let spec = np.spec.unwrap();
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_string(), "Egress".to_string()][..])
    );
    let ingress = spec.ingress.unwrap();
    assert_eq!(ingress.len(), 1);
    let from = ingress[0].from.as_ref().unwrap();
    assert_eq!(from.len(), 1);
    let pods = from[0]
        .pod_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(pods["app.kubernetes.io/name"], "sandboxd");
    let egress = spec.egress.unwrap();
    // DNS only to the cluster DNS Pods.
    let dns = &egress[0];
    let to = &dns.to.as_ref().unwrap()[0];
    assert_eq!(
        to.pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["k8s-app"],
        "kube-dns"
    );
    assert!(dns.ports.as_ref().unwrap().iter().all(
        |p| p.port == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(53))
    ));
    // The internet, minus the deny list.
    let blocks = egress[1].to.as_ref().unwrap();
    let v4 = blocks[0].ip_block.as_ref().unwrap();
    assert_eq!(v4.cidr, "0.0.0.0/0");
    let except = v4.except.as_ref().unwrap();
    for d in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
    ] {
        assert!(except.contains(&d.to_string()), "{d}");
    }
    let v6 = blocks[1].ip_block.as_ref().unwrap();
    assert_eq!(v6.cidr, "::/0");
    assert!(v6
        .except
        .as_ref()
        .unwrap()
        .contains(&"fe80::/10".to_string()));
    // The configured holes.
    let hole = egress[2].to.as_ref().unwrap()[0].ip_block.as_ref().unwrap();
    assert_eq!(hole.cidr, "10.1.2.3/32");
    assert_eq!(
        egress[2].ports.as_ref().unwrap()[0].protocol.as_deref(),
        Some("TCP")
    );
    assert_eq!(egress.len(), 4);
}

/// PSS "restricted" for a container (and what we add to it).
fn assert_restricted(file: &str, c: &k8s_openapi::api::core::v1::Container) {
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{file} {}",
        c.name
    );
    assert_eq!(sc.privileged, Some(false), "{file} {}", c.name);
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{file} {}",
        c.name
    );
    assert_eq!(sc.run_as_non_root, Some(true), "{file} {}", c.name);
    assert_eq!(sc.run_as_user, Some(1000), "{file} {}", c.name);
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(caps.add.is_none(), "{file} {}", c.name);
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert!(limits.contains_key("cpu") && limits.contains_key("memory"));
}

#[test]
fn every_pod_is_hardened() {
    for (file, pod) in pods() {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false), "{file}");
        assert_eq!(spec.enable_service_links, Some(false), "{file}");
        assert_eq!(spec.host_users, Some(false), "{file}");
        assert!(spec.host_network.is_none() && spec.host_pid.is_none() && spec.host_ipc.is_none());
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (Some(1000), Some(1000), Some(1000)),
            "{file}"
        );
        assert_eq!(psc.run_as_non_root, Some(true), "{file}");
        assert_eq!(
            psc.fs_group_change_policy.as_deref(),
            Some("OnRootMismatch")
        );
        let seccomp = psc.seccomp_profile.as_ref().unwrap();
        assert_eq!(seccomp.type_, "Localhost", "{file}");
        assert_eq!(
            seccomp.localhost_profile.as_deref(),
            Some("sandboxd/default.json")
        );
        // Every container, the init step included, is restricted: no root,
        // no capability at all.
        let inits = spec.init_containers.as_ref().unwrap();
        assert_eq!(inits.len(), 1, "{file}");
        assert_eq!(
            inits[0].image.as_deref(),
            Some("registry.example.com/sandboxd:1.0")
        );
        for c in inits.iter().chain(&spec.containers) {
            assert_restricted(file, c);
        }
        let c = &spec.containers[0];
        // The agent's exec cap follows SANDBOX_EXEC_TIMEOUT_SECONDS (180 - 10).
        let cmd = c.command.as_ref().unwrap();
        let cap = cmd
            .iter()
            .position(|a| a == "--exec-cap-seconds")
            .expect("--exec-cap-seconds");
        assert_eq!(cmd[cap + 1], "170", "{file}");
        assert_eq!(
            c.command.as_ref().unwrap()[..2],
            [
                "/.sandboxd/sandbox-agent".to_string(),
                "--listen".to_string()
            ]
        );
        assert!(c
            .command
            .as_ref()
            .unwrap()
            .contains(&"--require-credential".to_string()));
        let probe = c.readiness_probe.as_ref().unwrap();
        assert!(probe.tcp_socket.is_some() && probe.http_get.is_none());
        // The credential comes from the Pod's own Secret, never inline.
        let cred = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "SANDBOX_AGENT_CREDENTIAL")
            .unwrap();
        assert!(cred.value.is_none());
        let r = cred
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(Some(r.name.clone()), pod.metadata.name);
        // Only restricted volume types; every emptyDir size-capped; the
        // agent volume read-only in the sandbox container.
        for v in spec.volumes.iter().flatten() {
            assert!(
                v.empty_dir.is_some() || v.persistent_volume_claim.is_some(),
                "{file}: {}",
                v.name
            );
            if let Some(e) = &v.empty_dir {
                assert!(e.size_limit.is_some(), "{file}: {}", v.name);
            }
        }
        let agent = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/.sandboxd")
            .unwrap();
        assert_eq!(agent.read_only, Some(true));
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
    let init = w.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0]
        .command
        .clone()
        .unwrap();
    assert_eq!(
        init,
        [
            "/usr/local/bin/sandboxd",
            "kube",
            "prepare",
            "--agent-from=/usr/local/bin/sandbox-agent",
            "--agent-to=/.sandboxd/sandbox-agent",
            "--user-data=/pvc/user-data",
            "--uid=bob",
            "--workdir=projects/p1",
            "--skills=/pvc/skills"
        ]
    );
    // Ephemeral: no PVC at all, an init step that only installs the
    // agent, only the fixed env (and the credential reference).
    let es = e.spec.as_ref().unwrap();
    assert!(es
        .volumes
        .iter()
        .flatten()
        .all(|v| v.persistent_volume_claim.is_none()));
    let init = &es.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.command.as_ref().unwrap().len(), 5);
    assert_eq!(init.volume_mounts.as_ref().unwrap().len(), 1);
    assert_eq!(sub(&e, "/home/gem/skills"), None);
    let env: Vec<String> = es.containers[0]
        .env
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(
        env,
        [
            "HOME",
            "USER",
            "USER_GID",
            "USER_UID",
            "SANDBOX_AGENT_CREDENTIAL"
        ]
    );
}

/// Deserializes `v` into `T` strictly: k8s-openapi types ignore unknown
/// fields, so the value is serialized back and must equal the input (an
/// unknown or misspelt field, or a wrong type, makes them differ).
fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(
    what: &str,
    v: serde_json::Value,
) -> T {
    let t: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{what}: does not deserialize: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        back, v,
        "{what}: has fields its Kubernetes type does not know"
    );
    t
}

#[test]
fn golden_files_deserialize_strictly_into_k8s_types() {
    for f in [
        "pod-persistent.json",
        "pod-workdir.json",
        "pod-ephemeral.json",
    ] {
        let v =
            serde_json::from_str(&std::fs::read_to_string(golden_dir().join(f)).unwrap()).unwrap();
        let pod: Pod = strict(f, v);
        assert!(pod.spec.is_some(), "{f}");
    }
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join(f)).unwrap()).unwrap()
    };
    let svc: Service = strict("service.json", read("service.json"));
    assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
    strict::<Secret>("secret.json", read("secret.json"));
    strict::<NetworkPolicy>("networkpolicy.json", read("networkpolicy.json"));
    // The check has teeth: a misspelt field is caught.
    let mut bad = read("service.json");
    bad["spec"]["tpye"] = "NodePort".into();
    assert!(std::panic::catch_unwind(|| strict::<Service>("bad", bad)).is_err());
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

/// Every document of every manifest, strictly as its Kubernetes type.
fn documents() -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for path in manifests() {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v = serde_norway::Value::deserialize(doc).unwrap();
            let v: serde_json::Value = serde_json::to_value(v).unwrap();
            let what = format!(
                "{} {}",
                path.file_name().unwrap().to_string_lossy(),
                v["kind"].as_str().unwrap_or("?")
            );
            let kind = v["kind"].as_str().unwrap().to_string();
            match kind.as_str() {
                "Namespace" => drop(strict::<Namespace>(&what, v.clone())),
                "ServiceAccount" => drop(strict::<ServiceAccount>(&what, v.clone())),
                "Role" => drop(strict::<Role>(&what, v.clone())),
                "RoleBinding" => drop(strict::<RoleBinding>(&what, v.clone())),
                "PersistentVolumeClaim" => drop(strict::<PersistentVolumeClaim>(&what, v.clone())),
                "Deployment" => drop(strict::<Deployment>(&what, v.clone())),
                "Service" => drop(strict::<Service>(&what, v.clone())),
                "DaemonSet" => drop(strict::<DaemonSet>(&what, v.clone())),
                "Job" => drop(strict::<Job>(&what, v.clone())),
                other => panic!("{what}: unexpected kind {other}"),
            }
            out.push((kind, v));
        }
    }
    out
}

#[test]
fn deployment_manifests_deserialize_strictly_and_fit_together() {
    let docs = documents();
    let kinds: Vec<&str> = docs.iter().map(|(k, _)| k.as_str()).collect();
    for k in [
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "DaemonSet",
        "Job",
    ] {
        assert!(kinds.contains(&k), "no {k} in deploy/kubernetes: {kinds:?}");
    }
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|(k, v)| k == kind && v["metadata"]["name"] == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    // The sandbox namespace enforces PSS restricted.
    let ns = find("Namespace", "sandboxes");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    // The daemon: probes on /health, the token from a Secret, resources, and
    // the labels the sandboxes' NetworkPolicy admits by default.
    let d: Deployment = serde_json::from_value(find("Deployment", "sandboxd")).unwrap();
    let cfg = Config::default();
    let pod = d.spec.unwrap().template;
    let labels = pod.metadata.unwrap().labels.unwrap();
    for (k, v) in &cfg.kubernetes.ingress_pod_labels {
        assert_eq!(labels.get(k), Some(v));
    }
    assert_eq!(
        Some("sandboxd"),
        cfg.kubernetes
            .ingress_namespace_labels
            .get("kubernetes.io/metadata.name")
            .map(String::as_str)
    );
    let c = &pod.spec.unwrap().containers[0];
    for probe in [&c.readiness_probe, &c.liveness_probe] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some("/health"));
    }
    assert!(c.resources.as_ref().unwrap().limits.is_some());
    let token = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "SANDBOX_PROVISIONER_TOKEN")
        .unwrap();
    assert!(token.value.is_none() && token.value_from.as_ref().unwrap().secret_key_ref.is_some());
    let env = |n: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == n)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(
        env("SANDBOX_IMAGE").as_deref(),
        Some(sandboxd::backend::kube_config::DEFAULT_SANDBOX_IMAGE)
    );
    assert_eq!(
        env("SANDBOXD_IMAGE").as_deref(),
        Some(sandboxd::backend::kube_config::DEFAULT_AGENT_IMAGE)
    );
    assert_eq!(
        c.image.as_deref(),
        Some(sandboxd::backend::kube_config::DEFAULT_AGENT_IMAGE)
    );
    // The Role grants exactly what the code calls.
    let role: Role = serde_json::from_value(find("Role", "sandboxd")).unwrap();
    let grants: BTreeMap<String, Vec<String>> = role
        .rules
        .unwrap()
        .iter()
        .flat_map(|r| {
            let mut verbs = r.verbs.clone();
            verbs.sort();
            let group = r.api_groups.clone().unwrap()[0].clone();
            r.resources
                .iter()
                .flatten()
                .map(move |res| (format!("{group}/{res}"), verbs.clone()))
        })
        .collect();
    assert_eq!(grants["/pods"], ["create", "delete", "get", "list"]);
    assert_eq!(grants["/services"], ["create", "delete", "get"]);
    assert_eq!(grants["/secrets"], ["create", "delete", "get"]);
    assert_eq!(
        grants["networking.k8s.io/networkpolicies"],
        ["create", "delete", "get"]
    );
    assert_eq!(grants.len(), 4);
    // ...which covers what the daemon checks at start.
    for (verb, group, resource) in sandboxd::backend::kube::preflight::required(&cfg) {
        assert!(grants[&format!("{group}/{resource}")].contains(&verb.to_string()));
    }
    // The PVC names are the daemon's.
    find("PersistentVolumeClaim", "sandbox-user-data");
    find("PersistentVolumeClaim", "sandbox-skills");
    // The seccomp installer writes where sandbox Pods look.
    let ds = find("DaemonSet", "sandboxd-seccomp");
    assert_eq!(
        ds["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"],
        "/var/lib/kubelet/seccomp"
    );
    let args = ds["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    assert!(
        args.contains(&format!(
            "--dir=/host-seccomp/{}",
            cfg.kubernetes
                .seccomp_localhost_profile
                .trim_end_matches("/default.json")
        )),
        "{args}"
    );
    // The migration Job runs the migration over the user-data PVC.
    let job = find("Job", "sandboxd-migrate-ownership");
    let cmd = job["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    assert!(
        cmd.contains("migrate-ownership") && cmd.contains("--root=/pvc/user-data"),
        "{cmd}"
    );
    assert_eq!(
        job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "sandbox-user-data"
    );
}

use serde::Deserialize;

/// `kubectl apply --dry-run=client --validate=false -f FILE` against the
/// fake API server (kubectl needs discovery even for a client dry run).
#[test]
fn kubectl_accepts_the_manifests() {
    if !crate::common::require_tool("kubectl", "apt-get install kubernetes-client") {
        return;
    }
    let kubectl = crate::common::find_tool("kubectl").unwrap();
    let fake = kube_fake::FakeApi::start();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    fake.write_kubeconfig(&kc, "sandboxes");
    let mut files = manifests();
    for f in [
        "pod-persistent.json",
        "pod-workdir.json",
        "pod-ephemeral.json",
        "service.json",
        "secret.json",
        "networkpolicy.json",
    ] {
        files.push(golden_dir().join(f));
    }
    for f in files {
        let out = Command::new(&kubectl)
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

/// The Dockerfile cannot be built here (no container engine): check that
/// its stages and the paths it copies are those the build produces and the
/// Pods and manifests use.
#[test]
fn the_dockerfile_ships_the_binaries_the_build_makes_where_pods_look() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(
        froms[0].starts_with("FROM rust:") && froms[0].ends_with(" AS build"),
        "{}",
        froms[0]
    );
    assert!(
        froms[1].starts_with("FROM gcr.io/distroless/cc-debian12"),
        "{}",
        froms[1]
    );
    assert!(text.contains("cargo build --release --locked"));
    let bins = ["sandboxd", "sandbox-init", "sandbox-agent"];
    let copy = text
        .lines()
        .find(|l| l.starts_with("COPY --from=build"))
        .unwrap();
    let bin_dir = sandboxd::backend::kube::prepare::IMAGE_BIN_DIR;
    assert!(copy.ends_with(&format!(" {bin_dir}/")), "{copy}");
    for b in bins {
        assert!(
            text.contains(&format!("target/release/{b}")),
            "{b} is not copied out of the build"
        );
        assert!(
            copy.contains(&format!("/out/{b}")),
            "{b} is not in the image"
        );
        // The build really produces it (this test binary's profile dir).
        let built = Path::new(env!("CARGO_BIN_EXE_sandboxd")).with_file_name(b);
        assert!(built.is_file(), "{} not built", built.display());
    }
    assert!(text.contains("USER 65532:65532"));
    // Pods run the image's binaries from there.
    let c = SpecConfig::from_config(&config()).unwrap();
    let pod = build_pod(&persistent(), &c);
    let init = &pod.spec.unwrap().init_containers.unwrap()[0];
    let cmd = init.command.as_ref().unwrap();
    assert_eq!(cmd[0], format!("{bin_dir}/sandboxd"));
    assert_eq!(cmd[3], format!("--agent-from={bin_dir}/sandbox-agent"));
    // The release build names the agent like the build script installs it.
    let build_rs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("build.rs")).unwrap();
    assert!(build_rs.contains(r#"profile_dir.join("sandbox-agent")"#));
}

/// A create's `"image"` (already checked against `[images] allowed` by
/// the lifecycle) is the Pod's image and is recorded with its identity;
/// without one the node's image is used (`[images] default`, else the
/// top-level `sandbox_image`).
#[test]
fn the_create_image_is_the_pod_image() {
    let c = SpecConfig::from_config(&config()).unwrap();
    let image = |p: &Pod| {
        p.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    assert_eq!(
        image(&build_pod(&persistent(), &c)),
        "registry.example.com/sandbox:1.0"
    );
    let spec = spec_of(serde_json::json!({"sandbox_id": "img1", "thread_id": "t",
        "uid": "alice", "image": "registry.example.com/tools:2"}));
    let pod = build_pod(&spec, &c);
    assert_eq!(image(&pod), "registry.example.com/tools:2");
    let ann = pod.metadata.annotations.unwrap();
    assert_eq!(ann["sandboxd.io/image"], "registry.example.com/tools:2");
    let mut cfg = config();
    cfg.images.default = Some("registry.example.com/default:3".into());
    let c = SpecConfig::from_config(&cfg).unwrap();
    assert_eq!(
        image(&build_pod(&persistent(), &c)),
        "registry.example.com/default:3"
    );
}
