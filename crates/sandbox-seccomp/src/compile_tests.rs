//! Unit tests of the compiler: the default profile compiles, and every class
//! of bad profile fails with the file, the entry and the reason.

use super::*;
use crate::{load_profile, DEFAULT_PROFILE};

fn compile_str(raw: &str) -> Result<CompiledFilters, SeccompError> {
    let p = Profile::parse(raw, "test-profile.json")?;
    compile(&p)
}

fn err_of(raw: &str) -> String {
    compile_str(raw).unwrap_err().to_string()
}

const HEAD: &str = r#"{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":38,"architectures":["SCMP_ARCH_X86_64"],"syscalls":["#;

#[test]
fn default_profile_compiles_to_allow_list_then_one_filter_per_errno() {
    let (p, _) = load_profile(None).unwrap();
    let c = compile(&p).unwrap();
    assert_eq!(c.filters.len(), 4);
    assert_eq!(c.filters[0].match_action, Action::Allow);
    assert_eq!(
        c.filters[0].mismatch_action,
        Action::Errno(libc::ENOSYS as u32)
    );
    assert_eq!(c.filters[1].match_action, Action::Errno(libc::EPERM as u32));
    assert_eq!(c.filters[1].mismatch_action, Action::Allow);
    // socket()/socketpair() families, then protocols: the errnos of a
    // kernel without them.
    assert_eq!(
        c.filters[2].match_action,
        Action::Errno(libc::EAFNOSUPPORT as u32)
    );
    assert_eq!(
        c.filters[3].match_action,
        Action::Errno(libc::EPROTONOSUPPORT as u32)
    );
    for n in c.instruction_counts() {
        assert!(n > 10 && n <= MAX_INSTRUCTIONS, "{n}");
    }
    assert!(DEFAULT_PROFILE.contains("\"comment\""));
}

#[test]
fn unknown_syscall_name_names_entry() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["read"],"action":"SCMP_ACT_ALLOW"}},{{"names":["write","frobnicate"],"action":"SCMP_ACT_ALLOW"}}]}}"#
    ));
    assert!(e.contains("test-profile.json"), "{e}");
    assert!(e.contains("syscalls[1]"), "{e}");
    assert!(e.contains("write,frobnicate"), "{e}");
    assert!(e.contains("unknown syscall name \"frobnicate\""), "{e}");
}

#[test]
fn malformed_json_names_file_and_position() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["read"],"action":"SCMP_ACT_ALLOW""#
    ));
    assert!(e.contains("test-profile.json"), "{e}");
    assert!(e.contains("malformed"), "{e}");
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn argument_index_six_is_rejected() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["socket"],"action":"SCMP_ACT_ALLOW","args":[{{"index":6,"value":1,"op":"SCMP_CMP_EQ"}}]}}]}}"#
    ));
    assert!(e.contains("syscalls[0] (socket)"), "{e}");
    assert!(e.contains("argument index 6 out of range"), "{e}");
}

#[test]
fn unknown_action_and_operator_are_rejected() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["read"],"action":"SCMP_ACT_MAYBE"}}]}}"#
    ));
    assert!(
        e.contains("syscalls[0] (read)") && e.contains("SCMP_ACT_MAYBE"),
        "{e}"
    );
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["socket"],"action":"SCMP_ACT_ALLOW","args":[{{"index":0,"value":1,"op":"SCMP_CMP_ABOUT"}}]}}]}}"#
    ));
    assert!(e.contains("unknown comparison operator"), "{e}");
}

#[test]
fn two_comparisons_of_one_argument_are_rejected() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["socket"],"action":"SCMP_ACT_ALLOW","args":[{{"index":0,"value":1,"op":"SCMP_CMP_NE"}},{{"index":0,"value":2,"op":"SCMP_CMP_NE"}}]}}]}}"#
    ));
    assert!(e.contains("two comparisons of argument 0"), "{e}");
}

#[test]
fn over_4096_instructions_is_rejected() {
    // 1000 conditional rules for one syscall: far over the kernel limit.
    let entries: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                r#"{{"names":["ioctl"],"action":"SCMP_ACT_ALLOW","args":[{{"index":1,"value":{i},"op":"SCMP_CMP_EQ"}}]}}"#
            )
        })
        .collect();
    let e = err_of(&format!("{HEAD}{}]}}", entries.join(",")));
    assert!(e.contains("test-profile.json"), "{e}");
    assert!(e.contains("allow-list"), "{e}");
    assert!(e.contains("at most 4096"), "{e}");
}

#[test]
fn conditional_and_unconditional_clash_is_rejected() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["ioctl"],"action":"SCMP_ACT_ALLOW"}},{{"names":["ioctl"],"action":"SCMP_ACT_ERRNO","errnoRet":1,"args":[{{"index":1,"value":21522,"op":"SCMP_CMP_EQ"}}]}}]}}"#
    ));
    assert!(e.contains("syscalls[1] (ioctl)"), "{e}");
    assert!(e.contains("unconditional"), "{e}");
}

#[test]
fn docker_only_conditions_are_rejected() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["chroot"],"action":"SCMP_ACT_ALLOW","includes":{{"caps":["CAP_SYS_CHROOT"]}}}}]}}"#
    ));
    assert!(e.contains("Docker-only"), "{e}");
}

#[test]
fn masked_eq_value_outside_mask_is_rejected() {
    let e = err_of(&format!(
        r#"{HEAD}{{"names":["clone"],"action":"SCMP_ACT_ALLOW","args":[{{"index":0,"value":1,"valueTwo":3,"op":"SCMP_CMP_MASKED_EQ"}}]}}]}}"#
    ));
    assert!(e.contains("outside the mask"), "{e}");
}

/// Installs the default filters in a forked child and checks the kernel's
/// answers there (the test process itself stays unfiltered).
#[cfg(target_arch = "x86_64")]
#[test]
fn installed_filters_give_the_exact_errnos_in_a_child() {
    let (p, _) = load_profile(None).unwrap();
    let filters = compile(&p).unwrap(); // compiled before fork: no allocation after
                                        // SAFETY: the child only makes raw syscalls (prctl, seccomp, getpid,
                                        // ptrace, an unassigned number) and leaves with _exit; it allocates
                                        // nothing and takes no locks, so forking from the multi-threaded test
                                        // harness is sound.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = (|| {
                if nix::sys::prctl::set_no_new_privs().is_err() || install(&filters).is_err() {
                    return 10;
                }
                // SAFETY: raw syscalls with scalar arguments; no memory is passed.
                let errno_of = |nr: libc::c_long| unsafe {
                    if libc::syscall(nr, -1, -1, -1, -1) == -1 {
                        *libc::__errno_location()
                    } else {
                        0
                    }
                };
                if errno_of(libc::SYS_getpid) != 0 {
                    return 11;
                }
                if errno_of(libc::SYS_ptrace) != libc::EPERM {
                    return 12;
                }
                if errno_of(libc::SYS_mount) != libc::EPERM {
                    return 13;
                }
                if errno_of(400) != libc::ENOSYS {
                    return 14;
                }
                if errno_of(libc::SYS_clone3) != libc::ENOSYS {
                    return 15;
                }
                0
            })();
            // SAFETY: _exit is async-signal-safe and ends the child at once.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
        }
    }
}

/// Foreign ABIs in a forked child under the default filters: an x32 number
/// (`__X32_SYSCALL_BIT | getpid`) kills the process with SIGSYS, as the
/// architecture check does for i386, rather than returning ENOSYS.
#[cfg(target_arch = "x86_64")]
#[test]
fn an_x32_syscall_kills_the_process() {
    let (p, _) = load_profile(None).unwrap();
    let filters = compile(&p).unwrap();
    // SAFETY: the child only makes raw syscalls (prctl, seccomp, one x32
    // number) and leaves with _exit; it allocates nothing and takes no
    // locks, so forking from the multi-threaded test harness is sound.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = if nix::sys::prctl::set_no_new_privs().is_err() || install(&filters).is_err()
            {
                10
            } else {
                // SAFETY: a raw syscall without arguments.
                let r = unsafe {
                    libc::syscall(libc::c_long::from(abi::X32_SYSCALL_BIT) | libc::SYS_getpid)
                };
                if r == -1 {
                    20
                } else {
                    21
                }
            };
            // SAFETY: _exit is async-signal-safe and ends the child at once.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert!(
                matches!(
                    status,
                    nix::sys::wait::WaitStatus::Signaled(_, nix::sys::signal::Signal::SIGSYS, _)
                ),
                "{status:?} (exit 20: ENOSYS, not killed)"
            );
        }
    }
}
