//! Real workloads still work under the default profile: each test runs a
//! shell script under `sandboxd seccomp run -- bash -c ...` and asserts its
//! exit status and output. A missing python3, pip, git or cc fails the test
//! under `CI=true` and skips it loudly elsewhere (`require_tool`); bash,
//! tar, awk and sort are required.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::path::Path;
use std::process::Command;

use crate::common::{cannot_run, require_tool, test_name};

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

/// Runs `script` with bash under the filter in `dir`; returns stdout.
fn run_filtered(dir: &Path, script: &str) -> String {
    let out = Command::new(SANDBOXD)
        .args([
            "seccomp", "run", "--", "bash", "-euo", "pipefail", "-c", script,
        ])
        .current_dir(dir)
        .output()
        .expect("run sandboxd seccomp run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "workload failed under the filter ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

#[test]
fn runs_under_the_filter_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_filtered(
        dir.path(),
        "grep -E '^Seccomp(_filters)?:' /proc/self/status",
    );
    assert!(out.contains("Seccomp:\t2"), "{out}");
    // allow-list, then the EPERM, EAFNOSUPPORT and EPROTONOSUPPORT filters.
    assert!(out.contains("Seccomp_filters:\t4"), "{out}");
}

#[test]
fn bash_pipelines_sort_awk() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_filtered(
        dir.path(),
        "seq 1 1000 | sort -rn | head -3 | tr '\\n' ' '; echo; \
         seq 1 100 | awk '{s+=$1} END {print \"sum\", s}'; \
         printf 'b\\na\\nc\\n' | sort | paste -sd, -; \
         x=$(echo sub | (cat; echo shell)); echo \"$x\" | wc -l",
    );
    assert!(out.contains("1000 999 998"), "{out}");
    assert!(out.contains("sum 5050"), "{out}");
    assert!(out.contains("a,b,c"), "{out}");
    assert!(out.trim_end().ends_with('2'), "{out}");
}

#[test]
fn tar_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_filtered(
        dir.path(),
        "mkdir -p src/a && echo hello > src/a/f && tar czf t.tgz src && \
         mkdir out && tar xzf t.tgz -C out && cat out/src/a/f && tar tzf t.tgz | sort",
    );
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(out.contains("src/a/f"), "{out}");
}

#[test]
fn python_threads_and_subprocess() {
    if !require_tool("python3", "apt-get install python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = r#"python3 - <<'EOF'
import threading, subprocess, concurrent.futures, os
results = []
def work(i):
    results.append(sum(range(i * 1000)))
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("threads", len(results))
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    print("pool", sum(ex.map(lambda x: x * x, range(10))))
print(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
print(subprocess.check_output("echo piped | tr a-z A-Z", shell=True, text=True).strip())
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
EOF"#;
    let out = run_filtered(dir.path(), script);
    for want in ["threads 8", "pool 285", "child", "PIPED", "fork 7"] {
        assert!(out.contains(want), "missing {want:?} in {out}");
    }
}

#[test]
fn pip_version() {
    if !require_tool("python3", "apt-get install python3") {
        return;
    }
    let ok = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok
        && !cannot_run(&format!(
            "{}: python3 -m pip is not available (apt-get install python3-pip)",
            test_name()
        ))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run_filtered(dir.path(), "python3 -m pip --version");
    assert!(out.starts_with("pip "), "{out}");
}

#[test]
fn git_init_and_commit() {
    if !require_tool("git", "apt-get install git") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run_filtered(
        dir.path(),
        "export HOME=$PWD GIT_CONFIG_NOSYSTEM=1; git init -q repo && cd repo && \
         git config user.name 'Seccomp Test' && git config user.email t@example.invalid && \
         echo data > file && git add file && git commit -qm 'first commit' && \
         git log --format=%s && git status --porcelain | wc -l",
    );
    assert!(out.contains("first commit"), "{out}");
    assert!(out.trim_end().ends_with('0'), "{out}");
}

#[test]
fn cc_hello_world() {
    if !require_tool("cc", "apt-get install gcc libc6-dev") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run_filtered(
        dir.path(),
        "printf '#include <stdio.h>\\nint main(void){puts(\"hello from cc\");return 0;}\\n' > h.c && \
         cc -O2 -o h h.c && ./h",
    );
    assert!(out.contains("hello from cc"), "{out}");
}
