//! `sandboxd doctor`: a preflight of this node for the configured backend.
//! Each check says what it found, in plain words, and for a problem the fix.
//! The exit status is 0 only when every required check passed, i.e. when a
//! create would work; `serve` runs the same required checks at start and
//! refuses to start with the same messages.

use std::path::Path;

use crate::api::auth;
use crate::backend::BackendKind;
use crate::config::{Config, ProcessEnv};

/// How much a failed check matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A create cannot work without it.
    Required,
    /// Something is lost without it (a cross-check, a hardening).
    Optional,
}

/// The outcome of one check.
#[derive(Debug, Clone)]
pub struct Finding {
    pub name: &'static str,
    pub need: Need,
    /// What was found (ok) or what is wrong, and how to fix it.
    pub result: Result<String, (String, String)>,
}

impl Finding {
    fn ok(name: &'static str, need: Need, what: impl Into<String>) -> Finding {
        Finding {
            name,
            need,
            result: Ok(what.into()),
        }
    }

    fn bad(
        name: &'static str,
        need: Need,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            name,
            need,
            result: Err((problem.into(), fix.into())),
        }
    }

    /// A required check that failed.
    pub fn blocks(&self) -> bool {
        self.need == Need::Required && self.result.is_err()
    }

    /// One line (two for a problem: the fix).
    pub fn render(&self) -> String {
        match &self.result {
            Ok(what) => format!("ok    {:<16} {what}", self.name),
            Err((problem, fix)) => {
                let tag = if self.need == Need::Required {
                    "FAIL"
                } else {
                    "warn"
                };
                format!(
                    "{tag}  {:<16} {problem}\n      {:<16} fix: {fix}",
                    self.name, ""
                )
            }
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// The daemon's config file (also SANDBOXD_CONFIG).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
}

/// `sandboxd doctor`: prints every finding; exit status 1 when a required
/// check failed.
pub fn run(args: DoctorArgs) -> anyhow::Result<i32> {
    let cfg = Config::load(args.config.as_deref(), &ProcessEnv)?;
    let findings = check(&cfg);
    for f in &findings {
        println!("{}", f.render());
    }
    let blocking = findings.iter().filter(|f| f.blocks()).count();
    if blocking == 0 {
        println!("\nthis node can run {:?} sandboxes", cfg.backend);
        Ok(0)
    } else {
        println!("\n{blocking} required check(s) failed: a create would not work");
        Ok(1)
    }
}

/// The required checks that failed, rendered, for `serve` to refuse with.
pub fn blocking(cfg: &Config) -> Vec<String> {
    check(cfg)
        .into_iter()
        .filter(Finding::blocks)
        .map(|f| f.render())
        .collect()
}

/// Every check for `cfg`'s backend.
pub fn check(cfg: &Config) -> Vec<Finding> {
    let mut out = vec![token_files(cfg)];
    if cfg.backend != BackendKind::Native {
        return out;
    }
    out.push(root());
    out.push(kernel());
    out.extend(syscalls());
    out.push(seccomp(cfg));
    out.push(cgroups(cfg));
    for (name, path) in [
        ("state dir", &cfg.state_dir),
        ("user-data root", &cfg.user_data_root),
        ("skills root", &cfg.skills_root),
    ] {
        out.push(directory(name, path));
    }
    out.push(network(cfg));
    out.push(userns(cfg));
    out.push(image(cfg));
    out.push(swap(cfg));
    out.push(runc());
    out
}

/// Whether the hibernation ladder's reclaim step can work: the node's
/// swap (kind, size) and what it would gain now (the anonymous memory of
/// the sandboxes running under the cgroup parent). Optional: without swap
/// idle sandboxes are frozen but keep their memory.
fn swap(cfg: &Config) -> Finding {
    let s = crate::backend::native::hibernate::swap_info();
    let anon: u64 = crate::cgroups::CgroupRoot::detect(&cfg.native.cgroup_parent)
        .ok()
        .map(|root| {
            root.list()
                .unwrap_or_default()
                .iter()
                .filter_map(|id| root.open(id).ok().flatten())
                .filter_map(|cg| cg.memory_usage().ok())
                .map(|u| u.anon)
                .sum()
        })
        .unwrap_or(0);
    let reclaim = if cfg.idle.freeze_after_seconds == 0 || cfg.idle.reclaim_after_seconds == 0 {
        "reclaim step off in [idle]".to_string()
    } else {
        format!("reclaim after {} s idle", cfg.idle.reclaim_after_seconds)
    };
    let gain = format!(
        "the sandboxes here hold {} MiB of anonymous memory now",
        anon >> 20
    );
    if s.total_bytes == 0 {
        return Finding::bad(
            "swap",
            Need::Optional,
            format!("no swap: idle sandboxes are frozen but keep their memory ({reclaim}; {gain}, all of which would stay in memory)"),
            "add swap, e.g. zram: modprobe zram && echo lz4 > /sys/block/zram0/comp_algorithm && echo 8G > /sys/block/zram0/disksize && mkswap /dev/zram0 && swapon -p 100 /dev/zram0 (see docs/operations.md, \"Hibernation\")",
        );
    }
    let what = match s.kind() {
        "zram" => "zram (compressed in memory: reclaim frees what the compression saves, see docs/performance.md)",
        "disk" => "disk (reclaim frees nearly all of it)",
        _ => "zram and disk",
    };
    Finding::ok(
        "swap",
        Need::Optional,
        format!(
            "{what}, {} MiB, {} MiB free; {reclaim}; {gain}",
            s.total_bytes >> 20,
            s.free_bytes >> 20
        ),
    )
}

/// Whether sandboxes would get user namespaces: the daemon's own start-up
/// probe (`sandbox-init --probe-idmap`) over the user-data and skills roots
/// that exist. Optional: without them sandboxes run as host uid 1000
/// (`[userns] mode = "on"` makes the daemon itself refuse to start).
fn userns(cfg: &Config) -> Finding {
    use crate::backend::native::userns::UsernsMode;
    const NAME: &str = "user namespaces";
    if cfg.userns.mode == UsernsMode::Off {
        return Finding::ok(
            NAME,
            Need::Optional,
            "off ([userns] mode = \"off\"): every sandbox runs as host uid 1000",
        );
    }
    let init = match &cfg.native.init_path {
        Some(p) => p.clone(),
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name("sandbox-init"),
            Err(e) => {
                return Finding::bad(
                    NAME,
                    Need::Optional,
                    format!("cannot find sandbox-init: {e}"),
                    "set [native] init_path",
                )
            }
        },
    };
    // A root not made yet is checked on the directory it will be made in.
    let paths: Vec<std::path::PathBuf> = [&cfg.user_data_root, &cfg.skills_root]
        .into_iter()
        .filter_map(|p| p.ancestors().find(|a| a.exists()).map(Path::to_path_buf))
        .collect();
    match crate::backend::native::userns::probe(&init, &paths, cfg.userns.range_start) {
        Ok(()) => Finding::ok(
            NAME,
            Need::Optional,
            format!(
                "on ([userns] mode = \"{}\"): idmapped mounts work on the user-data and skills roots",
                cfg.userns.mode
            ),
        ),
        Err(e) => Finding::bad(
            NAME,
            Need::Optional,
            format!("idmapped mounts do not work here, sandboxes would run as host uid 1000: {e}"),
            "put the user-data and skills roots on ext4, xfs, btrfs or tmpfs (Linux 5.12+; tmpfs 6.3+), or set [userns] mode = \"off\" to silence this",
        ),
    }
}

/// The default image (`[images] default`): present in the store, or
/// pulled at start (creates wait for it). Never blocks: the daemon serves
/// meanwhile.
fn image(cfg: &Config) -> Finding {
    let Some(r) = cfg.images.default.as_deref() else {
        return Finding::ok(
            "image",
            Need::Optional,
            "no default image: sandboxes run the host's userland",
        );
    };
    if let Some(f) = cfg.images.auth_file.as_deref() {
        if let Err(e) = std::fs::metadata(f) {
            return Finding::bad(
                "image",
                Need::Optional,
                format!("[images] auth_file {}: {e}", f.display()),
                "write the Docker-style config.json there, or unset auth_file",
            );
        }
    }
    match crate::images::resolve_stored(cfg, r) {
        Ok(i) => Finding::ok(
            "image",
            Need::Optional,
            format!("default image {} present ({})", i.reference, i.digest),
        ),
        Err(e) => Finding::bad(
            "image",
            Need::Optional,
            format!("{e:#}; the daemon pulls it at start and creates wait for it"),
            format!("sandboxd image pull {r} (or `sandboxd image import` on an air-gapped node)"),
        ),
    }
}

/// With egress networking: the `nft` binary the daemon loads its table
/// with, and IPv4 forwarding (the daemon turns it on at start).
fn network(cfg: &Config) -> Finding {
    if cfg.network.mode != crate::model::NetworkMode::Egress {
        return Finding::ok(
            "network",
            Need::Required,
            "mode none: loopback only, nothing needed",
        );
    }
    let nft = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("nft").is_file()))
        .unwrap_or(false);
    if !nft {
        return Finding::bad(
            "network",
            Need::Required,
            "egress mode needs the nft binary, which is not installed",
            "apt-get install nftables, or set [network] mode = \"none\" (SANDBOXD_NETWORK=none)",
        );
    }
    let forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .map(|t| t.trim() == "1")
        .unwrap_or(false);
    Finding::ok(
        "network",
        Need::Required,
        format!(
            "egress: nft found, subnet {}, net.ipv4.ip_forward {}",
            cfg.network.subnet,
            if forward {
                "on"
            } else {
                "off (the daemon turns it on at start)"
            }
        ),
    )
}

fn root() -> Finding {
    if nix::unistd::geteuid().is_root() {
        Finding::ok("root", Need::Required, "running as root")
    } else {
        Finding::bad(
            "root",
            Need::Required,
            "not running as root: namespaces, mounts and cgroups need it",
            "run sandboxd as root (the systemd unit does)",
        )
    }
}

fn kernel() -> Finding {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let version: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|p| p.parse().ok())
        .collect();
    let new_enough = matches!(version.as_slice(), [a, b] if (*a, *b) >= (5, 11));
    if new_enough {
        Finding::ok("kernel", Need::Required, format!("Linux {release}"))
    } else {
        Finding::bad(
            "kernel",
            Need::Required,
            format!("Linux {release}: openat2 (5.6), pidfd_open (5.3) and close_range with CLOSE_RANGE_CLOEXEC (5.11) are needed"),
            "run a kernel 5.11 or newer",
        )
    }
}

/// Probes the system calls the daemon and launcher use, by calling them.
fn syscalls() -> Vec<Finding> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let mut out = Vec::new();
    out.push(
        match rustix::fs::openat2(
            rustix::fs::CWD,
            "/",
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        ) {
            Ok(_) => Finding::ok("openat2", Need::Required, "no-follow path resolution works"),
            Err(e) => Finding::bad(
                "openat2",
                Need::Required,
                format!("openat2 fails: {e}"),
                "run a kernel 5.6 or newer without a seccomp policy that denies openat2",
            ),
        },
    );
    let me = rustix::process::getpid();
    out.push(
        match rustix::process::pidfd_open(me, rustix::process::PidfdFlags::empty()) {
            Ok(_) => Finding::ok("pidfd", Need::Required, "pidfd_open works"),
            Err(e) => Finding::bad(
                "pidfd",
                Need::Required,
                format!("pidfd_open fails: {e}"),
                "run a kernel 5.3 or newer",
            ),
        },
    );
    // clone3 with a zero-sized argument answers EINVAL when the call exists.
    // SAFETY: with size 0 the kernel reads no argument and creates nothing.
    let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    out.push(if r < 0 && errno == Some(libc::ENOSYS) {
        Finding::bad(
            "clone3",
            Need::Optional,
            "clone3 is not available",
            "run a kernel 5.3 or newer (used for PID-exact tests and future features)",
        )
    } else {
        Finding::ok("clone3", Need::Optional, "clone3 exists")
    });
    // mount_setattr (idmapped mounts, 5.12): EBADF/EINVAL on a bad fd when
    // the call exists.
    // SAFETY: an invalid fd and a null attr: the kernel changes nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1,
            std::ptr::null::<u8>(),
            0,
            std::ptr::null::<u8>(),
            0usize,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error();
    out.push(if r < 0 && errno == Some(libc::ENOSYS) {
        Finding::bad(
            "idmapped mounts",
            Need::Optional,
            "mount_setattr is not available: user namespaces with idmapped workspaces will not work",
            "run a kernel 5.12 or newer",
        )
    } else {
        Finding::ok("idmapped mounts", Need::Optional, "mount_setattr exists")
    });
    let overlay = std::fs::read_to_string("/proc/filesystems")
        .map(|t| t.lines().any(|l| l.trim_end().ends_with("overlay")))
        .unwrap_or(false);
    out.push(if overlay {
        Finding::ok("overlay", Need::Optional, "overlayfs is available")
    } else {
        Finding::bad(
            "overlay",
            Need::Optional,
            "overlayfs is not listed in /proc/filesystems",
            "load the overlay module (modprobe overlay) if images should use it",
        )
    });
    out
}

fn seccomp(cfg: &Config) -> Finding {
    match crate::seccomp::load_and_compile(cfg.native.seccomp_profile.as_deref()) {
        Ok((profile, _, filters)) => Finding::ok(
            "seccomp",
            Need::Required,
            format!(
                "{} compiles to {} filters",
                profile.source,
                filters.filters.len()
            ),
        ),
        Err(e) => Finding::bad(
            "seccomp",
            Need::Required,
            e.to_string(),
            "fix the profile (sandboxd seccomp check --profile FILE shows where)",
        ),
    }
}

fn cgroups(cfg: &Config) -> Finding {
    match crate::cgroups::CgroupRoot::detect(&cfg.native.cgroup_parent) {
        Ok(root) => {
            let missing: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| !root.has_controller(c))
                .collect();
            if missing.is_empty() {
                let devices = if root.layout().uses_v1() {
                    ", device rules enforced (devices cgroup)".to_string()
                } else {
                    match crate::cgroups::bpf::probe() {
                        Ok(()) => ", device rules enforced (BPF device program)".to_string(),
                        Err(e) => format!(", device rules NOT enforced: {e}"),
                    }
                };
                Finding::ok(
                    "cgroups",
                    Need::Required,
                    format!(
                        "{} layout, memory, pids and cpu controllers, parent {}{devices}",
                        root.layout(),
                        cfg.native.cgroup_parent,
                    ),
                )
            } else {
                Finding::bad(
                    "cgroups",
                    Need::Required,
                    format!("controllers missing: {}", missing.join(", ")),
                    "enable them (v2: add them to cgroup.subtree_control of the parent; under systemd: Delegate=yes in the unit)",
                )
            }
        }
        Err(e) => Finding::bad(
            "cgroups",
            Need::Required,
            e.to_string(),
            "mount cgroup2 (or the v1 controllers) under /sys/fs/cgroup",
        ),
    }
}

fn directory(name: &'static str, path: &Path) -> Finding {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(md) if md.is_dir() => {
            let free = nix::sys::statvfs::statvfs(path)
                .map(|s| s.blocks_available() * s.fragment_size() / (1 << 20))
                .unwrap_or(0);
            if md.uid() != 0 && name == "state dir" {
                return Finding::bad(
                    name,
                    Need::Required,
                    format!("{} is owned by uid {}", path.display(), md.uid()),
                    format!("chown root:root {}", path.display()),
                );
            }
            Finding::ok(
                name,
                Need::Required,
                format!("{} (owner {}, {free} MiB free)", path.display(), md.uid()),
            )
        }
        Ok(_) => Finding::bad(
            name,
            Need::Required,
            format!("{} is not a directory", path.display()),
            "point the setting at a directory",
        ),
        // The daemon creates missing roots at start.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Finding::ok(
            name,
            Need::Required,
            format!(
                "{} does not exist yet (the daemon creates it)",
                path.display()
            ),
        ),
        Err(e) => Finding::bad(
            name,
            Need::Required,
            format!("{}: {e}", path.display()),
            "make it readable by root",
        ),
    }
}

fn token_files(cfg: &Config) -> Finding {
    let files: Vec<&Path> = cfg
        .token_origin
        .iter()
        .map(|p| p.as_path())
        .chain(cfg.token_file.iter().map(|p| p.as_path()))
        .collect();
    for f in &files {
        if let Err(e) = auth::check_secret_file(f) {
            let fix = match &e {
                auth::AuthError::Exposed { path, .. } => format!("chmod 600 {}", path.display()),
                auth::AuthError::NotOwned { path, .. } => {
                    format!("chown root:root {}", path.display())
                }
                _ => "make the file readable by root".to_string(),
            };
            return Finding::bad("token", Need::Required, e.to_string(), fix);
        }
    }
    Finding::ok(
        "token",
        Need::Required,
        if files.is_empty() {
            "no token file configured (the environment's, or one generated in the state dir)"
                .to_string()
        } else {
            "token files are private".to_string()
        },
    )
}

fn runc() -> Finding {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("runc").is_file()))
        .unwrap_or(false);
    if found {
        Finding::ok(
            "runc",
            Need::Optional,
            "runc is installed (for cross-checking bundles)",
        )
    } else {
        Finding::bad(
            "runc",
            Need::Optional,
            "runc is not installed: `sandboxd bundle` output cannot be cross-checked",
            "apt-get install runc (optional)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_renders_with_its_fix_and_blocks_only_when_required() {
        let f = Finding::bad("token", Need::Required, "too open", "chmod 600 x");
        assert!(f.blocks());
        assert!(f.render().starts_with("FAIL  token"));
        assert!(f.render().contains("fix: chmod 600 x"));
        let w = Finding::bad("runc", Need::Optional, "absent", "install it");
        assert!(!w.blocks());
        assert!(w.render().starts_with("warn"));
    }
}
