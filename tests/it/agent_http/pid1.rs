//! The agent as PID 1 of a new pid namespace (via `unshare`), as in a
//! sandbox: orphans are re-parented to it without a subreaper and reaped,
//! signals from its own commands (`kill 1`) never stop it, and a SIGTERM
//! from outside the namespace does, cleanly. Skips, saying why, where
//! `unshare` cannot create a pid namespace.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::agent_support::{eventually, proc_state, zombies_of, Agent};

/// The unshare prefix that works here (root, or an unprivileged user ns).
fn unshare_prefix() -> Option<Vec<&'static str>> {
    let candidates: [&[&str]; 2] = [
        &["unshare", "--pid", "--kill-child"],
        &[
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--kill-child",
        ],
    ];
    candidates.into_iter().find_map(|prefix| {
        let ok = Command::new(prefix[0])
            .args(&prefix[1..])
            .args(["sh", "-c", "test $$ = 1"])
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| prefix.to_vec())
    })
}

/// Host pids of the children of `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn as_pid1_reaps_orphans_ignores_inside_signals_and_stops_on_outside_sigterm() {
    let Some(prefix) = unshare_prefix() else {
        crate::common::cannot_run(
            "as_pid1_reaps_orphans_ignores_inside_signals_and_stops_on_outside_sigterm: \
             `unshare --pid` is not permitted here",
        );
        return;
    };
    let mut agent = Agent::start_wrapped(&prefix, &[]);
    // The wrapper (unshare) forked the agent: find its host pid.
    let mut agent_pid = 0;
    assert!(eventually(Duration::from_secs(5), || {
        agent_pid = children_of(agent.pid()).first().copied().unwrap_or(0);
        agent_pid != 0
    }));
    assert_eq!(
        agent.exec(json!({"command": "echo $PPID"}))["output"],
        "1\n"
    );

    // Orphans come to PID 1 (no subreaper involved) and are reaped.
    agent.exec(json!({"command": "for i in 1 2 3; do ( sleep 1 & ); ( true & ); done"}));
    let orphans: Vec<i32> = children_of(agent_pid)
        .into_iter()
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
        .collect();
    assert_eq!(
        orphans.len(),
        3,
        "sleeps not re-parented to the agent: {orphans:?}"
    );
    assert!(eventually(Duration::from_secs(5), || orphans
        .iter()
        .all(|&p| proc_state(p).is_none())));
    assert!(zombies_of(agent_pid).is_empty());

    // Signals from inside the sandbox do not stop PID 1.
    let d = agent.exec(json!({"command": "kill -TERM 1; kill -INT 1; kill -HUP 1; kill -USR1 1; kill -KILL 1; sleep 0.3; echo alive"}));
    assert_eq!(d["output"], "alive\n");
    assert_eq!(
        agent.exec(json!({"command": "echo still"}))["output"],
        "still\n"
    );

    // SIGTERM from outside the namespace stops it cleanly, children first.
    agent.exec(json!({"command": "trap 'echo got-term > term-marker; exit 0' TERM; touch started; sleep 100 & wait", "async_mode": true}));
    assert!(eventually(Duration::from_secs(5), || agent
        .path("started")
        .exists()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent_pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    assert!(eventually(Duration::from_secs(10), || {
        status = agent.child.try_wait().unwrap();
        status.is_some()
    }));
    assert!(status.unwrap().success(), "{status:?}");
    assert_eq!(
        std::fs::read_to_string(agent.path("term-marker")).unwrap(),
        "got-term\n"
    );
}
