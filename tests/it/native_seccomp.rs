//! The seccomp profile inside real native sandboxes (privileged): the probe
//! (`tests/probe/seccomp_probe.c`) runs under the filter `sandbox-init`
//! installed, with the same exact-errno expectations as under
//! `sandboxd seccomp run` (`tests/seccomp_probe.rs`), and everyday workloads
//! (bash, python3, pip, git, cc, tar, awk, sort) still work there.
//!
//! Each test skips loudly when not root. A tool missing from the host's
//! `/usr` (what the sandbox sees) skips its test loudly, and fails it under
//! `CI`, whose runner installs them.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::probe::{assert_default_profile_enforced, build_probe, write_expectations};
use common::{mkdir_user, privileged, Daemon, NativeDirs};
use serde_json::json;

/// True when `have`; otherwise skips loudly, or fails under `CI`.
fn needs(have: bool, test: &str, what: &str) -> bool {
    if have {
        return true;
    }
    common::cannot_run(&format!("{test}: {what}"))
}

/// Copies `src` into the host side of a workspace, owned by the sandbox
/// user.
fn install_user_file(src: &Path, dest: &Path, mode: u32) {
    std::fs::copy(src, dest).unwrap();
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(mode)).unwrap();
    std::os::unix::fs::chown(dest, Some(1000), Some(1000)).unwrap();
}

/// A daemon (extra `env`) with one persistent sandbox `id` of user `u1`.
async fn sandbox_with(dirs: &NativeDirs, id: &str, env: &[(&str, &str)]) -> Daemon {
    let d = Daemon::start_native(dirs, env);
    mkdir_user(&dirs.workspace("u1"));
    let (s, v) = d
        .create(json!({"sandbox_id": id, "thread_id": "t", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    d
}

async fn sandbox(dirs: &NativeDirs, id: &str) -> Daemon {
    sandbox_with(dirs, id, &[]).await
}

/// Runs the probe (built into `build`, with the default profile's list)
/// inside sandbox `id` of `d`; returns (`"rc=<exit code>\n"`, its report),
/// or `None` when the probe cannot be built here (skipped loudly).
async fn probe_in(
    d: &Daemon,
    dirs: &NativeDirs,
    id: &str,
    build: &Path,
) -> Option<(String, String)> {
    let probe = build_probe(build)?;
    let list = write_expectations(build, None);
    let ws = dirs.workspace("u1");
    install_user_file(&probe, &ws.join("seccomp_probe"), 0o755);
    install_user_file(&list, &ws.join("expected-denials.txt"), 0o644);
    // The report goes to a file (it is longer than an exec's output limit)
    // and is read on the host.
    let (out, code) = d
        .exec(
            id,
            "cd /home/gem/user-data && ./seccomp_probe expected-denials.txt > probe.out 2>&1; \
             echo rc=$?",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let text = std::fs::read_to_string(ws.join("probe.out")).unwrap();
    println!("{text}");
    Some((out, text))
}

/// Runs `script` under `bash -euo pipefail` in the sandbox; asserts exit 0
/// and returns the combined output.
async fn run_ok(d: &Daemon, id: &str, script: &str) -> String {
    let (out, code) = d.exec(id, &format!("set -euo pipefail\n{script}")).await;
    assert_eq!(
        code, 0,
        "workload failed in the sandbox:\n{script}\n---\n{out}"
    );
    out
}

#[tokio::test]
async fn probe_passes_inside_a_real_sandbox() {
    if !privileged("probe_passes_inside_a_real_sandbox") {
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let dirs = NativeDirs::new();
    let d = sandbox(&dirs, "probe").await;
    let Some((rc, text)) = probe_in(&d, &dirs, "probe", build.path()).await else {
        return;
    };
    assert_eq!(rc, "rc=0\n", "the probe failed inside the sandbox");
    let checks = assert_default_profile_enforced(&text);
    eprintln!("seccomp probe inside a native sandbox: {checks} checks, 0 failures");
    // What the probe ran under is sandbox-init's stack (allow-list, then
    // the EPERM, EAFNOSUPPORT and EPROTONOSUPPORT filters), inherited by
    // every exec.
    let (out, _) = d
        .exec("probe", "grep -E '^Seccomp(_filters)?:' /proc/self/status")
        .await;
    assert_eq!(out, "Seccomp:\t2\nSeccomp_filters:\t4\n");
}

#[tokio::test]
async fn probe_inside_a_sandbox_notices_a_weaker_profile() {
    // The daemon is configured with the default profile minus the ptrace
    // denial; the probe, still expecting the default profile, must see
    // ENOSYS where it wants EPERM. Proves the in-sandbox run checks the
    // filter the daemon configured, not a fixed one.
    if !privileged("probe_inside_a_sandbox_notices_a_weaker_profile") {
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let dirs = NativeDirs::new();
    let mut v: serde_json::Value =
        serde_json::from_str(sandboxd::seccomp::DEFAULT_PROFILE).unwrap();
    v["syscalls"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["names"] != json!(["ptrace"]));
    let weak = dirs.root.path().join("weak.json");
    std::fs::write(&weak, serde_json::to_string(&v).unwrap()).unwrap();
    let config = dirs.root.path().join("sandboxd.toml");
    std::fs::write(
        &config,
        format!("[native]\nseccomp_profile = {:?}\n", weak.to_str().unwrap()),
    )
    .unwrap();
    let d = sandbox_with(
        &dirs,
        "weak",
        &[("SANDBOXD_CONFIG", config.to_str().unwrap())],
    )
    .await;
    let Some((rc, text)) = probe_in(&d, &dirs, "weak", build.path()).await else {
        return;
    };
    assert_eq!(rc, "rc=1\n", "the probe should have failed:\n{text}");
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 1, "{fails:?}");
    assert!(
        fails[0].starts_with("FAIL list ptrace(101) ret=-1 errno=38(ENOSYS) want=EPERM"),
        "{fails:?}"
    );
}

#[tokio::test]
async fn bash_pipelines_tar_awk_sort_inside_a_sandbox() {
    if !privileged("bash_pipelines_tar_awk_sort_inside_a_sandbox") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = sandbox(&dirs, "sh").await;
    let out = run_ok(
        &d,
        "sh",
        "seq 1 1000 | sort -rn | head -3 | tr '\\n' ' '; echo\n\
         seq 1 100 | awk '{s+=$1} END {print \"sum\", s}'\n\
         printf 'b\\na\\nc\\n' | sort | paste -sd, -\n\
         x=$(echo sub | (cat; echo shell)); echo \"$x\" | wc -l\n\
         cd /tmp && mkdir -p src/a && echo hello > src/a/f && tar czf t.tgz src\n\
         mkdir out && tar xzf t.tgz -C out && cat out/src/a/f && tar tzf t.tgz | sort | paste -sd' ' -",
    )
    .await;
    assert_eq!(
        out,
        "1000 999 998 \nsum 5050\na,b,c\n2\nhello\nsrc/ src/a/ src/a/f\n"
    );
}

#[tokio::test]
async fn python_threads_and_subprocesses_inside_a_sandbox() {
    if !privileged("python_threads_and_subprocesses_inside_a_sandbox") {
        return;
    }
    if !needs(
        Path::new("/usr/bin/python3").exists(),
        "python_threads_and_subprocesses_inside_a_sandbox",
        "/usr/bin/python3 is not installed (apt-get install python3)",
    ) {
        return;
    }
    let dirs = NativeDirs::new();
    let d = sandbox(&dirs, "py").await;
    let script = r#"/usr/bin/python3 - <<'EOF'
import threading, subprocess, concurrent.futures, os, sys
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
print(subprocess.run([sys.executable, "-c", "import os; print(os.getuid())"],
                     capture_output=True, text=True, check=True).stdout.strip())
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
EOF"#;
    let out = run_ok(&d, "py", script).await;
    assert_eq!(
        out, "threads 8\npool 285\nchild\nPIPED\n1000\nfork 7\n",
        "python workload"
    );
}

#[tokio::test]
async fn pip_version_inside_a_sandbox() {
    if !privileged("pip_version_inside_a_sandbox") {
        return;
    }
    let host_pip = Command::new("/usr/bin/python3")
        .args(["-m", "pip", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !needs(
        host_pip,
        "pip_version_inside_a_sandbox",
        "the host's /usr/bin/python3 has no pip module (apt-get install python3-pip)",
    ) {
        return;
    }
    let dirs = NativeDirs::new();
    let d = sandbox(&dirs, "pip").await;
    let out = run_ok(&d, "pip", "/usr/bin/python3 -m pip --version").await;
    assert!(out.starts_with("pip "), "{out}");
    assert!(out.contains("/usr/lib/python3"), "not Debian's pip: {out}");
}

#[tokio::test]
async fn git_init_and_commit_inside_a_sandbox() {
    if !privileged("git_init_and_commit_inside_a_sandbox") {
        return;
    }
    let have = Command::new("bash")
        .args(["-c", "command -v git"])
        .output()
        .map(|o| o.status.success() && o.stdout.starts_with(b"/usr/"))
        .unwrap_or(false);
    if !needs(
        have,
        "git_init_and_commit_inside_a_sandbox",
        "git is not installed under /usr (apt-get install git)",
    ) {
        return;
    }
    let dirs = NativeDirs::new();
    let d = sandbox(&dirs, "git").await;
    let out = run_ok(
        &d,
        "git",
        "cd /home/gem/user-data && git init -q repo && cd repo\n\
         echo data > file && git add file\n\
         git -c user.name='Sandbox Test' -c user.email=t@example.invalid commit -qm 'first commit'\n\
         git log --format='%an %s'; git status --porcelain | wc -l",
    )
    .await;
    assert_eq!(out, "Sandbox Test first commit\n0\n");
    // The repository landed in the user's workspace on the host.
    assert!(dirs.workspace("u1").join("repo/.git/HEAD").is_file());
}

#[tokio::test]
async fn cc_hello_world_inside_a_sandbox() {
    if !privileged("cc_hello_world_inside_a_sandbox") {
        return;
    }
    if !needs(
        Path::new("/usr/bin/cc").exists(),
        "cc_hello_world_inside_a_sandbox",
        "/usr/bin/cc is not installed (apt-get install gcc libc6-dev)",
    ) {
        return;
    }
    let dirs = NativeDirs::new();
    let d = sandbox(&dirs, "cc").await;
    // /tmp and /home/gem are nosuid,nodev tmpfs: exec is allowed in both.
    let out = run_ok(
        &d,
        "cc",
        "printf '#include <stdio.h>\\nint main(void){puts(\"hello from cc\");return 0;}\\n' > /tmp/h.c\n\
         cc -O2 -o /tmp/h /tmp/h.c && /tmp/h\n\
         cc -O2 -o /home/gem/h /tmp/h.c && /home/gem/h",
    )
    .await;
    assert_eq!(out, "hello from cc\nhello from cc\n");
}

/// The launcher installs the stack the daemon compiled at start
/// (`<state_dir>/seccomp.bpf`): a damaged file fails the create at the
/// seccomp step (never a sandbox with less than the profile) and leaves
/// nothing; the intact file makes creates work again.
#[tokio::test]
async fn a_damaged_compiled_stack_fails_the_create_closed() {
    if !privileged("a_damaged_compiled_stack_fails_the_create_closed") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    mkdir_user(&dirs.workspace("u1"));
    mkdir_user(&dirs.skills().join("u1"));
    let bpf = d.state_dir.path().join("seccomp.bpf");
    let good = std::fs::read(&bpf).unwrap();
    assert!(good.starts_with(b"SBXBPF1\n"), "{:?}", &good[..16]);
    assert_eq!(
        std::fs::metadata(&bpf).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::write(&bpf, &good[..good.len() - 8]).unwrap();
    let (s, v) = d
        .create(json!({"sandbox_id": "sb1", "thread_id": "t1", "uid": "u1"}))
        .await;
    assert!(s >= 500, "{s} {v}");
    let text = v.to_string();
    assert!(text.contains("seccomp"), "{text}");
    assert!(
        !d.state_dir.path().join("sandboxes/sb1").exists(),
        "a failed create left its directory"
    );
    std::fs::write(&bpf, &good).unwrap();
    let (s, v) = d
        .create(json!({"sandbox_id": "sb2", "thread_id": "t2", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (out, _) = d
        .exec("sb2", "grep Seccomp_filters /proc/self/status")
        .await;
    assert_eq!(out, "Seccomp_filters:\t4\n");
}
