//! The hostile layers of the issue ("`../` names, an absolute symlink
//! followed by a file written through it, a hard link to a host path, a
//! device node, a whiteout naming `../x`, a size bomb") and the rules of
//! `docs/images-unpack.md`: each is refused or contained, and the host
//! (everything in the test's tempdir outside the rootfs) is untouched.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use sandbox_image::unpack::{SpecialFiles, UnpackLimits};

// ---- names -------------------------------------------------------------

#[test]
fn dotdot_names_are_refused() {
    for name in [
        "../../escape",
        "../escape",
        "a/../../escape",
        "a/b/../../../escape",
        "./../escape",
        "/../escape",
        "a/..",
    ] {
        let mut h = Host::new();
        let layer = Tar::new().file(name, b"pwned").done();
        let msg = assert_hostile(h.apply(&layer), name);
        assert!(msg.contains(".."), "{name}: {msg}");
        h.assert_host_untouched();
        assert_eq!(
            fs::read(h.tmp.path().join("escape")).unwrap(),
            b"not escaped"
        );
    }
}

#[test]
fn dotdot_in_a_directory_or_symlink_name_is_refused() {
    let mut h = Host::new();
    assert_hostile(h.apply(&Tar::new().dir("../up").done()), "dir");
    assert_hostile(h.apply(&Tar::new().symlink("../up", "x").done()), "symlink");
    h.assert_host_untouched();
}

#[test]
fn absolute_names_land_inside_the_rootfs() {
    let mut h = Host::new();
    let layer = Tar::new()
        .file("/abs/path", b"inside")
        .file("//double//slash", b"also")
        .file("./dot/./file", b"dot")
        .done();
    h.apply(&layer).unwrap();
    assert_eq!(fs::read(h.r("abs/path")).unwrap(), b"inside");
    assert_eq!(fs::read(h.r("double/slash")).unwrap(), b"also");
    assert_eq!(fs::read(h.r("dot/file")).unwrap(), b"dot");
    assert!(!std::path::Path::new("/abs/path").exists());
    h.assert_host_untouched();
}

#[test]
fn nul_in_a_pax_path_is_refused() {
    let mut h = Host::new();
    let mut t = Tar::new();
    t.pax(&[("path", b"a\0b")]).file("placeholder", b"x");
    assert_hostile(h.apply(&t.done()), "NUL");
}

// ---- symlinks ------------------------------------------------------------

#[test]
fn absolute_symlink_to_slash_is_followed_inside_the_rootfs() {
    let mut h = Host::new();
    // If the write went through the host's `/`, this file would appear there.
    let unique = format!("sandbox-unpack-test-{}", std::process::id());
    let layer = Tar::new()
        .symlink("etc", "/")
        .file(format!("etc/{unique}"), b"contained")
        .done();
    h.apply(&layer).unwrap();
    assert_eq!(fs::read(h.r(&unique)).unwrap(), b"contained");
    assert!(!std::path::Path::new("/").join(&unique).exists());
    assert_eq!(fs::read_link(h.r("etc")).unwrap().to_str(), Some("/"));
    h.assert_host_untouched();
}

#[test]
fn absolute_symlink_to_a_host_dir_then_a_file_written_through_it() {
    let mut h = Host::new();
    let outside = h.outside.to_str().unwrap().to_owned();
    let layer = Tar::new()
        .symlink("etc", &outside)
        .file("etc/passwd", b"root::0:0::/:/bin/sh")
        .file("etc/sentinel", b"overwritten")
        .done();
    h.apply(&layer).unwrap();
    // Landed under <root>/<the host path>, not in the host dir.
    let inside = h.root.join(outside.trim_start_matches('/'));
    assert_eq!(
        fs::read(inside.join("passwd")).unwrap(),
        b"root::0:0::/:/bin/sh"
    );
    assert_eq!(fs::read(inside.join("sentinel")).unwrap(), b"overwritten");
    h.assert_host_untouched();
}

#[test]
fn relative_symlink_climbing_out_is_clamped_at_the_root() {
    let mut h = Host::new();
    let layer = Tar::new()
        .dir("a/b")
        .symlink("a/b/up", "../../../../..")
        .file("a/b/up/escape", b"contained")
        .symlink("up2", "..")
        .dir("up2/newdir")
        .file("up2/newdir/f", b"f")
        .done();
    h.apply(&layer).unwrap();
    assert_eq!(fs::read(h.r("escape")).unwrap(), b"contained");
    assert_eq!(fs::read(h.r("newdir/f")).unwrap(), b"f");
    h.assert_host_untouched();
}

#[test]
fn a_file_replacing_a_symlink_to_the_host_replaces_the_link_only() {
    let mut h = Host::new();
    let sentinel = h.outside.join("sentinel");
    let layer1 = Tar::new().symlink("x", sentinel.to_str().unwrap()).done();
    h.apply(&layer1).unwrap();
    let layer2 = Tar::new().file("x", b"new").done();
    h.apply(&layer2).unwrap();
    let md = fs::symlink_metadata(h.r("x")).unwrap();
    assert!(md.is_file());
    assert_eq!(fs::read(h.r("x")).unwrap(), b"new");
    h.assert_host_untouched();
}

#[test]
fn a_directory_over_a_symlink_to_the_host_replaces_the_link() {
    let mut h = Host::new();
    let layer1 = Tar::new().symlink("d", h.outside.to_str().unwrap()).done();
    h.apply(&layer1).unwrap();
    let layer2 = Tar::new().dir_mode("d", 0o700).file("d/f", b"f").done();
    h.apply(&layer2).unwrap();
    assert!(fs::symlink_metadata(h.r("d")).unwrap().is_dir());
    assert_eq!(fs::read(h.r("d/f")).unwrap(), b"f");
    h.assert_host_untouched();
}

// ---- hard links ------------------------------------------------------------

#[test]
fn hard_links_to_host_paths_are_refused() {
    let outside_sentinel = {
        let h = Host::new();
        h.outside.join("sentinel").to_str().unwrap().to_owned()
    };
    for target in [
        "/etc/passwd",
        "etc/passwd",
        "../outside/sentinel",
        "../../etc/passwd",
    ] {
        let mut h = Host::new();
        let layer = Tar::new().hardlink("stolen", target).done();
        assert_hostile(h.apply(&layer), target);
        assert!(!h.r("stolen").exists());
        h.assert_host_untouched();
    }
    // The host's own sentinel by absolute path: resolved inside the rootfs,
    // where it does not exist.
    let mut h = Host::new();
    let target = h.outside.join("sentinel");
    let layer = Tar::new()
        .hardlink("stolen", target.to_str().unwrap())
        .done();
    assert_hostile(h.apply(&layer), "absolute host path");
    h.assert_host_untouched();
    let _ = outside_sentinel;
}

#[test]
fn hard_link_through_a_symlink_to_the_host_is_resolved_inside() {
    let mut h = Host::new();
    let layer = Tar::new()
        .symlink("hostdir", h.outside.to_str().unwrap())
        .hardlink("stolen", "hostdir/sentinel")
        .done();
    assert_hostile(h.apply(&layer), "through symlink");
    let stolen = h.r("stolen");
    assert!(fs::symlink_metadata(&stolen).is_err());
    // The host sentinel still has one link.
    assert_eq!(fs::metadata(h.outside.join("sentinel")).unwrap().nlink(), 1);
    h.assert_host_untouched();
}

#[test]
fn hard_links_inside_the_rootfs_work() {
    let mut h = Host::new();
    let layer = Tar::new()
        .file("bin/busybox", b"\x7fELF")
        .hardlink("bin/sh", "bin/busybox")
        .hardlink("/bin/ls", "/bin/busybox")
        .symlink("usrbin", "/bin")
        .hardlink("cat", "usrbin/busybox")
        .done();
    h.apply(&layer).unwrap();
    let ino = fs::metadata(h.r("bin/busybox")).unwrap().ino();
    for p in ["bin/sh", "bin/ls", "cat"] {
        assert_eq!(fs::metadata(h.r(p)).unwrap().ino(), ino, "{p}");
    }
    assert_eq!(fs::metadata(h.r("bin/busybox")).unwrap().nlink(), 4);
    h.assert_host_untouched();
}

#[test]
fn hard_link_to_a_directory_is_refused() {
    let mut h = Host::new();
    let layer = Tar::new().dir("d").hardlink("l", "d").done();
    assert_hostile(h.apply(&layer), "dir hard link");
}

// ---- special files ---------------------------------------------------------

#[test]
fn device_nodes_and_fifos_are_skipped_by_default() {
    let mut h = Host::new();
    let layer = Tar::new()
        .node("dev/null", CHR)
        .node("dev/sda", BLK)
        .node("run/fifo", FIFO)
        .file("ok", b"ok")
        .done();
    let stats = h.apply(&layer).unwrap();
    assert_eq!(stats.skipped.len(), 3, "{:?}", stats.skipped);
    assert_eq!(stats.skipped_total, 3);
    assert!(stats.skipped[0].contains("character device"));
    for p in ["dev/null", "dev/sda", "run/fifo"] {
        assert!(fs::symlink_metadata(h.r(p)).is_err(), "{p} was created");
    }
    assert_eq!(fs::read(h.r("ok")).unwrap(), b"ok");
    h.assert_host_untouched();
}

#[test]
fn a_flood_of_special_files_is_counted_not_listed() {
    let mut h = Host::new();
    let mut t = Tar::new();
    for i in 0..1000 {
        t.node(format!("f{i}"), FIFO);
    }
    let stats = h.apply(&t.done()).unwrap();
    assert_eq!(stats.skipped.len(), 100);
    assert_eq!(stats.skipped_total, 1000);
    assert!(tree(&h.root).is_empty());
}

#[test]
fn device_nodes_are_refused_when_asked() {
    let mut h = Host::with_limits(UnpackLimits {
        special_files: SpecialFiles::Refuse,
        ..limits()
    });
    assert_hostile(h.apply(&Tar::new().node("dev/null", CHR).done()), "char");
    assert_hostile(h.apply(&Tar::new().node("fifo", FIFO).done()), "fifo");
    assert!(fs::symlink_metadata(h.r("dev/null")).is_err());
    h.assert_host_untouched();
}

#[test]
fn unknown_entry_types_are_refused() {
    let mut h = Host::new();
    assert_hostile(h.apply(&Tar::new().node("v", b'V').done()), "volume header");
    assert_hostile(h.apply(&Tar::new().node("s", b'S').done()), "GNU sparse");
}

// ---- whiteouts ---------------------------------------------------------------

#[test]
fn whiteouts_naming_outside_entries_are_refused() {
    for name in [
        "../.wh.x",
        ".wh...",
        ".wh..",
        ".wh.",
        "a/../../.wh.x",
        ".wh.../x",
        "a/.wh..wh..opq/../x",
    ] {
        let mut h = Host::new();
        h.apply(&Tar::new().file("x", b"inside").done()).unwrap();
        let layer = Tar::new().file(name, b"").done();
        assert_hostile(h.apply(&layer), name);
        assert_eq!(
            fs::read(h.tmp.path().join("x")).unwrap(),
            b"x next to the rootfs"
        );
        assert_eq!(fs::read(h.r("x")).unwrap(), b"inside");
        h.assert_host_untouched();
    }
}

#[test]
fn whiteout_through_a_symlink_stays_inside() {
    let mut h = Host::new();
    let layer1 = Tar::new()
        .symlink("hostdir", h.outside.to_str().unwrap())
        .symlink("up", "../..")
        .done();
    h.apply(&layer1).unwrap();
    // The parent resolves inside the rootfs, where nothing is named so.
    let layer2 = Tar::new()
        .file("hostdir/.wh.sentinel", b"")
        .file("up/.wh.x", b"")
        .file("hostdir/.wh..wh..opq", b"")
        .done();
    h.apply(&layer2).unwrap();
    h.assert_host_untouched();
}

#[test]
fn whiteout_applies_to_the_lower_layer() {
    let mut h = Host::new();
    h.apply(
        &Tar::new()
            .file("a/f", b"1")
            .file("a/g", b"2")
            .dir("d/sub")
            .file("d/sub/x", b"x")
            .done(),
    )
    .unwrap();
    let stats = h
        .apply(
            &Tar::new()
                .file("a/.wh.f", b"")
                .file(".wh.d", b"")
                .file(".wh.missing", b"")
                .done(),
        )
        .unwrap();
    assert_eq!(stats.whiteouts, 3);
    assert_eq!(tree(&h.root), ["a", "a/g"]);
    h.assert_host_untouched();
}

#[test]
fn whiteout_of_a_directory_with_symlinks_to_the_host_does_not_follow_them() {
    let mut h = Host::new();
    let layer1 = Tar::new()
        .dir("d")
        .symlink("d/abs", h.outside.to_str().unwrap())
        .symlink("d/rel", "../../outside")
        .symlink("d/file", h.outside.join("sentinel").to_str().unwrap())
        .dir("d/deeper")
        .symlink("d/deeper/dir", h.outside.join("dir").to_str().unwrap())
        .done();
    h.apply(&layer1).unwrap();
    h.apply(&Tar::new().file(".wh.d", b"").done()).unwrap();
    assert!(tree(&h.root).is_empty());
    h.assert_host_untouched();
    assert_eq!(fs::read(h.outside.join("dir/keep")).unwrap(), b"keep me");
}

#[test]
fn opaque_whiteout_clears_lower_entries_and_keeps_this_layers_in_any_order() {
    let mut h = Host::new();
    let layer1 = Tar::new()
        .file("d/x", b"x")
        .file("d/y", b"y")
        .file("d/sub/lower", b"lower")
        .symlink("d/link", h.outside.to_str().unwrap())
        .file("other", b"other")
        .done();
    h.apply(&layer1).unwrap();
    let layer2 = Tar::new()
        .dir("d")
        .file("d/before", b"before the marker")
        .dir("d/sub")
        .file("d/sub/new", b"new")
        .file("d/.wh..wh..opq", b"")
        .file("d/after", b"after the marker")
        .done();
    h.apply(&layer2).unwrap();
    assert_eq!(
        tree(&h.root),
        ["d", "d/after", "d/before", "d/sub", "d/sub/new", "other"]
    );
    h.assert_host_untouched();
}

#[test]
fn opaque_whiteout_at_the_root() {
    let mut h = Host::new();
    h.apply(&Tar::new().file("a", b"a").dir("b/c").done())
        .unwrap();
    h.apply(
        &Tar::new()
            .file("keep", b"k")
            .file(".wh..wh..opq", b"")
            .done(),
    )
    .unwrap();
    assert_eq!(tree(&h.root), ["keep"]);
}

#[test]
fn a_whiteout_never_removes_an_entry_of_its_own_layer() {
    let mut h = Host::new();
    h.apply(
        &Tar::new()
            .file("d/lower", b"l")
            .file("f", b"lower f")
            .done(),
    )
    .unwrap();
    let layer2 = Tar::new()
        .dir("d")
        .file("d/mine", b"m")
        .file(".wh.d", b"")
        .file("f", b"upper f")
        .file(".wh.f", b"")
        .done();
    h.apply(&layer2).unwrap();
    assert_eq!(tree(&h.root), ["d", "d/mine", "f"]);
    assert_eq!(fs::read(h.r("f")).unwrap(), b"upper f");
}

#[test]
fn layered_file_then_whiteout_then_recreate() {
    let mut h = Host::new();
    h.apply(&Tar::new().file("etc/motd", b"v1").done()).unwrap();
    h.apply(&Tar::new().file("etc/.wh.motd", b"").done())
        .unwrap();
    assert!(!h.r("etc/motd").exists());
    h.apply(&Tar::new().file("etc/motd", b"v3").done()).unwrap();
    assert_eq!(fs::read(h.r("etc/motd")).unwrap(), b"v3");
}

// ---- limits ------------------------------------------------------------------

#[test]
fn a_declared_size_bomb_stops_before_writing() {
    let mut h = Host::with_limits(UnpackLimits {
        max_total_bytes: 1 << 20,
        ..limits()
    });
    // 1 TiB declared, no data follows.
    let mut hdr = Hdr::new("bomb", REG);
    hdr.size = 1 << 40;
    let mut layer = Vec::from(hdr.bytes());
    layer.extend_from_slice(&[0u8; 4096]);
    assert_limit(h.apply(&layer), "declared bomb");
    assert!(!h.r("bomb").exists());
    h.assert_host_untouched();
}

#[test]
fn a_compressed_bomb_stops_at_the_limit() {
    use std::io::{Read, Write};
    const LIMIT: u64 = 8 << 20;
    // 16 files of 4 MiB of zeros: 64 MiB unpacked from ~64 KiB gzip.
    let mut t = Tar::new();
    let zeros = vec![0u8; 4 << 20];
    for i in 0..16 {
        t.file(format!("z{i:02}"), &zeros);
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&t.done()).unwrap();
    let gz = gz.finish().unwrap();
    assert!(gz.len() < 1 << 20);

    let mut h = Host::with_limits(UnpackLimits {
        max_total_bytes: LIMIT,
        ..limits()
    });
    let mut dec = flate2::read::GzDecoder::new(&gz[..]);
    let r = sandbox_image::unpack::apply_layer(
        std::os::fd::AsFd::as_fd(&h.root_fd),
        &mut dec,
        &mut h.budget,
    );
    assert_limit(r, "gzip bomb");
    // Stopped: at most LIMIT bytes of content exist, and the decoder was
    // not read to its end.
    let written: u64 = tree(&h.root)
        .iter()
        .map(|p| fs::metadata(h.r(p)).unwrap().len())
        .sum();
    assert!(written <= LIMIT, "{written} bytes written");
    assert_eq!(written, LIMIT);
    let mut rest = Vec::new();
    dec.read_to_end(&mut rest).unwrap();
    assert!(
        rest.len() as u64 > 32 << 20,
        "the stream was consumed past the limit"
    );
    h.assert_host_untouched();
}

#[test]
fn the_byte_budget_is_shared_across_layers() {
    let mut h = Host::with_limits(UnpackLimits {
        max_total_bytes: 3000,
        ..limits()
    });
    h.apply(&Tar::new().file("a", &[1u8; 2000]).done()).unwrap();
    assert_eq!(h.budget.bytes_used, 2000);
    assert_limit(
        h.apply(&Tar::new().file("b", &[2u8; 1001]).done()),
        "second layer",
    );
    assert!(!h.r("b").exists());
    h.apply(&Tar::new().file("c", &[3u8; 1000]).done()).unwrap();
    assert_eq!(h.budget.remaining_bytes(), 0);
}

#[test]
fn the_entry_count_is_limited_across_layers() {
    let mut h = Host::with_limits(UnpackLimits {
        max_entries: 5,
        ..limits()
    });
    let mut t = Tar::new();
    for i in 0..3 {
        t.file(format!("f{i}"), b"");
    }
    h.apply(&t.done()).unwrap();
    assert_limit(h.apply(&t.done()), "entries");
}

#[test]
fn long_paths_are_limited() {
    let mut h = Host::with_limits(UnpackLimits {
        max_path_len: 200,
        ..limits()
    });
    let long = "d/".repeat(100) + "f"; // 201 bytes
    let msg = assert_limit(
        h.apply(&Tar::new().long_name(long.as_bytes()).file("x", b"").done()),
        "GNU",
    );
    assert!(msg.contains("200"), "{msg}");
    assert_limit(
        h.apply(
            &Tar::new()
                .pax(&[("path", long.as_bytes())])
                .file("x", b"")
                .done(),
        ),
        "PAX path",
    );
    assert_limit(
        h.apply(
            &Tar::new()
                .pax(&[("linkpath", long.as_bytes())])
                .symlink("l", "x")
                .done(),
        ),
        "PAX linkpath",
    );
    // A long name far over the limit is refused before it is read.
    let mut hdr = Hdr::new("././@LongLink", b'L');
    hdr.size = 1 << 40;
    assert_limit(h.apply(&hdr.bytes()), "huge long name");
    let mut hdr = Hdr::new("PaxHeader", b'x');
    hdr.size = 1 << 40;
    assert_limit(h.apply(&hdr.bytes()), "huge pax header");
    // Under the limit: fine.
    let ok = "d/".repeat(99) + "f";
    h.apply(&Tar::new().long_name(ok.as_bytes()).file("x", b"ok").done())
        .unwrap();
    assert_eq!(fs::read(h.r(&ok)).unwrap(), b"ok");
}

// ---- metadata ------------------------------------------------------------------

#[test]
fn setuid_and_setgid_bits_are_dropped() {
    let mut h = Host::new();
    let layer = Tar::new()
        .file_mode("usr/bin/su", b"su", 0o4755)
        .file_mode("usr/bin/wall", b"wall", 0o2755)
        .dir_mode("shared", 0o2775)
        .dir_mode("tmp", 0o1777)
        .file_mode("stickyfile", b"", 0o1644)
        .done();
    let stats = h.apply(&layer).unwrap();
    let mode = |p: &str| fs::symlink_metadata(h.r(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("usr/bin/su"), 0o755);
    assert_eq!(mode("usr/bin/wall"), 0o755);
    assert_eq!(mode("shared"), 0o775);
    assert_eq!(mode("tmp"), 0o1777);
    assert_eq!(mode("stickyfile"), 0o644);
    assert_eq!(stats.setid_stripped, 3);
}

#[test]
fn xattrs_are_not_applied() {
    let mut h = Host::new();
    let cap = b"\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";
    let layer = Tar::new()
        .pax(&[
            ("SCHILY.xattr.security.capability", cap),
            ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
            ("SCHILY.xattr.user.note", b"hi"),
        ])
        .file("usr/bin/ping", b"ping")
        .done();
    let stats = h.apply(&layer).unwrap();
    assert_eq!(stats.xattrs_dropped, 3);
    let mut buf = [0u8; 64];
    for name in ["security.capability", "trusted.overlay.opaque", "user.note"] {
        let r = rustix::fs::lgetxattr(h.r("usr/bin/ping"), name, &mut buf);
        assert!(r.is_err(), "{name} was applied");
    }
}

#[test]
fn owners_modes_and_times_are_applied() {
    let mut h = Host::new();
    let mut f = Hdr::new("home/u/file", REG);
    f.uid = 1000;
    f.gid = 1001;
    f.mode = 0o640;
    f.size = 5;
    f.mtime = 1_234_567_890;
    let mut d = Hdr::new("home/u", DIR);
    d.uid = 1000;
    d.gid = 1000;
    d.mode = 0o700;
    d.mtime = 1_111_111_111;
    let mut l = Hdr::new("home/u/link", SYM);
    l.link = b"file".to_vec();
    l.uid = 1000;
    l.gid = 1000;
    let layer = Tar::new()
        .raw(&d, b"")
        .raw(&f, b"hello")
        .raw(&l, b"")
        .done();
    h.apply(&layer).unwrap();
    let md = fs::metadata(h.r("home/u/file")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o640);
    assert_eq!(md.mtime(), 1_234_567_890);
    let dmd = fs::metadata(h.r("home/u")).unwrap();
    assert_eq!(dmd.permissions().mode() & 0o7777, 0o700);
    assert_eq!(
        dmd.mtime(),
        1_111_111_111,
        "directory mtime set after its children"
    );
    // Implicit parents: 0755.
    assert_eq!(
        fs::metadata(h.r("home")).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    if is_root() {
        assert_eq!((md.uid(), md.gid()), (1000, 1001));
        assert_eq!((dmd.uid(), dmd.gid()), (1000, 1000));
        let lmd = fs::symlink_metadata(h.r("home/u/link")).unwrap();
        assert_eq!((lmd.uid(), lmd.gid()), (1000, 1000));
    }
}

// ---- replacement semantics ---------------------------------------------------------

#[test]
fn later_entries_replace_earlier_ones() {
    let mut h = Host::new();
    h.apply(
        &Tar::new()
            .file("f2d", b"file")
            .dir("d2f/sub")
            .file("d2f/sub/x", b"x")
            .file("f2l", b"file")
            .dir_mode("dd", 0o700)
            .file("dd/kept", b"kept")
            .done(),
    )
    .unwrap();
    h.apply(
        &Tar::new()
            .dir("f2d")
            .file("d2f", b"now a file")
            .symlink("f2l", "target")
            .dir_mode("dd", 0o755)
            .done(),
    )
    .unwrap();
    assert!(fs::symlink_metadata(h.r("f2d")).unwrap().is_dir());
    assert_eq!(fs::read(h.r("d2f")).unwrap(), b"now a file");
    assert_eq!(fs::read_link(h.r("f2l")).unwrap().to_str(), Some("target"));
    assert_eq!(fs::read(h.r("dd/kept")).unwrap(), b"kept");
    assert_eq!(
        fs::metadata(h.r("dd")).unwrap().permissions().mode() & 0o7777,
        0o755
    );
}

// ---- stream ----------------------------------------------------------------------

#[test]
fn malformed_streams_are_refused() {
    let mut h = Host::new();
    let mut bad = Tar::new().file("f", b"data").done();
    bad[0] ^= 1; // checksum no longer matches
    assert_hostile(h.apply(&bad), "checksum");
    let good = Tar::new().file("g", &[7u8; 1000]).done();
    let r = h.apply(&good[..800]);
    assert!(
        matches!(r, Err(sandbox_image::unpack::UnpackError::Read(_))),
        "{r:?}"
    );
    // Extension header without an entry.
    let mut t = Tar::new();
    t.pax(&[("path", b"x")]);
    assert_hostile(h.apply(&t.done()), "dangling pax");
}

#[test]
fn the_stream_is_read_to_its_end() {
    let mut h = Host::new();
    let mut layer = Tar::new().file("f", b"x").done();
    layer.extend_from_slice(&[0u8; 8192]);
    let mut cursor = std::io::Cursor::new(layer.clone());
    sandbox_image::unpack::apply_layer(
        std::os::fd::AsFd::as_fd(&h.root_fd),
        &mut cursor,
        &mut h.budget,
    )
    .unwrap();
    assert_eq!(cursor.position() as usize, layer.len());
    // Megabytes of junk after the end marker: refused.
    let mut junk = Tar::new().file("f", b"x").done();
    junk.extend_from_slice(&vec![1u8; 2 << 20]);
    assert_limit(h.apply(&junk), "trailing junk");
}

#[test]
fn archives_from_the_tar_crate_builder_unpack() {
    let mut b = tar::Builder::new(Vec::new());
    let long = format!("{}/file.txt", "long-directory-name".repeat(8));
    let mut hdr = tar::Header::new_gnu();
    hdr.set_size(3);
    hdr.set_mode(0o644);
    hdr.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut hdr, &long, &b"abc"[..]).unwrap();
    let mut hdr = tar::Header::new_gnu();
    hdr.set_entry_type(tar::EntryType::Symlink);
    hdr.set_size(0);
    b.append_link(&mut hdr, "lnk", format!("/{}", "t".repeat(150)))
        .unwrap();
    let data = b.into_inner().unwrap();
    let mut h = Host::new();
    h.apply(&data).unwrap();
    assert_eq!(fs::read(h.r(&long)).unwrap(), b"abc");
    assert_eq!(
        fs::read_link(h.r("lnk")).unwrap().to_str().unwrap().len(),
        151
    );
}
