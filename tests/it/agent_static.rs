//! The agent is a static executable: it runs in an image with no libc at
//! all. Proven by running it chrooted into a directory that holds nothing
//! but the binary (no `/lib`, no `/usr`, no `/proc`) and asking it
//! `GET /v1/sandbox`.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{privileged, sibling_bin};

/// The program headers of an ELF64 little-endian file: (p_type, ...).
fn program_header_types(elf: &[u8]) -> Vec<u32> {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum)
        .map(|i| {
            let o = phoff + i * phentsize;
            u32::from_le_bytes(elf[o..o + 4].try_into().unwrap())
        })
        .collect()
}

#[test]
fn the_agent_binary_needs_no_dynamic_loader() {
    let bin = sibling_bin("sandbox-agent");
    let elf = std::fs::read(&bin).unwrap();
    const PT_INTERP: u32 = 3;
    assert!(
        !program_header_types(&elf).contains(&PT_INTERP),
        "{} asks for a dynamic loader (PT_INTERP): it is not static",
        bin.display()
    );
    // ldd agrees when it is installed ("statically linked" for a
    // static-pie, "not a dynamic executable" for a non-PIE static binary).
    if let Ok(out) = Command::new("ldd").arg(&bin).output() {
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("statically linked") || text.contains("not a dynamic executable"),
            "ldd {}: {text}",
            bin.display()
        );
        assert!(!text.contains("=>"), "shared libraries listed: {text}");
    }
    // The daemon, by contrast, stays dynamically linked (glibc's NSS).
    let daemon = std::fs::read(env!("CARGO_BIN_EXE_sandboxd")).unwrap();
    assert!(program_header_types(&daemon).contains(&PT_INTERP));
}

#[test]
fn the_agent_answers_from_a_root_that_holds_only_itself() {
    if !privileged("the_agent_answers_from_a_root_that_holds_only_itself") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::copy(
        sibling_bin("sandbox-agent"),
        root.path().join("sandbox-agent"),
    )
    .unwrap();
    let entries: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["sandbox-agent"], "the root holds the agent only");

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = root.path().to_path_buf();
    let mut cmd = Command::new("/sandbox-agent");
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env_clear()
        .env("SANDBOX_AGENT_LOG", "warn")
        .stdin(Stdio::null());
    // SAFETY: chroot and chdir are plain syscalls, async-signal-safe; they
    // change only the child's root and cwd between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::chroot(&dir)?;
            nix::unistd::chdir("/")?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("exec the agent inside the chroot");

    let deadline = Instant::now() + Duration::from_secs(20);
    let response = loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /v1/sandbox HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            break text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the chrooted agent exited: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the chrooted agent never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    assert!(body.contains("\"success\":true"), "{body}");
}
