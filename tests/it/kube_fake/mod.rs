//! An in-process fake Kubernetes API server (plain HTTP on 127.0.0.1:0,
//! its own thread and runtime) enforcing the semantics the kube backend
//! relies on: 201 / 409 AlreadyExists on create, 404 NotFound, UID
//! preconditions on delete (409 Conflict on mismatch), equality label
//! selectors on list, NodePort allocation, garbage collection of objects
//! owned by a deleted Pod, SelfSubjectAccessReviews; Pods become Ready only
//! when the test says so (or automatically, when asked). Tests can deny
//! permissions, refuse creates of a resource, or drop `hostUsers` as an API
//! server without user namespaces does. It also serves the discovery
//! documents `kubectl apply --dry-run=client` needs.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

mod discovery;
use discovery::discovery;

#[derive(Default)]
struct State {
    /// (resource, name) -> object; one namespace is enough for the tests.
    objects: BTreeMap<(String, String), Value>,
    next_node_port: u16,
    /// When set, new Pods are Ready at once with this Pod IP.
    auto_ready: Option<String>,
    /// When set, every Service gets this node port.
    node_port: Option<u16>,
    /// Pods are deleted gracefully: they stay, with a deletionTimestamp,
    /// until [`FakeApi::finish_deletions`].
    graceful: bool,
    /// "METHOD path?query" of every request.
    log: Vec<String>,
    /// (resource, body) of every create, in order.
    posts: Vec<(String, Value)>,
    /// "verb resource" pairs SelfSubjectAccessReviews deny.
    denied: BTreeSet<String>,
    /// Resources whose creates are refused (403 Forbidden).
    refused: BTreeSet<String>,
    /// Pod creates lose `spec.hostUsers` (no UserNamespacesSupport).
    drop_host_users: bool,
    /// The clusterIP of every Service (default 10.96.0.10).
    cluster_ip: Option<String>,
}

#[derive(Clone)]
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

fn now() -> String {
    k8s_openapi::chrono::Utc::now().to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Secs, true)
}

fn new_uid() -> String {
    let v = sandbox_abi::random::u128();
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn status(code: u16, reason: &str, message: String) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "services" => "Service",
        "secrets" => "Secret",
        "networkpolicies" => "NetworkPolicy",
        _ => "Unknown",
    }
}

const RESOURCES: [&str; 4] = ["pods", "services", "secrets", "networkpolicies"];

fn ready_status(ip: &str) -> Value {
    json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
           "conditions": [{"type": "Ready", "status": "True"}]})
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return false;
        };
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            let v = v.replace('+', " ");
            percent_decode(&v)
        })
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(x) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl State {
    fn handle(&mut self, method: &str, path: &str, query: &str, body: &[u8]) -> (u16, Value) {
        self.log.push(format!("{method} {path}?{query}"));
        if method == "GET" {
            if let Some(d) = discovery(path) {
                return (200, d);
            }
        }
        // /api/v1/namespaces/{ns}/{resource}[/{name}] (or a group path).
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (resource, name) = match parts.as_slice() {
            ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]
                if method == "POST" =>
            {
                return self.access_review(body)
            }
            ["api", "v1", "namespaces", _ns, r] => (*r, None),
            ["api", "v1", "namespaces", _ns, r, n] => (*r, Some(*n)),
            ["apis", _g, _v, "namespaces", _ns, r] => (*r, None),
            ["apis", _g, _v, "namespaces", _ns, r, n] => (*r, Some(*n)),
            _ => return status(404, "NotFound", format!("no route {path}")),
        };
        if !RESOURCES.contains(&resource) {
            return status(
                404,
                "NotFound",
                format!("{resource} \"{}\" not found", name.unwrap_or("")),
            );
        }
        match (method, name) {
            ("POST", None) => self.create(resource, body),
            ("GET", None) => {
                let sel = query_param(query, "labelSelector").unwrap_or_default();
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|((r, _), o)| r == resource && labels_match(o, &sel))
                    .map(|(_, o)| o.clone())
                    .collect();
                (
                    200,
                    json!({"kind": format!("{}List", kind_of(resource)), "apiVersion": "v1",
                             "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            ("GET", Some(n)) => match self.objects.get(&(resource.to_string(), n.to_string())) {
                Some(o) => (200, o.clone()),
                None => status(404, "NotFound", format!("{resource} \"{n}\" not found")),
            },
            ("DELETE", Some(n)) => {
                let key = (resource.to_string(), n.to_string());
                let Some(obj) = self.objects.get(&key) else {
                    return status(404, "NotFound", format!("{resource} \"{n}\" not found"));
                };
                let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                if let Some(want) = opts["preconditions"]["uid"].as_str() {
                    let have = obj["metadata"]["uid"].as_str().unwrap_or("");
                    if want != have {
                        return status(409, "Conflict", format!(
                            "Operation cannot be fulfilled on {resource} \"{n}\": Precondition failed: \
                             UID in precondition: {want}, UID in object meta: {have}"));
                    }
                }
                if self.graceful && resource == "pods" {
                    let obj = self.objects.get_mut(&key).unwrap();
                    if obj["metadata"].get("deletionTimestamp").is_none() {
                        obj["metadata"]["deletionTimestamp"] = json!(now());
                    }
                    return (200, obj.clone());
                }
                let removed = self.objects.remove(&key).unwrap();
                if resource == "pods" {
                    self.collect_garbage(&removed);
                }
                (200, removed)
            }
            _ => status(405, "MethodNotAllowed", format!("{method} {path}")),
        }
    }

    /// The garbage collector: objects owned by the removed Pod go too.
    fn collect_garbage(&mut self, pod: &Value) {
        let Some(uid) = pod["metadata"]["uid"].as_str() else {
            return;
        };
        self.objects.retain(|_, o| {
            !o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
        });
    }

    fn access_review(&mut self, body: &[u8]) -> (u16, Value) {
        let mut review: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let attrs = &review["spec"]["resourceAttributes"];
        let key = format!(
            "{} {}",
            attrs["verb"].as_str().unwrap_or(""),
            attrs["resource"].as_str().unwrap_or("")
        );
        review["status"] = json!({"allowed": !self.denied.contains(&key)});
        (201, review)
    }

    fn create(&mut self, resource: &str, body: &[u8]) -> (u16, Value) {
        let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "body is not JSON".into());
        };
        self.posts.push((resource.to_string(), obj.clone()));
        if self.refused.contains(resource) {
            return status(
                403,
                "Forbidden",
                format!("{resource} is forbidden: User \"system:serviceaccount:sandboxes:sandboxd\" cannot create resource \"{resource}\""),
            );
        }
        if resource == "pods" && self.drop_host_users {
            if let Some(spec) = obj["spec"].as_object_mut() {
                spec.remove("hostUsers");
            }
        }
        let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
            return status(422, "Invalid", "metadata.name is required".into());
        };
        let key = (resource.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return status(
                409,
                "AlreadyExists",
                format!("{resource} \"{name}\" already exists"),
            );
        }
        obj["metadata"]["uid"] = json!(new_uid());
        obj["metadata"]["creationTimestamp"] = json!(now());
        obj["metadata"]["resourceVersion"] = json!("1");
        if resource == "pods" {
            obj["status"] = match &self.auto_ready {
                Some(ip) => ready_status(ip),
                None => json!({"phase": "Pending"}),
            };
        } else if resource == "services" {
            obj["spec"]["clusterIP"] = json!(self
                .cluster_ip
                .clone()
                .unwrap_or_else(|| "10.96.0.10".into()));
            if obj["spec"]["type"] == "NodePort" {
                let port = self.node_port.unwrap_or_else(|| {
                    self.next_node_port += 1;
                    30000 + self.next_node_port
                });
                if let Some(ports) = obj["spec"]["ports"].as_array_mut() {
                    for p in ports {
                        p["nodePort"] = json!(port);
                    }
                }
            }
        }
        self.objects.insert(key, obj.clone());
        (201, obj)
    }
}

impl FakeApi {
    /// Starts the fake on its own thread and runtime.
    pub fn start() -> FakeApi {
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let st = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let st = st.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: Request<Incoming>| {
                            let st = st.clone();
                            async move {
                                let method = req.method().as_str().to_string();
                                let path = req.uri().path().to_string();
                                let query = req.uri().query().unwrap_or("").to_string();
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let (code, v) =
                                    st.lock().unwrap().handle(&method, &path, &query, &body);
                                Ok::<_, Infallible>(
                                    Response::builder()
                                        .status(code)
                                        .header("content-type", "application/json")
                                        .body(Full::new(Bytes::from(
                                            serde_json::to_vec(&v).unwrap(),
                                        )))
                                        .unwrap(),
                                )
                            }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        });
        let addr = rx.recv().unwrap();
        FakeApi { addr, state }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig pointing at the fake (no TLS, no credentials).
    pub fn write_kubeconfig(&self, path: &std::path::Path, namespace: &str) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(path, text).unwrap();
    }

    /// New Pods become Ready at once with `ip` (None: stay Pending).
    pub fn auto_ready(&self, ip: Option<&str>) {
        self.st().auto_ready = ip.map(str::to_string);
    }

    /// Pod deletes leave terminating Pods behind until `finish_deletions`.
    pub fn graceful_deletes(&self, on: bool) {
        self.st().graceful = on;
    }

    /// Removes every terminating Pod (their grace period ran out), and what
    /// they own.
    pub fn finish_deletions(&self) {
        let mut st = self.st();
        let gone: Vec<Value> = st
            .objects
            .values()
            .filter(|o| o["metadata"].get("deletionTimestamp").is_some())
            .cloned()
            .collect();
        st.objects
            .retain(|_, o| o["metadata"].get("deletionTimestamp").is_none());
        for pod in &gone {
            st.collect_garbage(pod);
        }
    }

    /// SelfSubjectAccessReviews deny `verb` on `resource`.
    pub fn deny(&self, verb: &str, resource: &str) {
        self.st().denied.insert(format!("{verb} {resource}"));
    }

    /// Creates of `resource` are refused with 403.
    pub fn refuse_creates(&self, resource: &str) {
        self.st().refused.insert(resource.to_string());
    }

    /// Pod creates lose `spec.hostUsers`, as on an API server without
    /// user-namespace support.
    pub fn drop_host_users(&self) {
        self.st().drop_host_users = true;
    }

    /// Every new Service gets `ip` as its clusterIP.
    pub fn cluster_ip(&self, ip: &str) {
        self.st().cluster_ip = Some(ip.to_string());
    }

    /// (resource, body) of every create request, in order.
    pub fn posts(&self) -> Vec<(String, Value)> {
        self.st().posts.clone()
    }

    pub fn secrets(&self) -> Vec<Value> {
        self.objects("secrets")
    }

    pub fn network_policies(&self) -> Vec<Value> {
        self.objects("networkpolicies")
    }

    /// Every object of every kind.
    pub fn all_objects(&self) -> Vec<Value> {
        self.st().objects.values().cloned().collect()
    }

    /// Every Service gets `port` as its node port.
    pub fn fixed_node_port(&self, port: u16) {
        self.st().node_port = Some(port);
    }

    pub fn pods(&self) -> Vec<Value> {
        self.objects("pods")
    }

    pub fn services(&self) -> Vec<Value> {
        self.objects("services")
    }

    fn objects(&self, resource: &str) -> Vec<Value> {
        self.st()
            .objects
            .iter()
            .filter(|((r, _), _)| r == resource)
            .map(|(_, o)| o.clone())
            .collect()
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.st()
            .objects
            .get(&("pods".to_string(), name.to_string()))
            .cloned()
    }

    /// Marks a Pod Ready with `ip`.
    pub fn set_ready(&self, name: &str, ip: &str) {
        let mut st = self.st();
        let pod = st
            .objects
            .get_mut(&("pods".to_string(), name.to_string()))
            .expect("pod");
        pod["status"] = ready_status(ip);
    }

    /// Makes the Pod's init container exit with `code` (phase Failed).
    pub fn fail_init(&self, name: &str, code: i32) {
        let mut st = self.st();
        let pod = st
            .objects
            .get_mut(&("pods".to_string(), name.to_string()))
            .expect("pod");
        pod["status"] = json!({"phase": "Failed", "initContainerStatuses": [
            {"name": "sandboxd-prepare", "image": "i", "imageID": "", "ready": false,
             "restartCount": 0, "state": {"terminated": {"exitCode": code}}}]});
    }

    /// Inserts a Pod as another client would create it (gets a fresh UID);
    /// returns the UID.
    pub fn insert_pod(&self, mut pod: Value, ready_ip: Option<&str>) -> String {
        let uid = new_uid();
        pod["metadata"]["uid"] = json!(uid);
        pod["metadata"]["creationTimestamp"] = json!(now());
        pod["status"] = match ready_ip {
            Some(ip) => ready_status(ip),
            None => json!({"phase": "Pending"}),
        };
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        self.st().objects.insert(("pods".to_string(), name), pod);
        uid
    }

    /// Replaces a Pod by a new incarnation (same name, new UID), as a
    /// second daemon replica would; returns the new UID.
    pub fn recreate_pod(&self, name: &str) -> String {
        let pod = self.pod(name).expect("pod");
        let ip = pod["status"]["podIP"].as_str().map(str::to_string);
        self.insert_pod(pod, ip.as_deref())
    }

    /// Inserts a Service as another client would create it; returns its UID.
    pub fn insert_service(&self, svc: Value) -> String {
        self.insert("services", svc)
    }

    /// Inserts an object of `resource` as another client would create it;
    /// returns its UID.
    pub fn insert(&self, resource: &str, mut obj: Value) -> String {
        let uid = new_uid();
        obj["metadata"]["uid"] = json!(uid);
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        self.st().objects.insert((resource.to_string(), name), obj);
        uid
    }

    pub fn requests(&self) -> Vec<String> {
        self.st().log.clone()
    }
}
