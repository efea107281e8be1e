//! Unit tests of the compiler: the default profile compiles, and every class
//! of bad profile fails with the file, the entry and the reason.

use super::*;
use crate::seccomp::{load_profile, DEFAULT_PROFILE};

fn compile_str(raw: &str) -> Result<CompiledFilters, SeccompError> {
    let p = Profile::parse(raw, "test-profile.json")?;
    compile(&p)
}

fn err_of(raw: &str) -> String {
    compile_str(raw).unwrap_err().to_string()
}

const HEAD: &str = r#"{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":38,"architectures":["SCMP_ARCH_X86_64"],"syscalls":["#;

#[test]
fn default_profile_compiles_to_allow_list_then_eperm_filter() {
    let (p, _) = load_profile(None).unwrap();
    let c = compile(&p).unwrap();
    assert_eq!(c.filters.len(), 2);
    assert_eq!(c.filters[0].match_action, Action::Allow);
    assert_eq!(
        c.filters[0].mismatch_action,
        Action::Errno(libc::ENOSYS as u32)
    );
    assert_eq!(c.filters[1].match_action, Action::Errno(libc::EPERM as u32));
    assert_eq!(c.filters[1].mismatch_action, Action::Allow);
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
