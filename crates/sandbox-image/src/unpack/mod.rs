//! Safe layer unpacking.
//!
//! A layer is a tar stream from the network: hostile until proven otherwise.
//! [`apply_layer`] applies one onto a rootfs directory held by fd. The rules
//! (each with the test proving it) are in `docs/images-unpack.md`; in short:
//!
//! * Names are normalized: leading `/` and `.` components dropped (an
//!   absolute name lands inside the rootfs); a `..` component anywhere, a NUL
//!   byte, or a `.wh.`-prefixed directory component refuses the layer.
//! * Every path is resolved inside the rootfs: by the kernel
//!   (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`),
//!   or, where parents are missing, one name at a time from the rootfs fd
//!   with the same rules; so a symlink in a parent (`etc -> /`,
//!   `up -> ../../..`) is followed *inside* the rootfs. The final component
//!   is created with `O_EXCL` / `mkdirat` / `symlinkat` / `linkat` and never
//!   followed.
//! * Symlink targets are stored verbatim; [`ensure_mount_points`] makes the
//!   runtime's mount destinations real directories/files afterwards.
//! * An existing entry is replaced (a directory keeps an existing directory
//!   and takes the new mode/owner); a directory being replaced is removed
//!   through fds without following symlinks.
//! * Whiteouts (`.wh.<name>`, `.wh..wh..opq`) remove what lower layers left;
//!   entries of the same layer are never whited out, in whatever order the
//!   tar lists them (OCI image-spec, "Whiteouts").
//! * Device nodes and FIFOs are skipped with a warning (or refused, see
//!   [`SpecialFiles`]); hard links only to regular files or symlinks already
//!   in the rootfs; setuid/setgid bits dropped; xattrs (PAX
//!   `SCHILY.xattr.*`) never applied.
//! * Limits are checked before anything is written: entry count (implicit
//!   parent directories included), path length, total content bytes (shared
//!   by all layers of an image), metadata header sizes.
//!
//! On error the rootfs is partially written and must be discarded by the
//! caller (`std::fs::remove_dir_all` does not follow symlinks).

mod fsops;
mod tar_stream;

use std::collections::{HashSet, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{
    chownat, fchmod, fchown, fstat, futimens, linkat, mkdirat, openat, readlinkat, symlinkat,
    unlinkat, utimensat, AtFlags, FileType, Gid, Mode, OFlags, Stat, Timespec, Timestamps, Uid,
};
use rustix::io::Errno;
use tar::EntryType;

use fsops::{
    dev_ino, is_dir, key, lstat_at, open_in_root, open_subdir, prune, remove_entry, EntryKey, Keep,
};
use tar_stream::{next_member, padding, EntryMeta, Member, Stream};

/// What to do with device nodes and FIFOs in a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecialFiles {
    /// Skip them with a `warn!` line and a [`LayerStats::skipped`] record
    /// (default: base images ship `/dev` nodes; the sandbox gets `/dev` from
    /// the runtime, never from the image).
    #[default]
    Skip,
    /// Refuse the layer.
    Refuse,
}

/// Limits over a whole image (all its layers); one budget is shared by the
/// layers of one unpack, so a bomb split across layers still stops.
#[derive(Debug, Clone)]
pub struct UnpackLimits {
    /// Total uncompressed bytes of entry content (default 20 GiB).
    pub max_total_bytes: u64,
    /// Total tar entries over all layers (default 1,000,000).
    pub max_entries: u64,
    /// Longest entry path (and link target) accepted, in bytes (default 4096).
    pub max_path_len: usize,
    /// Device nodes and FIFOs: skip (default) or refuse.
    pub special_files: SpecialFiles,
    /// Give entries the layer's numeric uid/gid (default true; needs
    /// CAP_CHOWN — the daemon runs as root). When false, entries belong to
    /// the unpacking process.
    pub preserve_owners: bool,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_total_bytes: 20 << 30,
            max_entries: 1_000_000,
            max_path_len: 4096,
            special_files: SpecialFiles::Skip,
            preserve_owners: true,
        }
    }
}

/// What is left of the limits while an image's layers are applied in order.
#[derive(Debug)]
pub struct UnpackBudget {
    pub limits: UnpackLimits,
    pub bytes_used: u64,
    pub entries_used: u64,
}

impl UnpackBudget {
    pub fn new(limits: UnpackLimits) -> Self {
        UnpackBudget {
            limits,
            bytes_used: 0,
            entries_used: 0,
        }
    }

    /// Content bytes still allowed.
    pub fn remaining_bytes(&self) -> u64 {
        self.limits.max_total_bytes.saturating_sub(self.bytes_used)
    }
}

impl Default for UnpackBudget {
    fn default() -> Self {
        Self::new(UnpackLimits::default())
    }
}

/// What one layer did.
#[derive(Debug, Default, Clone)]
pub struct LayerStats {
    /// Tar entries (metadata headers not counted).
    pub entries: u64,
    /// Content bytes (regular files, and the content of anything skipped).
    pub bytes: u64,
    /// Entries refused-and-skipped (device nodes, FIFOs, ...), with why: the
    /// first 100 of the layer.
    pub skipped: Vec<String>,
    /// All entries skipped.
    pub skipped_total: u64,
    /// Whiteouts applied (`.wh.<name>` and opaque markers).
    pub whiteouts: u64,
    /// Entries whose setuid/setgid bits were dropped.
    pub setid_stripped: u64,
    /// Extended attributes found in PAX records and not applied.
    pub xattrs_dropped: u64,
    /// Parent directories created because the layer did not list them
    /// (each counts as an entry of the budget).
    pub implicit_dirs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?}: {reason}")]
    Hostile { path: String, reason: String },
    #[error("image exceeds the unpack limit: {0}")]
    Limit(String),
    #[error("reading the layer: {0}")]
    Read(#[source] std::io::Error),
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const COPY_BUF: usize = 256 * 1024;
const MAX_SKIPPED_RECORDS: usize = 100;

/// Applies one uncompressed layer tar stream onto the rootfs directory `root`
/// (an `O_DIRECTORY` fd), whiteouts against what earlier layers left there.
///
/// Reads the stream to its end (at most 1 MiB past the end-of-archive
/// marker), so a caller hashing it for the diff_id has seen every byte when
/// this returns `Ok`.
pub fn apply_layer<R: Read>(
    root: BorrowedFd<'_>,
    layer: R,
    budget: &mut UnpackBudget,
) -> Result<LayerStats, UnpackError> {
    let rst = fstat(root).map_err(|e| io_err("stat rootfs", "", e.into()))?;
    if !is_dir(&rst) {
        return Err(io_err("rootfs", "", Errno::NOTDIR.into()));
    }
    let mut u = Unpacker {
        root,
        root_id: dev_ino(&rst),
        budget,
        stats: LayerStats::default(),
        created: HashSet::new(),
        dir_times: Vec::new(),
        clean: HashSet::new(),
        buf: vec![0u8; COPY_BUF],
    };
    let mut stream = Stream::new(layer);
    loop {
        let meta = match next_member(&mut stream, u.budget.limits.max_path_len)? {
            Member::End => break,
            Member::Global => {
                count_entry(u.budget)?;
                continue;
            }
            Member::Entry(meta) => meta,
        };
        count_entry(u.budget)?;
        u.stats.entries += 1;
        let shown = String::from_utf8_lossy(&meta.path).into_owned();
        if meta.path.len() > u.budget.limits.max_path_len {
            return Err(UnpackError::Limit(format!(
                "entry path of {} bytes (limit {}): {:.100}...",
                meta.path.len(),
                u.budget.limits.max_path_len,
                shown
            )));
        }
        if meta
            .link
            .as_ref()
            .is_some_and(|l| l.len() > u.budget.limits.max_path_len)
        {
            return Err(UnpackError::Limit(format!(
                "link target of {shown:?} longer than {} bytes",
                u.budget.limits.max_path_len
            )));
        }
        // Every content byte is charged before any is read or written: a
        // declared size over the budget stops here with nothing written.
        if meta.size > u.budget.remaining_bytes() {
            return Err(UnpackError::Limit(format!(
                "{shown:?} declares {} bytes; {} of {} left",
                meta.size,
                u.budget.remaining_bytes(),
                u.budget.limits.max_total_bytes
            )));
        }
        u.budget.bytes_used += meta.size;
        u.stats.bytes += meta.size;
        u.stats.xattrs_dropped += meta.xattrs;
        if meta.xattrs > 0 {
            tracing::debug!(path = ?shown, n = meta.xattrs, "layer: xattrs not applied");
        }

        let size = meta.size;
        let mut content = (&mut stream).take(size);
        u.apply(&meta, &shown, &mut content)?;
        let rest = content.limit() + padding(size);
        let mut scratch = [0u8; 8192];
        stream.skip(rest, &mut scratch).map_err(UnpackError::Read)?;
    }
    let mut scratch = [0u8; 8192];
    stream.drain_trailer(&mut scratch)?;
    u.finish_dir_times();
    Ok(u.stats)
}

fn count_entry(budget: &mut UnpackBudget) -> Result<(), UnpackError> {
    budget.entries_used += 1;
    if budget.entries_used > budget.limits.max_entries {
        return Err(UnpackError::Limit(format!(
            "more than {} entries",
            budget.limits.max_entries
        )));
    }
    Ok(())
}

fn io_err(op: &'static str, path: &str, source: io::Error) -> UnpackError {
    UnpackError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn hostile(path: &str, reason: impl Into<String>) -> UnpackError {
    UnpackError::Hostile {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Splits a tar name into components inside the rootfs: empty and `.`
/// components dropped (so `/a`, `./a`, `a/` and `a//.` are all `a`); `..`,
/// NUL bytes, and `.wh.`-prefixed directory components refused.
fn normalize<'a>(raw: &'a [u8], shown: &str) -> Result<Vec<&'a [u8]>, UnpackError> {
    if raw.contains(&0) {
        return Err(hostile(shown, "NUL byte in name"));
    }
    let comps: Vec<&[u8]> = raw
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if comps.iter().any(|c| *c == b"..") {
        return Err(hostile(
            shown,
            "`..` component (names must stay inside the rootfs)",
        ));
    }
    if let Some((_, dirs)) = comps.split_last() {
        if dirs.iter().any(|c| c.starts_with(WHITEOUT_PREFIX)) {
            return Err(hostile(shown, "whiteout prefix on a directory component"));
        }
    }
    Ok(comps)
}

fn cstring(b: &[u8]) -> CString {
    CString::new(b).expect("NUL bytes are refused by normalize")
}

struct Unpacker<'r, 'b> {
    root: BorrowedFd<'r>,
    root_id: (u64, u64),
    budget: &'b mut UnpackBudget,
    stats: LayerStats,
    /// Entries this layer created (directory dev/inode + name): whiteouts
    /// and opaque markers only remove what lower layers left.
    created: HashSet<EntryKey>,
    /// Directory mtimes, set at the end of the layer (creating children
    /// would change them).
    dir_times: Vec<(Vec<u8>, i64)>,
    /// Directories already pruned by a whiteout in this layer.
    clean: HashSet<(u64, u64)>,
    buf: Vec<u8>,
}

impl Unpacker<'_, '_> {
    fn apply(
        &mut self,
        meta: &EntryMeta,
        shown: &str,
        content: &mut impl Read,
    ) -> Result<(), UnpackError> {
        let comps = normalize(&meta.path, shown)?;
        if let Some(last) = comps.last() {
            if last.starts_with(WHITEOUT_PREFIX) {
                return self.whiteout(&comps, shown);
            }
        }
        let mut kind = meta.kind;
        // Pre-POSIX tar: a regular-file flag `\0` with a trailing slash is a
        // directory.
        if meta.typeflag == 0 && meta.path.ends_with(b"/") {
            kind = EntryType::Directory;
        }
        if meta.uid >= u64::from(u32::MAX) || meta.gid >= u64::from(u32::MAX) {
            return Err(hostile(
                shown,
                format!("uid/gid {}:{} out of range", meta.uid, meta.gid),
            ));
        }
        match kind {
            EntryType::Directory => self.directory(&comps, meta, shown),
            EntryType::Regular | EntryType::Continuous => {
                self.regular(&comps, meta, shown, content)
            }
            EntryType::Symlink => self.symlink(&comps, meta, shown),
            EntryType::Link => self.hardlink(&comps, meta, shown),
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let what = match kind {
                    EntryType::Char => "character device",
                    EntryType::Block => "block device",
                    _ => "FIFO",
                };
                match self.budget.limits.special_files {
                    SpecialFiles::Refuse => Err(hostile(shown, format!("{what} refused"))),
                    SpecialFiles::Skip => {
                        self.skip(
                            shown,
                            &format!("{what} skipped (a sandbox's /dev comes from the runtime)"),
                        );
                        Ok(())
                    }
                }
            }
            EntryType::GNUSparse => Err(hostile(shown, "GNU sparse files are not supported")),
            other => Err(hostile(
                shown,
                format!("unsupported entry type {:?}", other.as_byte() as char),
            )),
        }
    }

    /// Records a skipped entry: a `warn!` line and a `skipped` record for the
    /// first [`MAX_SKIPPED_RECORDS`] of a layer, then only the count (a
    /// layer of a million FIFOs must not flood the log).
    fn skip(&mut self, shown: &str, why: &str) {
        self.stats.skipped_total += 1;
        if self.stats.skipped.len() < MAX_SKIPPED_RECORDS {
            tracing::warn!(path = ?shown, "layer: {why}");
            self.stats.skipped.push(format!("{shown:?}: {why}"));
        } else {
            tracing::debug!(path = ?shown, "layer: {why}");
        }
    }

    /// Opens (as `O_PATH`) the directory holding the entry `comps`, resolved
    /// inside the rootfs. Missing directories are created (mode 0755, owned
    /// by the unpacker) when `create`; otherwise `None`.
    fn parent(
        &mut self,
        comps: &[&[u8]],
        create: bool,
        shown: &str,
    ) -> Result<Option<OwnedFd>, UnpackError> {
        let dirs = &comps[..comps.len().saturating_sub(1)];
        let path = dirs.join(&b'/');
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        match open_in_root(self.root, &path, flags) {
            Ok(fd) => return Ok(Some(fd)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(io_err("resolve parent directory of", shown, e)),
        }
        if !create {
            return Ok(None);
        }
        // Create what is missing, walking one component at a time from the
        // rootfs fd: a real directory is entered (`O_NOFOLLOW`), a missing
        // one created, a symlink followed the way `RESOLVE_IN_ROOT` would —
        // its target spliced into the rest of the walk, an absolute one from
        // the rootfs, `..` never above the rootfs — at most 40 times. Each
        // step is one `*at` call on one name from a directory inside the
        // rootfs; the walk is linear in the components.
        let mut todo: VecDeque<Vec<u8>> = dirs.iter().map(|c| c.to_vec()).collect();
        let mut cur =
            open_in_root(self.root, b"", flags).map_err(|e| io_err("open rootfs", shown, e))?;
        let mut cur_id = self.root_id;
        let mut hops = 0;
        let resolve_err = |e: io::Error| io_err("resolve parent directory of", shown, e);
        while let Some(comp) = todo.pop_front() {
            if comp == b".." {
                if cur_id != self.root_id {
                    cur = openat(&cur, c"..", flags | OFlags::CLOEXEC, Mode::empty())
                        .map_err(|e| resolve_err(e.into()))?;
                    cur_id = dev_ino(&fstat(&cur).map_err(|e| resolve_err(e.into()))?);
                }
                continue;
            }
            let name = cstring(&comp);
            match openat(
                &cur,
                &name,
                flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => {
                    let id = dev_ino(&fstat(&fd).map_err(|e| resolve_err(e.into()))?);
                    if id.0 != self.root_id.0 {
                        return Err(resolve_err(Errno::XDEV.into()));
                    }
                    cur = fd;
                    cur_id = id;
                }
                Err(Errno::NOENT) => {
                    // An implicit directory is an entry of the budget: a
                    // few long names must not make millions of inodes.
                    count_entry(self.budget)?;
                    self.stats.implicit_dirs += 1;
                    mkdirat(&cur, &name, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_err("create parent directory of", shown, e.into()))?;
                    let dst = fstat(&cur).map_err(|e| io_err("stat", shown, e.into()))?;
                    self.created.insert(key(&dst, &comp));
                    let d = open_subdir(cur.as_fd(), &name)
                        .map_err(|e| io_err("open parent directory of", shown, e))?;
                    fchmod(&d, Mode::from_raw_mode(0o755))
                        .map_err(|e| io_err("chmod parent directory of", shown, e.into()))?;
                    cur_id = dev_ino(&fstat(&d).map_err(|e| resolve_err(e.into()))?);
                    cur = d;
                }
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    let st = lstat_at(cur.as_fd(), &name).map_err(resolve_err)?;
                    if st.map(|st| FileType::from_raw_mode(st.st_mode)) != Some(FileType::Symlink) {
                        return Err(resolve_err(Errno::NOTDIR.into()));
                    }
                    hops += 1;
                    if hops > 40 {
                        return Err(resolve_err(Errno::LOOP.into()));
                    }
                    let target =
                        readlinkat(&cur, &name, Vec::new()).map_err(|e| resolve_err(e.into()))?;
                    let target = target.as_bytes();
                    if target.starts_with(b"/") {
                        cur = open_in_root(self.root, b"", flags)
                            .map_err(|e| io_err("open rootfs", shown, e))?;
                        cur_id = self.root_id;
                    }
                    for c in target
                        .split(|&b| b == b'/')
                        .filter(|c| !c.is_empty() && *c != b".")
                        .rev()
                    {
                        todo.push_front(c.to_vec());
                    }
                }
                Err(e) => return Err(resolve_err(e.into())),
            }
        }
        Ok(Some(cur))
    }

    /// Parent fd and final name of a (non-root) entry, with whatever was at
    /// that name (not followed).
    fn slot(
        &mut self,
        comps: &[&[u8]],
        shown: &str,
    ) -> Result<(OwnedFd, CString, Stat, Option<Stat>), UnpackError> {
        let Some(last) = comps.last() else {
            return Err(hostile(shown, "names the rootfs itself"));
        };
        let parent = self.parent(comps, true, shown)?.expect("created");
        let pst = fstat(&parent).map_err(|e| io_err("stat parent of", shown, e.into()))?;
        let name = cstring(last);
        let existing = lstat_at(parent.as_fd(), &name).map_err(|e| io_err("stat", shown, e))?;
        Ok((parent, name, pst, existing))
    }

    fn owner(&self, meta: &EntryMeta) -> Option<(Uid, Gid)> {
        // Range checked in `apply`.
        self.budget.limits.preserve_owners.then(|| {
            (
                Uid::from_raw(meta.uid as u32),
                Gid::from_raw(meta.gid as u32),
            )
        })
    }

    fn mode(&mut self, meta: &EntryMeta, keep_sticky: bool) -> Mode {
        if meta.mode & 0o6000 != 0 {
            self.stats.setid_stripped += 1;
        }
        let mask = if keep_sticky { 0o1777 } else { 0o777 };
        Mode::from_raw_mode(meta.mode & mask)
    }

    fn directory(
        &mut self,
        comps: &[&[u8]],
        meta: &EntryMeta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        let fd = if comps.is_empty() {
            // `./`: the rootfs itself takes the mode and owner.
            open_in_root(self.root, b"", OFlags::RDONLY | OFlags::DIRECTORY)
                .map_err(|e| io_err("open rootfs", shown, e))?
        } else {
            let (parent, name, pst, existing) = self.slot(comps, shown)?;
            match existing {
                Some(st) if is_dir(&st) => {}
                other => {
                    if let Some(st) = other {
                        remove_entry(parent.as_fd(), &name, &st)
                            .map_err(|e| io_err("replace", shown, e))?;
                    }
                    mkdirat(&parent, &name, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_err("mkdir", shown, e.into()))?;
                }
            }
            self.created.insert(key(&pst, comps[comps.len() - 1]));
            open_subdir(parent.as_fd(), &name).map_err(|e| io_err("open directory", shown, e))?
        };
        if let Some((u, g)) = self.owner(meta) {
            fchown(&fd, Some(u), Some(g)).map_err(|e| io_err("chown", shown, e.into()))?;
        }
        let mode = self.mode(meta, true);
        fchmod(&fd, mode).map_err(|e| io_err("chmod", shown, e.into()))?;
        self.dir_times.push((comps.join(&b'/'), meta.mtime));
        Ok(())
    }

    fn regular(
        &mut self,
        comps: &[&[u8]],
        meta: &EntryMeta,
        shown: &str,
        content: &mut impl Read,
    ) -> Result<(), UnpackError> {
        let (parent, name, pst, existing) = self.slot(comps, shown)?;
        if let Some(st) = existing {
            remove_entry(parent.as_fd(), &name, &st).map_err(|e| io_err("replace", shown, e))?;
        }
        // O_CREAT|O_EXCL never follows a symlink and never opens an existing
        // file; the name was just cleared.
        let fd = openat(
            &parent,
            &name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io_err("create", shown, e.into()))?;
        self.created.insert(key(&pst, comps[comps.len() - 1]));
        let mut file = File::from(fd);
        copy_content(&mut file, content, meta.size, &mut self.buf, shown)?;
        if let Some((u, g)) = self.owner(meta) {
            fchown(&file, Some(u), Some(g)).map_err(|e| io_err("chown", shown, e.into()))?;
        }
        let mode = self.mode(meta, false);
        fchmod(&file, mode).map_err(|e| io_err("chmod", shown, e.into()))?;
        futimens(&file, &times(meta.mtime)).map_err(|e| io_err("set times", shown, e.into()))?;
        Ok(())
    }

    fn symlink(
        &mut self,
        comps: &[&[u8]],
        meta: &EntryMeta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        let target = meta.link.as_deref().unwrap_or_default();
        if target.is_empty() || target.contains(&0) {
            return Err(hostile(
                shown,
                "symlink with an empty or NUL-containing target",
            ));
        }
        let (parent, name, pst, existing) = self.slot(comps, shown)?;
        if let Some(st) = existing {
            remove_entry(parent.as_fd(), &name, &st).map_err(|e| io_err("replace", shown, e))?;
        }
        // The target is stored verbatim: it is data, resolved later inside
        // the sandbox's root (and by this unpacker only with RESOLVE_IN_ROOT).
        symlinkat(cstring(target).as_c_str(), &parent, &name)
            .map_err(|e| io_err("symlink", shown, e.into()))?;
        self.created.insert(key(&pst, comps[comps.len() - 1]));
        if let Some((u, g)) = self.owner(meta) {
            chownat(&parent, &name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io_err("chown", shown, e.into()))?;
        }
        utimensat(
            &parent,
            &name,
            &times(meta.mtime),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_err("set times", shown, e.into()))?;
        Ok(())
    }

    fn hardlink(
        &mut self,
        comps: &[&[u8]],
        meta: &EntryMeta,
        shown: &str,
    ) -> Result<(), UnpackError> {
        let raw = meta.link.as_deref().unwrap_or_default();
        let tcomps = normalize(raw, shown)?;
        if tcomps.is_empty() {
            return Err(hostile(shown, "hard link to the rootfs itself"));
        }
        let tpath = tcomps.join(&b'/');
        let tdisplay = String::from_utf8_lossy(&tpath);
        // The target is resolved inside the rootfs (a name through a symlink
        // is followed inside it; an absolute name is rootfs-relative) and
        // its final component is not followed.
        let target = match open_in_root(self.root, &tpath, OFlags::PATH | OFlags::NOFOLLOW) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(hostile(
                    shown,
                    format!("hard link to {tdisplay:?}, which is not in the rootfs"),
                ))
            }
            Err(e) => return Err(io_err("resolve hard link target of", shown, e)),
        };
        let tst =
            fstat(&target).map_err(|e| io_err("stat hard link target of", shown, e.into()))?;
        match FileType::from_raw_mode(tst.st_mode) {
            FileType::RegularFile | FileType::Symlink => {}
            other => {
                return Err(hostile(
                    shown,
                    format!("hard link to {tdisplay:?}, a {other:?} (only files and symlinks)"),
                ))
            }
        }
        let (parent, name, pst, existing) = self.slot(comps, shown)?;
        if let Some(st) = existing {
            if st.st_dev == tst.st_dev && st.st_ino == tst.st_ino {
                self.created.insert(key(&pst, comps[comps.len() - 1]));
                return Ok(());
            }
            remove_entry(parent.as_fd(), &name, &st).map_err(|e| io_err("replace", shown, e))?;
        }
        link_fd(target.as_fd(), parent.as_fd(), &name).map_err(|e| io_err("link", shown, e))?;
        self.created.insert(key(&pst, comps[comps.len() - 1]));
        Ok(())
    }

    fn whiteout(&mut self, comps: &[&[u8]], shown: &str) -> Result<(), UnpackError> {
        let last = comps[comps.len() - 1];
        self.stats.whiteouts += 1;
        if last == OPAQUE_MARKER {
            // The directory holding the marker loses everything lower layers
            // put there; what this layer wrote (before or after the marker)
            // stays. The directory itself is not followed if it is a symlink
            // (then there is no directory to make opaque: nothing to do).
            let dirpath = comps[..comps.len() - 1].join(&b'/');
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
            let dir = match open_in_root(self.root, &dirpath, flags) {
                Ok(d) => d,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                    ) =>
                {
                    tracing::debug!(path = ?shown, error = %e, "layer: opaque marker in no directory");
                    return Ok(());
                }
                Err(e) => return Err(io_err("open opaque directory", shown, e)),
            };
            let mut keep = Keep {
                created: &self.created,
                clean: &mut self.clean,
            };
            return prune(dir, Some(&mut keep))
                .map(drop)
                .map_err(|e| io_err("apply opaque whiteout", shown, e));
        }
        let victim = &last[WHITEOUT_PREFIX.len()..];
        if victim.is_empty() || victim == b"." || victim == b".." {
            return Err(hostile(shown, "whiteout names no entry of its directory"));
        }
        if victim.starts_with(WHITEOUT_PREFIX) {
            // `.wh..wh.*` other than the opaque marker: AUFS metadata.
            self.skip(shown, "unknown whiteout metadata skipped");
            return Ok(());
        }
        let Some(parent) = self.parent(comps, false, shown)? else {
            return Ok(());
        };
        let pst = fstat(&parent).map_err(|e| io_err("stat", shown, e.into()))?;
        let name = cstring(victim);
        let Some(st) = lstat_at(parent.as_fd(), &name).map_err(|e| io_err("stat", shown, e))?
        else {
            return Ok(());
        };
        // Written by this layer: stays, losing what lower layers left below
        // it. Otherwise it goes, unless the layer wrote something below it.
        let protected = self.created.contains(&key(&pst, victim));
        let mut keep = Keep {
            created: &self.created,
            clean: &mut self.clean,
        };
        let result = if !is_dir(&st) {
            if protected {
                Ok(())
            } else {
                unlinkat(&parent, &name, AtFlags::empty()).map_err(io::Error::from)
            }
        } else {
            open_subdir(parent.as_fd(), &name)
                .and_then(|d| prune(d, Some(&mut keep)))
                .and_then(|left| {
                    if protected || left {
                        Ok(())
                    } else {
                        unlinkat(&parent, &name, AtFlags::REMOVEDIR).map_err(io::Error::from)
                    }
                })
        };
        result.map_err(|e| io_err("apply whiteout", shown, e))
    }

    fn finish_dir_times(&mut self) {
        for (path, mtime) in std::mem::take(&mut self.dir_times) {
            let r = open_in_root(
                self.root,
                &path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            )
            .and_then(|fd| futimens(&fd, &times(mtime)).map_err(io::Error::from));
            if let Err(e) = r {
                tracing::debug!(path = ?String::from_utf8_lossy(&path), error = %e, "layer: directory mtime not set");
            }
        }
    }
}

/// Makes each of `dirs` a real directory and each of `files` a real regular
/// file inside the rootfs, with no symlink in any component: whatever the
/// layers left on the way (`home -> /`, `etc/resolv.conf -> /etc/shadow`, a
/// file where a directory is needed) is removed through fds, never followed,
/// and replaced by a directory (0755) or an empty file (0644) owned by the
/// unpacker. Existing real directories and files are kept as they are.
///
/// For the runtime's mount points, after the last layer: a launcher that
/// joins them onto the rootfs path on the host (`rootfs.join(dest)`,
/// `create_dir_all`, `mount`) follows no symlink of the image there. Names
/// follow the layer rules (`/` prefix optional, `..` refused).
pub fn ensure_mount_points(
    root: BorrowedFd<'_>,
    dirs: &[&str],
    files: &[&str],
) -> Result<(), UnpackError> {
    for (path, is_file) in dirs
        .iter()
        .map(|p| (*p, false))
        .chain(files.iter().map(|p| (*p, true)))
    {
        let comps = normalize(path.as_bytes(), path)?;
        if comps.is_empty() {
            if is_file {
                return Err(hostile(path, "the rootfs itself cannot be a file"));
            }
            continue;
        }
        let mut cur = open_in_root(root, b"", OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| io_err("open rootfs", path, e))?;
        for (i, comp) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let name = cstring(comp);
            let st = lstat_at(cur.as_fd(), &name).map_err(|e| io_err("stat", path, e))?;
            let ft = st.as_ref().map(|st| FileType::from_raw_mode(st.st_mode));
            let want = if last && is_file {
                FileType::RegularFile
            } else {
                FileType::Directory
            };
            if ft != Some(want) {
                if let Some(st) = &st {
                    tracing::info!(path, "rootfs: mount point path replaced");
                    remove_entry(cur.as_fd(), &name, st)
                        .map_err(|e| io_err("replace mount point path", path, e))?;
                }
                if want == FileType::Directory {
                    mkdirat(&cur, &name, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_err("mkdir mount point", path, e.into()))?;
                    let d = open_subdir(cur.as_fd(), &name)
                        .map_err(|e| io_err("open mount point", path, e))?;
                    fchmod(&d, Mode::from_raw_mode(0o755))
                        .map_err(|e| io_err("chmod mount point", path, e.into()))?;
                } else {
                    let f = openat(
                        &cur,
                        &name,
                        OFlags::WRONLY
                            | OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o644),
                    )
                    .map_err(|e| io_err("create mount point", path, e.into()))?;
                    fchmod(&f, Mode::from_raw_mode(0o644))
                        .map_err(|e| io_err("chmod mount point", path, e.into()))?;
                }
            }
            if !last {
                cur = openat(
                    &cur,
                    &name,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io_err("open mount point path", path, e.into()))?;
            }
        }
    }
    Ok(())
}

fn times(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// `linkat` from an fd (`O_PATH`) to a name: `AT_EMPTY_PATH` (needs
/// CAP_DAC_READ_SEARCH), else through the fd's `/proc/self/fd` magic link.
fn link_fd(target: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> io::Result<()> {
    match linkat(target, c"", dir, name, AtFlags::EMPTY_PATH) {
        Ok(()) => Ok(()),
        Err(Errno::NOENT | Errno::PERM) => {
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&target));
            linkat(
                rustix::fs::CWD,
                proc.as_str(),
                dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
            .map_err(io::Error::from)
        }
        Err(e) => Err(e.into()),
    }
}

/// Copies exactly `size` bytes of content; all-zero blocks become holes.
fn copy_content(
    file: &mut File,
    content: &mut impl Read,
    size: u64,
    buf: &mut [u8],
    shown: &str,
) -> Result<(), UnpackError> {
    let mut left = size;
    let mut hole = false;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = match content.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(UnpackError::Read(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("layer stream ends inside {shown:?}"),
                )))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(UnpackError::Read(e)),
        };
        let chunk = &buf[..n];
        if n >= 4096 && chunk.iter().all(|&b| b == 0) {
            file.seek(SeekFrom::Current(n as i64))
                .map_err(|e| io_err("write", shown, e))?;
            hole = true;
        } else {
            file.write_all(chunk)
                .map_err(|e| io_err("write", shown, e))?;
            hole = false;
        }
        left -= n as u64;
    }
    if hole {
        file.set_len(size).map_err(|e| io_err("write", shown, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> Result<Vec<String>, String> {
        normalize(s.as_bytes(), s)
            .map(|c| {
                c.iter()
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn names_are_normalized_inside_the_root() {
        assert_eq!(norm("a/b").unwrap(), ["a", "b"]);
        assert_eq!(norm("/a/b/").unwrap(), ["a", "b"]);
        assert_eq!(norm("./a/./b").unwrap(), ["a", "b"]);
        assert_eq!(norm("//a//b//").unwrap(), ["a", "b"]);
        assert!(norm("./").unwrap().is_empty());
        assert!(norm("/").unwrap().is_empty());
        assert!(norm("").unwrap().is_empty());
        assert_eq!(norm("a/.wh.b").unwrap(), ["a", ".wh.b"]);
        assert_eq!(norm("...").unwrap(), ["..."]);
        assert_eq!(norm("a/..b/c..").unwrap(), ["a", "..b", "c.."]);
    }

    #[test]
    fn names_leaving_the_root_are_refused() {
        for bad in [
            "..",
            "../a",
            "a/../b",
            "a/..",
            "/..",
            "./..",
            "a/b/../../..",
            "a\0b",
            ".wh.x/y",
            "a/.wh..wh..opq/b",
        ] {
            assert!(norm(bad).is_err(), "{bad:?} accepted");
        }
    }
}
