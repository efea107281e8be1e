//! The less obvious rules of `docs/images-unpack.md`: parent creation
//! through dangling symlinks, deep trees, parser agreement with Go's
//! archive/tar, PAX overrides.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

#[test]
fn a_dangling_symlink_in_a_parent_is_followed_inside_the_rootfs() {
    let mut h = Host::new();
    // debian-style `var/run -> /run` before `/run` exists, and a relative one.
    let layer = Tar::new()
        .symlink("var/run", "/run")
        .file("var/run/pid", b"1")
        .symlink("lib", "usr/lib")
        .file("lib/x/libc.so", b"elf")
        .symlink("a/b", "../c/d")
        .file("a/b/f", b"f")
        .done();
    h.apply(&layer).unwrap();
    assert_eq!(fs::read(h.r("run/pid")).unwrap(), b"1");
    assert_eq!(fs::read(h.r("usr/lib/x/libc.so")).unwrap(), b"elf");
    assert_eq!(fs::read(h.r("c/d/f")).unwrap(), b"f");
    assert!(fs::symlink_metadata(h.r("var/run")).unwrap().is_symlink());
    h.assert_host_untouched();
}

#[test]
fn a_dangling_symlink_climbing_out_is_clamped() {
    let mut h = Host::new();
    let layer = Tar::new()
        .symlink("up", "../../../../newdir")
        .file("up/f", b"f")
        .done();
    h.apply(&layer).unwrap();
    assert_eq!(fs::read(h.r("newdir/f")).unwrap(), b"f");
    assert!(!h.tmp.path().join("newdir").exists());
    h.assert_host_untouched();
}

#[test]
fn symlink_loops_in_a_parent_fail_cleanly() {
    let mut h = Host::new();
    let layer = Tar::new()
        .symlink("a", "b")
        .symlink("b", "a")
        .file("a/f", b"f")
        .done();
    let r = h.apply(&layer);
    assert!(r.is_err(), "{r:?}");
    // A dangling chain that keeps growing.
    let mut h = Host::new();
    let layer = Tar::new().symlink("s", "s/x").file("s/f", b"f").done();
    let r = h.apply(&layer);
    assert!(r.is_err(), "{r:?}");
    h.assert_host_untouched();
}

#[test]
fn a_parent_that_is_a_file_fails_cleanly() {
    let mut h = Host::new();
    let r = h.apply(&Tar::new().file("f", b"f").file("f/g", b"g").done());
    assert!(
        matches!(r, Err(sandbox_image::unpack::UnpackError::Io { .. })),
        "{r:?}"
    );
}

/// Lowers this process's fd limit to 512 (the tests here use a handful
/// each): a remover holding one fd per level would fail below.
fn few_fds() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let want = Some(512).min(cur.current.or(Some(512)));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: want,
            maximum: cur.maximum,
        },
    )
    .unwrap();
}

#[test]
fn deep_trees_are_whited_out() {
    // 1500 levels: more than the fds a recursive remover could hold.
    few_fds();
    let mut h = Host::new();
    let deep = "a/".repeat(1500);
    let layer1 = Tar::new()
        .long_name(format!("{deep}f").as_bytes())
        .file("x", b"bottom")
        .done();
    h.apply(&layer1).unwrap();
    assert_eq!(fs::read(h.r(&format!("{deep}f"))).unwrap(), b"bottom");
    h.apply(&Tar::new().file(".wh.a", b"").done()).unwrap();
    assert!(tree(&h.root).is_empty());
    h.assert_host_untouched();
}

#[test]
fn deep_trees_are_replaced() {
    few_fds();
    let mut h = Host::new();
    let deep = "d/".repeat(1200);
    h.apply(
        &Tar::new()
            .long_name(format!("{deep}f").as_bytes())
            .file("x", b"x")
            .done(),
    )
    .unwrap();
    h.apply(&Tar::new().file("d", b"now a file").done())
        .unwrap();
    assert_eq!(fs::read(h.r("d")).unwrap(), b"now a file");
}

#[test]
fn header_only_types_carry_no_content_like_go_archive_tar() {
    // A symlink header claiming 512 bytes of content, followed directly by
    // the next header: Go (docker, containerd, buildkit) reads the next
    // header there; so do we.
    let mut h = Host::new();
    let mut l = Hdr::new("l", SYM);
    l.link = b"target".to_vec();
    l.size = 512;
    let mut t = Tar::new();
    t.0.extend_from_slice(&l.bytes());
    t.file("f", b"content");
    h.apply(&t.done()).unwrap();
    assert_eq!(fs::read_link(h.r("l")).unwrap().to_str(), Some("target"));
    assert_eq!(fs::read(h.r("f")).unwrap(), b"content");
}

#[test]
fn pre_posix_directories_and_empty_numeric_fields() {
    let mut h = Host::new();
    let mut d = Hdr::new("olddir/", 0);
    d.mode = 0o750;
    let mut bytes = d.bytes();
    // Empty uid/gid/mtime fields, checksum recomputed.
    bytes[108..124].fill(0);
    bytes[136..148].fill(0);
    bytes[148..156].fill(b' ');
    let sum: u32 = bytes.iter().map(|&b| u32::from(b)).sum();
    bytes[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut layer = bytes.to_vec();
    layer.extend_from_slice(&[0u8; 1024]);
    h.apply(&layer).unwrap();
    let md = fs::symlink_metadata(h.r("olddir")).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.permissions().mode() & 0o7777, 0o750);
}

#[test]
fn pax_records_override_the_header() {
    let mut h = Host::new();
    let long = format!("{}/file", "p".repeat(150));
    let layer = Tar::new()
        .pax(&[
            ("path", long.as_bytes()),
            ("uid", b"3000000"),
            ("gid", b"3000001"),
            ("mtime", b"1700000000.5"),
            ("comment", b"ignored"),
        ])
        .file("short", b"data")
        .done();
    h.apply(&layer).unwrap();
    let md = fs::metadata(h.r(&long)).unwrap();
    assert_eq!(md.mtime(), 1_700_000_000);
    if is_root() {
        assert_eq!((md.uid(), md.gid()), (3_000_000, 3_000_001));
    }
    assert!(!h.r("short").exists());
}

#[test]
fn out_of_range_owners_are_refused() {
    let mut h = Host::new();
    let layer = Tar::new()
        .pax(&[("uid", b"4294967295")])
        .file("f", b"")
        .done();
    assert_hostile(h.apply(&layer), "uid -1");
    let layer = Tar::new()
        .pax(&[("uid", b"99999999999")])
        .file("f", b"")
        .done();
    assert_hostile(h.apply(&layer), "uid > u32");
}

#[test]
fn pax_sparse_files_are_refused() {
    let mut h = Host::new();
    let layer = Tar::new()
        .pax(&[("GNU.sparse.major", b"1")])
        .file("f", b"")
        .done();
    assert_hostile(h.apply(&layer), "pax sparse");
}

#[test]
fn hard_links_to_symlinks_and_to_themselves() {
    let mut h = Host::new();
    let layer = Tar::new()
        .symlink("s", h.outside.to_str().unwrap())
        .hardlink("s2", "s")
        .file("f", b"f")
        .hardlink("f", "f")
        .done();
    h.apply(&layer).unwrap();
    let s = fs::symlink_metadata(h.r("s")).unwrap();
    let s2 = fs::symlink_metadata(h.r("s2")).unwrap();
    assert!(s2.is_symlink());
    assert_eq!(s.ino(), s2.ino());
    assert_eq!(fs::read(h.r("f")).unwrap(), b"f");
    h.assert_host_untouched();
}

#[test]
fn hard_link_to_a_lower_layer_file() {
    let mut h = Host::new();
    h.apply(&Tar::new().file("usr/bin/python3.12", b"py").done())
        .unwrap();
    h.apply(
        &Tar::new()
            .hardlink("usr/bin/python3", "usr/bin/python3.12")
            .done(),
    )
    .unwrap();
    assert_eq!(
        fs::metadata(h.r("usr/bin/python3")).unwrap().ino(),
        fs::metadata(h.r("usr/bin/python3.12")).unwrap().ino()
    );
}

#[test]
fn the_root_directory_entry_sets_the_rootfs_mode() {
    let mut h = Host::new();
    h.apply(&Tar::new().dir_mode("./", 0o4755).file("f", b"").done())
        .unwrap();
    assert_eq!(
        fs::metadata(&h.root).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert_hostile(h.apply(&Tar::new().file("./", b"").done()), "file at root");
    assert_hostile(
        h.apply(&Tar::new().symlink("/", "x").done()),
        "symlink at root",
    );
}

#[test]
fn opaque_marker_under_a_symlink_does_nothing() {
    let mut h = Host::new();
    h.apply(
        &Tar::new()
            .file("real/f", b"f")
            .symlink("link", "real")
            .done(),
    )
    .unwrap();
    h.apply(&Tar::new().file("link/.wh..wh..opq", b"").done())
        .unwrap();
    assert_eq!(fs::read(h.r("real/f")).unwrap(), b"f");
}

#[test]
fn whiteout_metadata_and_empty_layers() {
    let mut h = Host::new();
    let stats = h
        .apply(&Tar::new().file(".wh..wh.plnk", b"").done())
        .unwrap();
    assert_eq!(stats.skipped.len(), 1);
    // An empty stream and a bare end marker are empty layers.
    h.apply(b"").unwrap();
    h.apply(&[0u8; 1024]).unwrap();
}

#[test]
fn sparse_content_is_written_with_holes() {
    let mut h = Host::new();
    let mut data = vec![0u8; 8 << 20];
    data[0] = 1;
    data[(4 << 20) + 10] = 2;
    h.apply(
        &Tar::new()
            .file("img", &data)
            .file("zeros", &vec![0u8; 1 << 20])
            .done(),
    )
    .unwrap();
    assert_eq!(fs::read(h.r("img")).unwrap(), data);
    assert_eq!(fs::read(h.r("zeros")).unwrap(), vec![0u8; 1 << 20]);
    let md = fs::metadata(h.r("img")).unwrap();
    assert_eq!(md.len(), 8 << 20);
    assert!(
        md.blocks() * 512 < 8 << 20,
        "no holes: {} blocks",
        md.blocks()
    );
}

#[test]
fn mount_points_are_made_real_without_following_the_images_symlinks() {
    use sandbox_image::unpack::ensure_mount_points;
    let mut h = Host::new();
    let outside = h.outside.to_str().unwrap().to_owned();
    let layer = Tar::new()
        .symlink("home", &outside)
        .symlink("tmp", "/")
        .dir("etc")
        .symlink("etc/resolv.conf", format!("{outside}/sentinel"))
        .dir("etc/hosts")
        .file("etc/hosts/inner", b"x")
        .symlink("dev", "../..")
        .file("proc", b"not a dir")
        .dir_mode("run", 0o700)
        .file("run/keep", b"kept")
        .done();
    h.apply(&layer).unwrap();
    ensure_mount_points(
        std::os::fd::AsFd::as_fd(&h.root_fd),
        &["/home/gem/user-data", "/tmp", "/dev/pts", "/proc", "/run"],
        &["/etc/resolv.conf", "/etc/hosts"],
    )
    .unwrap();
    for d in [
        "home",
        "home/gem",
        "home/gem/user-data",
        "tmp",
        "dev",
        "dev/pts",
        "proc",
        "run",
    ] {
        let md = fs::symlink_metadata(h.r(d)).unwrap();
        assert!(md.is_dir(), "{d}");
        // What a launcher joining paths on the host would reach is inside.
        assert!(fs::canonicalize(h.r(d))
            .unwrap()
            .starts_with(fs::canonicalize(&h.root).unwrap()));
    }
    for f in ["etc/resolv.conf", "etc/hosts"] {
        let md = fs::symlink_metadata(h.r(f)).unwrap();
        assert!(md.is_file(), "{f}");
        assert_eq!(md.len(), 0);
    }
    // Real directories are kept as they are.
    assert_eq!(fs::read(h.r("run/keep")).unwrap(), b"kept");
    assert_eq!(
        fs::metadata(h.r("run")).unwrap().permissions().mode() & 0o7777,
        0o700
    );
    h.assert_host_untouched();
    assert!(sandbox_image::unpack::ensure_mount_points(
        std::os::fd::AsFd::as_fd(&h.root_fd),
        &["../x"],
        &[]
    )
    .is_err());
    h.assert_host_untouched();
}

#[test]
fn opaque_and_whiteout_keep_entries_under_implied_directories_of_the_layer() {
    // The layer lists `d/sub/new` but not `d/` or `d/sub/`: those are its
    // directories all the same, so the opaque marker keeps them.
    let mut h = Host::new();
    h.apply(
        &Tar::new()
            .file("d/sub/lower", b"l")
            .file("d/gone", b"g")
            .file("x/lower", b"l")
            .done(),
    )
    .unwrap();
    h.apply(
        &Tar::new()
            .file("d/sub/new", b"n")
            .file("d/.wh..wh..opq", b"")
            .file("x/new", b"n")
            .file(".wh.x", b"")
            .done(),
    )
    .unwrap();
    assert_eq!(tree(&h.root), ["d", "d/sub", "d/sub/new", "x", "x/new"]);
}

#[test]
fn repeated_whiteouts_do_not_rewalk_the_tree() {
    // 20,000 files this layer wrote under a lower directory, then 20,000
    // opaque markers and whiteouts of it: each marker re-walking the tree
    // would be 4·10⁸ steps; the pruned-directory memo makes it ~linear.
    let mut h = Host::new();
    let mut lower = Tar::new();
    for i in 0..20 {
        lower.file(format!("d/sub{i}/lower"), b"l");
    }
    h.apply(&lower.done()).unwrap();
    let mut t = Tar::new();
    for i in 0..20 {
        for j in 0..1000 {
            t.file(format!("d/sub{i}/f{j}"), b"");
        }
    }
    for i in 0..10_000 {
        t.file("d/.wh..wh..opq", b"");
        t.file(format!("d/.wh.sub{}", i % 20), b"");
    }
    let started = std::time::Instant::now();
    let stats = h.apply(&t.done()).unwrap();
    assert_eq!(stats.whiteouts, 20_000);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(!h.r("d/sub3/lower").exists());
    assert!(h.r("d/sub3/f999").exists());
    assert_eq!(tree(&h.root).len(), 1 + 20 + 20_000);
}

#[test]
fn implicit_parent_directories_count_as_entries() {
    use sandbox_image::unpack::UnpackLimits;
    let mut h = Host::with_limits(UnpackLimits {
        max_entries: 10,
        ..limits()
    });
    let stats = h.apply(&Tar::new().file("a/b/c/f", b"").done()).unwrap();
    assert_eq!((stats.entries, stats.implicit_dirs), (1, 3));
    assert_eq!(h.budget.entries_used, 4);
    // 1 entry + 9 directories: over.
    let r = h.apply(&Tar::new().file("x/1/2/3/4/5/6/7/8/f", b"").done());
    assert_limit(r, "implicit dirs");
}

#[test]
fn a_parent_walk_through_many_symlinks_is_linear_and_contained() {
    // A chain of dangling symlinks, each a long climb out: created where
    // they point inside the rootfs.
    let mut h = Host::new();
    let climb = "../".repeat(1000);
    let mut t = Tar::new();
    for i in 0..30 {
        t.pax(&[("linkpath", format!("{climb}l{}", i + 1).as_bytes())])
            .symlink(format!("l{i}"), "x");
    }
    t.file("l0/f", b"end of the chain");
    h.apply(&t.done()).unwrap();
    assert_eq!(fs::read(h.r("l30/f")).unwrap(), b"end of the chain");
    h.assert_host_untouched();
}
