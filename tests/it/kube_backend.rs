//! The kube backend end to end: the real `sandboxd` binary with
//! `PROVISIONER_BACKEND=kubernetes`, its `KUBECONFIG_PATH` pointing at an
//! in-process fake API server (`kube_fake`), driven through the provisioner
//! HTTP API. The fake enforces what the backend relies on (409s, 404s, UID
//! preconditions, label selectors, node ports, garbage collection of owned
//! objects, access reviews); the tests drive Pod readiness. What these
//! tests prove is proven against this fake only (see docs/kubernetes.md).

use crate::common;
use crate::kube_fake;

use std::time::{Duration, Instant};

use common::{create_body, upstream, Daemon};
use kube_fake::FakeApi;
use sandboxd::backend::kube::names::object_name;
use serde_json::{json, Value};

struct Cluster {
    fake: FakeApi,
    _dir: tempfile::TempDir,
    kubeconfig: String,
}

impl Cluster {
    fn new() -> Cluster {
        let fake = FakeApi::start();
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        fake.write_kubeconfig(&kc, "sandboxes");
        Cluster {
            fake,
            kubeconfig: kc.display().to_string(),
            _dir: dir,
        }
    }

    /// The daemon's environment, `extra` last (winning).
    fn env<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env = vec![
            ("PROVISIONER_BACKEND", "kubernetes"),
            ("KUBECONFIG_PATH", self.kubeconfig.as_str()),
            ("K8S_NAMESPACE", "sandboxes"),
            ("NODE_HOST", "127.0.0.1"),
            ("USER_DATA_PVC", "sandbox-user-data"),
            ("SKILLS_PVC", "sandbox-skills"),
            ("SANDBOX_IMAGE", "registry.example.com/sandbox:1.0"),
            ("SANDBOXD_IMAGE", "registry.example.com/sandboxd:1.0"),
            ("SANDBOX_HEALTH_TIMEOUT_SECONDS", "20"),
        ];
        env.extend_from_slice(extra);
        env
    }

    fn daemon(&self, extra: &[(&str, &str)]) -> Daemon {
        Daemon::start(&self.env(extra), &[])
    }

    /// Runs `sandboxd serve` expecting it to refuse to start; its stderr.
    fn refused_start(&self, extra: &[(&str, &str)]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(dir.path())
            .env_remove("SANDBOXD_CONFIG")
            .env("SANDBOX_PROVISIONER_TOKEN", common::TOKEN);
        for (k, v) in self.env(extra) {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > end {
                let _ = child.kill();
                panic!("sandboxd started although it should have refused to");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many requests the daemon sent the fake API server that `call`
/// matches (`"METHOD path?query"`).
fn calls(c: &Cluster, call: &impl Fn(&str) -> bool) -> usize {
    c.fake.requests().iter().filter(|r| call(r)).count()
}

/// Waits until the daemon sent `more` requests that `call` matches beyond
/// the `from` counted before: it went round the loop that sends them (a
/// readiness poll, a create retried behind a terminating Pod, quiesce's
/// listing) that many times, each time finding what the test holds it to.
async fn wait_for_calls(
    c: &Cluster,
    what: &str,
    from: usize,
    more: usize,
    call: impl Fn(&str) -> bool,
) {
    wait_for(what, || calls(c, &call) >= from + more).await;
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn create_reuse_identity_list_proxy_and_delete() {
    let c = Cluster::new();
    let up = upstream::start().await;
    c.fake.auto_ready(Some("127.0.0.1"));
    let port = up.port().to_string();
    let d = c.daemon(&[("SANDBOX_CONTAINER_PORT", port.as_str())]);

    let (s, a) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("k1", "t1", "alice")),
        )
        .await;
    assert_eq!(s, 200, "{a}");
    let name = object_name("k1");
    let pod = c.fake.pod(&name).expect("pod made");
    // Generation = Pod UID.
    assert_eq!(a["generation"].as_str(), Some(uid_of(&pod).as_str()));
    assert_eq!(a["status"], "running");
    assert_eq!(pod["metadata"]["labels"]["sandbox-id"], "k1");
    assert_eq!(pod["metadata"]["annotations"]["sandboxd.io/uid"], "alice");
    let svcs = c.fake.services();
    assert_eq!(svcs.len(), 1);
    assert_eq!(
        svcs[0]["metadata"]["ownerReferences"][0]["uid"],
        pod["metadata"]["uid"]
    );

    // Same identity: reused, same generation, nothing new in the cluster.
    let (s, b) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("k1", "t1", "alice")),
        )
        .await;
    assert_eq!((s, &b["generation"]), (200, &a["generation"]));
    assert_eq!(c.fake.pods().len(), 1);
    // Other identity: 400.
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("k1", "t2", "alice")),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["detail"]
        .as_str()
        .unwrap()
        .contains("identity does not match"));

    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!((s, v["count"].as_u64()), (200, Some(1)));
    let (s, v) = d.json("GET", "/api/sandboxes/k1", None).await;
    assert_eq!((s, &v["status"]), (200, &json!("running")));

    // The proxy reaches the sandbox at <podIP>:<container port>.
    let (s, _, body) = d
        .call(
            "GET",
            "/api/sandboxes/k1/proxy/echo?x=1",
            None,
            Some(common::TOKEN),
        )
        .await;
    assert_eq!(s, 200);
    let echo: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["path"], "/echo");
    assert!(echo["headers"].get("authorization").is_none());
    // ...with this incarnation's credential, which its Secret holds.
    let secret = &c.fake.secrets()[0];
    let want = base64_decode(secret["data"]["credential"].as_str().unwrap());
    assert_eq!(want.len(), 64);
    assert_eq!(
        echo["headers"]["x-sandbox-agent-credential"].as_str(),
        Some(want.as_str()),
        "{echo}"
    );
    assert!(!d.log_contains(&want), "the credential reached the log");

    let (s, v) = d
        .json(
            "DELETE",
            &format!(
                "/api/sandboxes/k1?expected_generation={}",
                a["generation"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true, "sandbox_id": "k1"})));
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
    // Every Pod delete carried the UID precondition (checked by the fake);
    // deleting an absent sandbox is fine.
    let (s, _) = d.json("DELETE", "/api/sandboxes/k1", None).await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn create_waits_for_readiness_and_ephemeral_has_no_pvc() {
    let c = Cluster::new();
    let d = c.daemon(&[]);
    let name = object_name("eph_1");
    let client = tokio::spawn({
        let url = d.url("/api/sandboxes");
        async move {
            let body = json!({"sandbox_id": "eph_1", "thread_id": "t", "uid": "bob", "inherit_env": false});
            post(&url, body).await
        }
    });
    wait_for("the pod", || c.fake.pod(&name).is_some()).await;
    // The create read the Pod not ready, and read it again: it waits.
    let get_pod = |r: &str| r.starts_with("GET ") && r.contains(&format!("/pods/{name}?"));
    let seen = calls(&c, &get_pod);
    wait_for_calls(&c, "two readiness polls", seen, 2, get_pod).await;
    assert!(
        !client.is_finished(),
        "create returned before the pod was ready"
    );
    c.fake.set_ready(&name, "127.0.0.1");
    let (s, v) = client.await.unwrap();
    assert_eq!(s, 200, "{v}");
    let pod = c.fake.pod(&name).unwrap();
    assert_eq!(v["generation"].as_str(), Some(uid_of(&pod).as_str()));
    let vols = pod["spec"]["volumes"].as_array().unwrap();
    assert!(
        vols.iter()
            .all(|v| v.get("persistentVolumeClaim").is_none()),
        "{vols:?}"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["sandboxd.io/storage"],
        "ephemeral"
    );
    drop(d);
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<common::Body>();
    let req = http::Request::post(url)
        .header("authorization", format!("Bearer {}", common::TOKEN))
        .body(common::full(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let s = resp.status().as_u16();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

#[tokio::test]
async fn readiness_timeout_cleans_up_pod_and_service() {
    let c = Cluster::new();
    let d = c.daemon(&[("SANDBOX_HEALTH_TIMEOUT_SECONDS", "2")]);
    let started = Instant::now();
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("slow1", "t", "u")),
        )
        .await;
    assert_eq!(s, 500, "{v}");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
    let (s, _) = d.json("GET", "/api/sandboxes/slow1", None).await;
    assert_eq!(s, 404);
    // The cleanup delete was fenced on the Pod's UID.
    assert!(c
        .fake
        .requests()
        .iter()
        .any(|r| r.starts_with("DELETE /api/v1/namespaces/sandboxes/pods/")));
}

#[tokio::test]
async fn conflict_409_is_recovered_by_identity() {
    let c = Cluster::new();
    let d = c.daemon(&[]);
    // Another daemon replica made "r1" (same identity) and "r2" (another
    // identity) behind this daemon's back.
    let (s, made) = post_via_other_daemon(&c, "r1", "t", "u").await;
    assert_eq!(s, 200);
    let (_, other) = post_via_other_daemon(&c, "r2", "other-thread", "u").await;

    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("r1", "t", "u")))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["generation"], made["generation"],
        "the existing pod was adopted"
    );
    assert_eq!(c.fake.pods().len(), 2);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("r2", "t", "u")))
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("identity does not match"),
        "{v}"
    );
    // Both went through POST -> 409 AlreadyExists -> GET.
    let posts = c
        .fake
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST /api/v1/namespaces/sandboxes/pods"))
        .count();
    assert_eq!(posts, 4);
    // The other identity's pod is untouched.
    let pod = c.fake.pod(&object_name("r2")).unwrap();
    assert_eq!(Some(uid_of(&pod).as_str()), other["generation"].as_str());
}

/// Creates a sandbox through a second daemon on the same cluster, then
/// stops that daemon (sandboxes outlive it).
async fn post_via_other_daemon(c: &Cluster, id: &str, thread: &str, uid: &str) -> (u16, Value) {
    c.fake.auto_ready(Some("127.0.0.1"));
    let other = c.daemon(&[]);
    let r = other
        .json("POST", "/api/sandboxes", Some(create_body(id, thread, uid)))
        .await;
    drop(other);
    c.fake.auto_ready(None);
    r
}

#[tokio::test]
async fn stale_generation_delete_is_refused_by_the_api_server() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    let d = c.daemon(&[]);
    let (_, a) = d
        .json("POST", "/api/sandboxes", Some(create_body("g1", "t", "u")))
        .await;
    let old = a["generation"].as_str().unwrap().to_string();
    // Another replica replaced the Pod: the daemon still holds `old`.
    let new_uid = c.fake.recreate_pod(&object_name("g1"));
    assert_ne!(new_uid, old);
    let (s, v) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/g1?expected_generation={old}"),
            None,
        )
        .await;
    assert_eq!(s, 409, "{v}");
    let pod = c
        .fake
        .pod(&object_name("g1"))
        .expect("the newer pod survives");
    assert_eq!(uid_of(&pod), new_uid);
    assert_eq!(c.fake.services().len(), 1, "its service survives too");
    // The daemon now tracks the newer incarnation...
    let (s, v) = d.json("GET", "/api/sandboxes/g1", None).await;
    assert_eq!((s, v["generation"].as_str()), (200, Some(new_uid.as_str())));
    // ...and a delete without expected_generation deletes it.
    let (s, v) = d.json("DELETE", "/api/sandboxes/g1", None).await;
    assert_eq!(s, 200, "{v}");
    assert!(c.fake.pod(&object_name("g1")).is_none());
}

#[tokio::test]
async fn restart_adopts_and_quiesce_deletes_everything() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    let up = upstream::start().await;
    let port = up.port().to_string();
    let d = c.daemon(&[("SANDBOX_CONTAINER_PORT", port.as_str())]);
    let mut gens = Vec::new();
    for id in ["q1", "q2"] {
        let (s, v) = d
            .json("POST", "/api/sandboxes", Some(create_body(id, "t", "u")))
            .await;
        assert_eq!(s, 200, "{v}");
        gens.push(v["generation"].clone());
    }
    drop(d);
    // A new daemon finds them by label selector, with the same generations,
    // and reads each one's credential back from its Secret.
    let d = c.daemon(&[("SANDBOX_CONTAINER_PORT", port.as_str())]);
    let (s, _, body) = d
        .call(
            "GET",
            "/api/sandboxes/q2/proxy/echo",
            None,
            Some(common::TOKEN),
        )
        .await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let echo: Value = serde_json::from_slice(&body).unwrap();
    let secret = c
        .fake
        .secrets()
        .into_iter()
        .find(|x| x["metadata"]["name"] == object_name("q2").as_str())
        .unwrap();
    assert_eq!(
        echo["headers"]["x-sandbox-agent-credential"].as_str(),
        Some(base64_decode(secret["data"]["credential"].as_str().unwrap()).as_str())
    );
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 2, "{v}");
    let (_, v) = d.json("GET", "/api/sandboxes/q1", None).await;
    assert_eq!(v["generation"], gens[0]);
    assert!(c
        .fake
        .requests()
        .iter()
        .any(|r| r.contains("labelSelector=app%3Dsandboxd-sandbox")));

    let (s, v) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=30", None)
        .await;
    assert_eq!((s, v), (200, json!({"ok": true, "deleted": 2})));
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
    let (s, _) = d
        .json("POST", "/api/sandboxes", Some(create_body("q3", "t", "u")))
        .await;
    assert_eq!(s, 503);
}

#[tokio::test]
async fn missing_workdir_is_a_400_and_cleans_up() {
    let c = Cluster::new();
    let d = c.daemon(&[]);
    let name = object_name("w1");
    let client = tokio::spawn({
        let url = d.url("/api/sandboxes");
        async move {
            let body = json!({"sandbox_id": "w1", "thread_id": "t", "uid": "u", "workdir_path": "projects/nope"});
            post(&url, body).await
        }
    });
    wait_for("the pod", || c.fake.pod(&name).is_some()).await;
    c.fake.fail_init(&name, 42);
    let (s, v) = client.await.unwrap();
    assert_eq!(s, 400, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("projects/nope"),
        "{v}"
    );
    assert!(c.fake.pods().is_empty());
}

#[tokio::test]
async fn service_and_nodeport_modes_connect_through_the_service() {
    let up = upstream::start().await;
    let port = up.port().to_string();
    for (mode, ty) in [("service", "ClusterIP"), ("nodeport", "NodePort")] {
        let c = Cluster::new();
        c.fake.auto_ready(Some("10.244.9.9"));
        c.fake.cluster_ip("127.0.0.1");
        c.fake.fixed_node_port(up.port());
        let dir = tempfile::tempdir().unwrap();
        let toml = dir.path().join("config.toml");
        std::fs::write(&toml, format!("[kubernetes]\nconnect_mode = \"{mode}\"\n")).unwrap();
        let d = c.daemon(&[
            ("SANDBOXD_CONFIG", toml.to_str().unwrap()),
            ("SANDBOX_CONTAINER_PORT", port.as_str()),
        ]);
        if mode == "nodeport" {
            assert!(d.wait_log("connect_mode = nodeport", Duration::from_secs(5)));
        }
        let (s, v) = d
            .json("POST", "/api/sandboxes", Some(create_body("p1", "t", "u")))
            .await;
        assert_eq!(s, 200, "{v}");
        let svc = &c.fake.services()[0];
        assert_eq!(svc["spec"]["type"], ty);
        let (s, _, body) = d
            .call(
                "GET",
                "/api/sandboxes/p1/proxy/echo",
                None,
                Some(common::TOKEN),
            )
            .await;
        assert_eq!(s, 200, "{mode}: {}", String::from_utf8_lossy(&body));
        let echo: Value = serde_json::from_slice(&body).unwrap();
        assert!(echo["headers"]["x-sandbox-agent-credential"].is_string());
    }
}

#[tokio::test]
async fn a_leftover_service_of_another_incarnation_is_replaced() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    let name = object_name("l1");
    let stale = c.fake.insert_service(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "sandboxes",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                                 "uid": "00000000-dead-0000-0000-000000000000"}]},
        "spec": {"type": "ClusterIP", "ports": [{"port": 8080}]}}));
    let d = c.daemon(&[]);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("l1", "t", "u")))
        .await;
    assert_eq!(s, 200, "{v}");
    let svcs = c.fake.services();
    assert_eq!(svcs.len(), 1);
    assert_ne!(svcs[0]["metadata"]["uid"].as_str(), Some(stale.as_str()));
    assert_eq!(
        svcs[0]["metadata"]["ownerReferences"][0]["uid"],
        v["generation"]
    );
}

#[tokio::test]
async fn recreate_waits_for_a_terminating_pod_and_quiesce_for_it_to_go() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    c.fake.graceful_deletes(true);
    let d = c.daemon(&[]);
    let name = object_name("t1");
    let (_, a) = d
        .json("POST", "/api/sandboxes", Some(create_body("t1", "t", "u")))
        .await;
    let (s, _) = d.json("DELETE", "/api/sandboxes/t1", None).await;
    assert_eq!(s, 200);
    assert!(c.fake.pod(&name).unwrap()["metadata"]["deletionTimestamp"].is_string());
    // A new create of the same id waits for the old Pod to go: it meets
    // the terminating Pod (409), and tries again.
    let post_pod = |r: &str| r.starts_with("POST ") && r.contains("/pods?");
    let posted = calls(&c, &post_pod);
    let client = tokio::spawn({
        let url = d.url("/api/sandboxes");
        async move { post(&url, create_body("t1", "t", "u")).await }
    });
    wait_for_calls(&c, "the create to try twice", posted, 2, post_pod).await;
    assert!(
        !client.is_finished(),
        "create did not wait for the terminating pod"
    );
    c.fake.finish_deletions();
    let (s, b) = client.await.unwrap();
    assert_eq!(s, 200, "{b}");
    assert_ne!(b["generation"], a["generation"]);

    // Quiesce answers only once the backend lists no Pod at all.
    let list_pods = |r: &str| r.starts_with("GET ") && r.contains("/pods?");
    let quiesce = tokio::spawn({
        let url = d.url("/api/sandboxes/quiesce?timeout_seconds=30");
        async move { post(&url, json!({})).await }
    });
    wait_for("the pod to be terminating", || {
        c.fake
            .pod(&name)
            .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    // Quiesce listed the terminating Pod, and listed again: it waits.
    let listed = calls(&c, &list_pods);
    wait_for_calls(&c, "two more listings", listed, 2, list_pods).await;
    assert!(
        !quiesce.is_finished(),
        "quiesce returned with a pod still terminating"
    );
    c.fake.finish_deletions();
    let (s, v) = quiesce.await.unwrap();
    assert_eq!(s, 200, "{v}");
    assert!(c.fake.pods().is_empty());
}

#[test]
fn a_missing_kubeconfig_stops_the_daemon_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path())
        .env_remove("SANDBOXD_CONFIG")
        .env("SANDBOX_PROVISIONER_TOKEN", common::TOKEN)
        .env("PROVISIONER_BACKEND", "kubernetes")
        .env("USER_DATA_PVC", "sandbox-user-data")
        .env("SKILLS_PVC", "sandbox-skills")
        .env("KUBECONFIG_PATH", dir.path().join("nope"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot start the kubernetes backend") && err.contains("nope"),
        "{err}"
    );
}

fn base64_decode(s: &str) -> String {
    use base64::Engine;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
}

fn kinds(posts: &[(String, Value)]) -> Vec<&str> {
    posts.iter().map(|(r, _)| r.as_str()).collect()
}

#[tokio::test]
async fn a_create_submits_its_objects_in_order_owned_by_the_pod_and_render_prints_them() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    let d = c.daemon(&[]);
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("o1", "t", "alice")),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let posts = c.fake.posts();
    assert_eq!(
        kinds(&posts),
        ["pods", "secrets", "networkpolicies", "services"]
    );
    let pod_uid = v["generation"].as_str().unwrap();
    let name = object_name("o1");
    for (kind, body) in &posts[1..] {
        let owner = &body["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Pod", "{kind}");
        assert_eq!(owner["uid"], pod_uid, "{kind}");
        assert_eq!(owner["name"], name.as_str(), "{kind}");
        assert_eq!(body["metadata"]["name"], name.as_str(), "{kind}");
    }
    assert_eq!(posts[0].1["spec"]["hostUsers"], false);

    // `sandboxd kube render` with the daemon's own environment prints the
    // same objects, the Pod UID and the credential being placeholders.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.args([
        "kube",
        "render",
        "--sandbox-id",
        "o1",
        "--uid",
        "alice",
        "--thread-id",
        "t",
    ])
    .env_remove("SANDBOXD_CONFIG");
    for (k, val) in c.env(&[]) {
        cmd.env(k, val);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)
        .unwrap()
        .replace(sandboxd::cli::kube::RENDER_POD_UID, pod_uid);
    let submitted_cred = posts[1].1["data"]["credential"]
        .as_str()
        .unwrap()
        .to_string();
    let rendered: Vec<Value> = serde_norway::Deserializer::from_str(&text)
        .map(|doc| {
            let mut v: Value = serde_json::to_value(
                <serde_norway::Value as serde::Deserialize>::deserialize(doc).unwrap(),
            )
            .unwrap();
            if v["kind"] == "Secret" {
                v["data"]["credential"] = json!(submitted_cred);
            }
            v
        })
        .collect();
    let submitted: Vec<Value> = posts.iter().map(|(_, b)| b.clone()).collect();
    assert_eq!(rendered, submitted);

    // A delete removes all four.
    let (s, _) = d.json("DELETE", "/api/sandboxes/o1", None).await;
    assert_eq!(s, 200);
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
}

#[tokio::test]
async fn a_refused_network_policy_fails_the_create_and_leaves_nothing() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    let d = c.daemon(&[]);
    c.fake.refuse_creates("networkpolicies");
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("n1", "t", "u")))
        .await;
    assert_eq!(s, 500, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("networkpolic"),
        "{v}"
    );
    assert_eq!(
        kinds(&c.fake.posts()),
        ["pods", "secrets", "networkpolicies"]
    );
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
    let (s, _) = d.json("GET", "/api/sandboxes/n1", None).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn the_daemon_refuses_to_start_without_what_makes_sandboxes_safe() {
    // May not create NetworkPolicies: refused, unless the operator manages
    // them (then a create makes none).
    let c = Cluster::new();
    c.fake.deny("create", "networkpolicies");
    let err = c.refused_start(&[]);
    assert!(
        err.contains("create networkpolicies") && err.contains("network_policy = \"external\""),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("config.toml");
    std::fs::write(&toml, "[kubernetes]\nnetwork_policy = \"external\"\n").unwrap();
    c.fake.auto_ready(Some("127.0.0.1"));
    let d = c.daemon(&[("SANDBOXD_CONFIG", toml.to_str().unwrap())]);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("e1", "t", "u")))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(c.fake.network_policies().is_empty());
    drop(d);

    // May not read Secrets (the agent credential): refused.
    let c = Cluster::new();
    c.fake.deny("get", "secrets");
    let err = c.refused_start(&[]);
    assert!(err.contains("get secrets"), "{err}");

    // No user-data / skills PVC: refused unless ephemeral storage is chosen.
    let c = Cluster::new();
    let err = c.refused_start(&[("USER_DATA_PVC", "")]);
    assert!(
        err.contains("USER_DATA_PVC") && err.contains("allow_ephemeral_user_data"),
        "{err}"
    );
    let err = c.refused_start(&[("SKILLS_PVC", "")]);
    assert!(err.contains("SKILLS_PVC"), "{err}");
    c.fake.auto_ready(Some("127.0.0.1"));
    let d = c.daemon(&[
        ("USER_DATA_PVC", ""),
        ("SKILLS_PVC", ""),
        ("SANDBOXD_KUBE_ALLOW_EPHEMERAL_USER_DATA", "true"),
    ]);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("s1", "t", "u")))
        .await;
    assert_eq!(s, 200, "{v}");
    let pod = &c.fake.pods()[0];
    assert!(pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|v| v.get("persistentVolumeClaim").is_none()));
    // The pids warning (no per-Pod pids limit in Kubernetes).
    assert!(d.log_contains("pids limits are NOT enforced"));
}

#[tokio::test]
async fn an_api_server_without_user_namespaces_fails_the_create_clearly() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    c.fake.drop_host_users();
    let d = c.daemon(&[]);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("h1", "t", "u")))
        .await;
    assert_eq!(s, 500, "{v}");
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains("hostUsers") && detail.contains("user_namespaces = false"),
        "{v}"
    );
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
    drop(d);
    // Opting out works on that cluster.
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("config.toml");
    std::fs::write(&toml, "[kubernetes]\nuser_namespaces = false\n").unwrap();
    let d = c.daemon(&[("SANDBOXD_CONFIG", toml.to_str().unwrap())]);
    let (s, v) = d
        .json("POST", "/api/sandboxes", Some(create_body("h1", "t", "u")))
        .await;
    assert_eq!(s, 200, "{v}");
}

fn legacy_pod(id: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("sandbox-{id}"), "namespace": "sandboxes",
                        "labels": {"app": "yuxi-sandbox", "sandbox-id": id, "thread-id": "old-thread"}},
           "spec": {"containers": [{"name": "sandbox", "image": "old"}]}})
}

fn legacy_service(id: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": format!("sandbox-{id}"), "namespace": "sandboxes",
                        "labels": {"app": "yuxi-sandbox"}},
           "spec": {"type": "NodePort", "ports": [{"port": 8080}]}})
}

#[tokio::test]
async fn the_replaced_provisioners_pods_are_listed_replaced_and_quiesced() {
    let c = Cluster::new();
    c.fake.auto_ready(Some("127.0.0.1"));
    for id in ["old1", "old2"] {
        c.fake.insert_pod(legacy_pod(id), Some("10.0.0.7"));
        c.fake.insert_service(legacy_service(id));
    }
    let d = c.daemon(&[]);
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!((s, v["count"].as_u64()), (200, Some(2)), "{v}");
    assert_eq!(v["sandboxes"][0]["status"], "exited", "{v}");
    assert_eq!(v["sandboxes"][0]["sandbox_id"], "old1");
    // The proxy does not reach them.
    let (s, _, _) = d
        .call(
            "GET",
            "/api/sandboxes/old1/proxy/v1/sandbox",
            None,
            Some(common::TOKEN),
        )
        .await;
    assert_ne!(s, 200);

    // A create of the same id (any identity) replaces the old Pod: never
    // two Pods for one id.
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes",
            Some(create_body("old1", "new-thread", "alice")),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(c.fake.pod("sandbox-old1").is_none());
    assert!(c
        .fake
        .services()
        .iter()
        .all(|s| s["metadata"]["name"] != "sandbox-old1"));
    assert!(c.fake.pod(&object_name("old1")).is_some());

    // Quiesce deletes what is left of the old provisioner too.
    let (s, v) = d
        .json("POST", "/api/sandboxes/quiesce?timeout_seconds=30", None)
        .await;
    assert_eq!((s, v), (200, json!({"ok": true, "deleted": 2})));
    assert!(
        c.fake.all_objects().is_empty(),
        "{:?}",
        c.fake.all_objects()
    );
}

#[test]
fn the_ownership_migration_job_runs_the_migration_on_the_user_data_pvc() {
    // The manifest is checked strictly and with kubectl in kube_golden; here:
    // it mounts the PVC the daemon uses and runs the command this build has.
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/kubernetes/migrate-ownership-job.yaml"),
    )
    .unwrap();
    let job: k8s_openapi::api::batch::v1::Job = serde_norway::from_str(&text).unwrap();
    let spec = job.spec.unwrap().template.spec.unwrap();
    let claim = &spec.volumes.as_ref().unwrap()[0]
        .persistent_volume_claim
        .as_ref()
        .unwrap()
        .claim_name;
    let env = Cluster::new();
    let want = env
        .env(&[])
        .into_iter()
        .find(|(k, _)| *k == "USER_DATA_PVC")
        .unwrap()
        .1;
    assert_eq!(claim, want);
    let cmd = spec.containers[0].command.clone().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(&cmd[1..3])
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--root"));
}
