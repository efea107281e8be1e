//! The daemon's log format: JSON by default when stderr is not a terminal
//! (here: a pipe), with `sandbox_id` and `generation` as top-level fields
//! of every line logged inside a create or a delete (span fields, see
//! `src/cli/logfmt.rs`), so a log shipper can select one sandbox.

use serde_json::Value;

use crate::common::{create_body, mkdir_user, privileged, Daemon, NativeDirs};

pub fn json_lines(d: &Daemon) -> Vec<Value> {
    let lines = d.log.lock().unwrap().clone();
    lines
        .iter()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect()
}

/// Lines about `id`: every one carries `generation`, and among them are
/// the create's and the delete's.
pub fn assert_sandbox_lines(lines: &[Value], id: &str, generation: &str) {
    let ours: Vec<&Value> = lines.iter().filter(|l| l["sandbox_id"] == id).collect();
    for l in &ours {
        assert_eq!(
            l["generation"], generation,
            "a line without the generation: {l}"
        );
        assert!(l["timestamp"].is_string() && l["level"].is_string(), "{l}");
    }
    for (message, span) in [("sandbox created", "create"), ("sandbox deleted", "delete")] {
        assert!(
            ours.iter().any(|l| l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
                && l["spans"].as_str().is_some_and(|s| s.contains(span))),
            "no {message:?} line in the {span} span with both fields: {ours:#?}"
        );
    }
}

#[tokio::test]
async fn json_by_default_with_the_sandbox_fields_memory_backend() {
    // Empty counts as unset: the default (`auto`), and stderr is a pipe.
    let d = Daemon::start_memory(&[("SANDBOXD_LOG_FORMAT", "")]);
    let (s, v) = d.create(create_body("logj", "t1", "u1")).await;
    assert_eq!(s, 200, "{v}");
    let generation = v["generation"].as_str().unwrap().to_string();
    let (s, _) = d.json("DELETE", "/api/sandboxes/logj", None).await;
    assert_eq!(s, 200);
    assert!(d.wait_log("sandbox deleted", std::time::Duration::from_secs(5)));
    assert_sandbox_lines(&json_lines(&d), "logj", &generation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_of_a_native_create_carry_the_generation() {
    if !privileged("json_lines_of_a_native_create_carry_the_generation") {
        return;
    }
    let dirs = NativeDirs::new();
    mkdir_user(&dirs.workspace("u1"));
    let d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOXD_LOG_FORMAT", "json"),
            ("SANDBOXD_NETWORK", "none"),
        ],
    );
    let (s, v) = d.create(create_body("logn", "t1", "u1")).await;
    assert_eq!(s, 200, "{v}");
    let generation = v["generation"].as_str().unwrap().to_string();
    let (s, _) = d.json("DELETE", "/api/sandboxes/logn", None).await;
    assert_eq!(s, 200);
    assert!(d.wait_log("sandbox deleted", std::time::Duration::from_secs(5)));
    let lines = json_lines(&d);
    // The backend's own lines inside the create (the cgroup, the agent's
    // output) inherit the span's fields.
    assert!(
        lines
            .iter()
            .filter(|l| l["sandbox_id"] == "logn" && l["generation"] == generation.as_str())
            .count()
            >= 4,
        "{lines:#?}"
    );
    assert_sandbox_lines(&lines, "logn", &generation);
}
