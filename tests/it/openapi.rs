//! The OpenAPI descriptions (`docs/openapi/*.json`): the committed files are
//! what `sandboxd openapi provisioner|agent` generates from the Rust types
//! (`UPDATE_GOLDEN=1` rewrites them), `GET /openapi.json` serves the
//! provisioner's without a token, every route the docs describe is in
//! them, and the static agent does not carry the OpenAPI code.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::common::{sibling_bin, Daemon};

fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs")
}

fn generated(api: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["openapi", api])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sandboxd openapi {api}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn check_committed(api: &str) -> Value {
    let text = generated(api);
    let path = docs_dir().join("openapi").join(format!("{api}.json"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        eprintln!("updated {}", path.display());
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        committed == text,
        "{} differs from `sandboxd openapi {api}`: regenerate it with \
         `UPDATE_GOLDEN=1 cargo test --test it openapi` (or `sandboxd openapi {api} > {}`)",
        path.display(),
        path.display()
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    doc
}

/// `### \`METHOD /path…\`` headings of a Markdown file: (method, path)
/// with `[...]` optional parts dropped and `<...>` query values ignored.
fn documented_routes(md: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(docs_dir().join(md)).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("### `") else {
            continue;
        };
        let head = rest.split('`').next().unwrap();
        let mut words = head.split_whitespace();
        let (Some(first), second) = (words.next(), words.next()) else {
            continue;
        };
        let (method, path) = match second {
            Some(p) => (first.to_string(), p),
            None => ("ANY".to_string(), first),
        };
        let mut path = path.split('?').next().unwrap().to_string();
        while let Some(i) = path.find('[') {
            let j = path[i..].find(']').map(|j| i + j + 1).unwrap_or(path.len());
            path.replace_range(i..j, "");
        }
        out.push((method, path));
    }
    assert!(!out.is_empty(), "no routes found in {md}");
    out
}

fn assert_routes_described(doc: &Value, md: &str) {
    for (method, path) in documented_routes(md) {
        let item = doc["paths"]
            .get(&path)
            .unwrap_or_else(|| panic!("{md}: {method} {path} is not in the OpenAPI document"));
        let methods: Vec<String> = if method == "ANY" {
            ["get", "post", "put", "patch", "delete", "head", "options"]
                .map(String::from)
                .to_vec()
        } else {
            vec![method.to_lowercase()]
        };
        for m in methods {
            let op = item
                .get(&m)
                .unwrap_or_else(|| panic!("{md}: {m} {path} is not in the OpenAPI document"));
            assert!(op["responses"].is_object(), "{m} {path}: no responses");
        }
    }
}

#[test]
fn the_committed_provisioner_document_is_the_generated_one() {
    let doc = check_committed("provisioner");
    assert_routes_described(&doc, "api.md");
    assert_routes_described(&doc, "contracts/provisioner-api.md");
    // The bearer scheme, required everywhere but on the three open routes.
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert_eq!(doc["security"][0]["bearer"], serde_json::json!([]));
    for open in ["/health", "/metrics", "/openapi.json"] {
        assert_eq!(
            doc["paths"][open]["get"]["security"],
            serde_json::json!([{}]),
            "{open} needs no token"
        );
    }
    // Every authenticated operation documents its 401, every error body is
    // the `{"detail"}` object.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (m, op) in item.as_object().unwrap() {
            let Some(responses) = op["responses"].as_object() else {
                continue;
            };
            if !["/health", "/metrics", "/openapi.json"].contains(&path.as_str()) {
                assert!(responses.contains_key("401"), "{m} {path}: no 401");
            }
            for (status, r) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        r["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorDetail",
                        "{m} {path} {status}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_committed_agent_document_is_the_generated_one() {
    let doc = check_committed("agent");
    assert_routes_described(&doc, "contracts/agent-api.md");
}

#[tokio::test]
async fn the_daemon_serves_its_document_without_a_token() {
    let d = Daemon::start_memory(&[]);
    let (status, headers, body) = d.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        generated("provisioner"),
        "GET /openapi.json is not `sandboxd openapi provisioner`"
    );
    let (status, _, _) = d.call("POST", "/openapi.json", None, None).await;
    assert_eq!(status, 405);
}

/// The derives are behind the `openapi` feature, which only the daemon
/// enables: the agent's own build (the static binary) has no utoipa.
#[test]
fn the_static_agent_does_not_carry_the_openapi_code() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--package",
            "sandbox-agent",
            "--features",
            "static-bin",
            "--edges",
            "normal",
            "--prefix",
            "none",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    assert!(tree.contains("sandbox-abi"), "unexpected tree: {tree}");
    assert!(
        !tree.contains("utoipa"),
        "the agent's dependency tree pulls utoipa:\n{tree}"
    );
    let bin = std::fs::read(sibling_bin("sandbox-agent")).unwrap();
    assert!(
        !bin.windows(b"utoipa".len()).any(|w| w == b"utoipa"),
        "the static agent binary contains utoipa code"
    );
}
