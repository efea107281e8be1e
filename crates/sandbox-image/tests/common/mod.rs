//! Hand-built tar streams (raw ustar headers, so hostile names the `tar`
//! crate's Builder refuses can be written) and a host-snapshot helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sandbox_image::unpack::{apply_layer, LayerStats, UnpackBudget, UnpackError, UnpackLimits};

pub const REG: u8 = b'0';
pub const LNK: u8 = b'1';
pub const SYM: u8 = b'2';
pub const CHR: u8 = b'3';
pub const BLK: u8 = b'4';
pub const DIR: u8 = b'5';
pub const FIFO: u8 = b'6';

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0width$o}\0", v, width = field.len() - 1);
    assert_eq!(s.len(), field.len(), "value {v} does not fit the field");
    field.copy_from_slice(s.as_bytes());
}

#[derive(Clone)]
pub struct Hdr {
    pub name: Vec<u8>,
    pub typeflag: u8,
    pub size: u64,
    pub link: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u64,
}

impl Hdr {
    pub fn new(name: impl AsRef<[u8]>, typeflag: u8) -> Self {
        Hdr {
            name: name.as_ref().to_vec(),
            typeflag,
            size: 0,
            link: Vec::new(),
            mode: if typeflag == DIR { 0o755 } else { 0o644 },
            uid: 0,
            gid: 0,
            mtime: 1_600_000_000,
        }
    }

    pub fn bytes(&self) -> [u8; 512] {
        let mut h = [0u8; 512];
        assert!(self.name.len() <= 100, "use a long-name header");
        assert!(self.link.len() <= 100, "use a long-link header");
        h[..self.name.len()].copy_from_slice(&self.name);
        octal(&mut h[100..108], u64::from(self.mode));
        octal(&mut h[108..116], u64::from(self.uid));
        octal(&mut h[116..124], u64::from(self.gid));
        if self.size < 0o77777777777 {
            octal(&mut h[124..136], self.size);
        } else {
            // GNU base-256 for sizes over 8 GiB.
            h[124] = 0x80;
            h[128..136].copy_from_slice(&self.size.to_be_bytes());
        }
        octal(&mut h[136..148], self.mtime);
        h[156] = self.typeflag;
        h[157..157 + self.link.len()].copy_from_slice(&self.link);
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        let c = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(c.as_bytes());
        h
    }
}

#[derive(Default, Clone)]
pub struct Tar(pub Vec<u8>);

impl Tar {
    pub fn new() -> Self {
        Tar(Vec::new())
    }

    /// A header and `data`, padded.
    pub fn raw(&mut self, h: &Hdr, data: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&h.bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend_from_slice(&vec![0u8; pad]);
        self
    }

    pub fn file(&mut self, name: impl AsRef<[u8]>, data: &[u8]) -> &mut Self {
        self.file_mode(name, data, 0o644)
    }

    pub fn file_mode(&mut self, name: impl AsRef<[u8]>, data: &[u8], mode: u32) -> &mut Self {
        let mut h = Hdr::new(name, REG);
        h.size = data.len() as u64;
        h.mode = mode;
        self.raw(&h, data)
    }

    pub fn dir(&mut self, name: impl AsRef<[u8]>) -> &mut Self {
        self.raw(&Hdr::new(name, DIR), b"")
    }

    pub fn dir_mode(&mut self, name: impl AsRef<[u8]>, mode: u32) -> &mut Self {
        let mut h = Hdr::new(name, DIR);
        h.mode = mode;
        self.raw(&h, b"")
    }

    pub fn symlink(&mut self, name: impl AsRef<[u8]>, target: impl AsRef<[u8]>) -> &mut Self {
        let mut h = Hdr::new(name, SYM);
        h.link = target.as_ref().to_vec();
        h.mode = 0o777;
        self.raw(&h, b"")
    }

    pub fn hardlink(&mut self, name: impl AsRef<[u8]>, target: impl AsRef<[u8]>) -> &mut Self {
        let mut h = Hdr::new(name, LNK);
        h.link = target.as_ref().to_vec();
        self.raw(&h, b"")
    }

    pub fn node(&mut self, name: impl AsRef<[u8]>, typeflag: u8) -> &mut Self {
        self.raw(&Hdr::new(name, typeflag), b"")
    }

    /// A PAX extended header for the next entry.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (k, v) in records {
            let body = k.len() + v.len() + 3; // ' ' '=' '\n'
            let mut len = body + 1;
            while len != body + len.to_string().len() {
                len = body + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} {k}=").as_bytes());
            data.extend_from_slice(v);
            data.push(b'\n');
        }
        let mut h = Hdr::new("PaxHeader", b'x');
        h.size = data.len() as u64;
        self.raw(&h, &data)
    }

    /// A GNU long-name header for the next entry.
    pub fn long_name(&mut self, name: &[u8]) -> &mut Self {
        let mut data = name.to_vec();
        data.push(0);
        let mut h = Hdr::new("././@LongLink", b'L');
        h.size = data.len() as u64;
        self.raw(&h, &data)
    }

    /// With the end-of-archive marker.
    pub fn done(&self) -> Vec<u8> {
        let mut v = self.0.clone();
        v.extend_from_slice(&[0u8; 1024]);
        v
    }
}

/// A tempdir laid out as a "host": `root/` is the rootfs being built,
/// `outside/` holds sentinels a hostile layer must not touch.
pub struct Host {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
    pub root_fd: OwnedFd,
    pub budget: UnpackBudget,
    before: BTreeMap<PathBuf, String>,
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub fn limits() -> UnpackLimits {
    UnpackLimits {
        preserve_owners: is_root(),
        ..UnpackLimits::default()
    }
}

impl Host {
    pub fn new() -> Self {
        Self::with_limits(limits())
    }

    pub fn with_limits(limits: UnpackLimits) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs::create_dir(&root).unwrap();
        fs::create_dir_all(outside.join("dir")).unwrap();
        fs::write(outside.join("sentinel"), b"host data").unwrap();
        fs::write(outside.join("dir/keep"), b"keep me").unwrap();
        fs::write(outside.join("x"), b"x on the host").unwrap();
        fs::write(tmp.path().join("x"), b"x next to the rootfs").unwrap();
        fs::write(tmp.path().join("escape"), b"not escaped").unwrap();
        let root_fd = rustix::fs::open(
            &root,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let mut h = Host {
            before: BTreeMap::new(),
            tmp,
            root,
            outside,
            root_fd,
            budget: UnpackBudget::new(limits),
        };
        h.before = h.snapshot();
        h
    }

    pub fn apply(&mut self, layer: &[u8]) -> Result<LayerStats, UnpackError> {
        apply_layer(self.root_fd.as_fd(), layer, &mut self.budget)
    }

    pub fn r(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }

    /// Everything in the tempdir outside `root/`, not following symlinks.
    fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        walk(self.tmp.path(), &self.root, &mut out);
        out
    }

    /// The host outside the rootfs is exactly as it was.
    pub fn assert_host_untouched(&self) {
        assert_eq!(
            self.before,
            self.snapshot(),
            "host outside the rootfs changed"
        );
    }
}

fn walk(dir: &Path, skip: &Path, out: &mut BTreeMap<PathBuf, String>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p == skip {
            continue;
        }
        let md = fs::symlink_metadata(&p).unwrap();
        let desc = if md.is_dir() {
            format!(
                "dir {:o} {}:{} {}",
                md.permissions().mode(),
                md.uid(),
                md.gid(),
                md.nlink()
            )
        } else if md.is_symlink() {
            format!("link {:?}", fs::read_link(&p).unwrap())
        } else {
            format!(
                "file {:o} {}:{} nlink={} {:?}",
                md.permissions().mode(),
                md.uid(),
                md.gid(),
                md.nlink(),
                fs::read(&p).unwrap()
            )
        };
        out.insert(p.clone(), desc);
        if md.is_dir() {
            walk(&p, skip, out);
        }
    }
}

/// Every path under `dir` (relative), not following symlinks.
pub fn tree(dir: &Path) -> Vec<String> {
    fn go(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                go(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out.sort();
    out
}

pub fn assert_hostile(r: Result<LayerStats, UnpackError>, what: &str) -> String {
    match r {
        Err(e @ UnpackError::Hostile { .. }) => e.to_string(),
        other => panic!("{what}: expected a Hostile refusal, got {other:?}"),
    }
}

pub fn assert_limit(r: Result<LayerStats, UnpackError>, what: &str) -> String {
    match r {
        Err(e @ UnpackError::Limit(_)) => e.to_string(),
        other => panic!("{what}: expected a Limit refusal, got {other:?}"),
    }
}
