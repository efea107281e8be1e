//! Tar framing with bounded metadata.
//!
//! The `tar` crate parses each 512-byte header (numeric fields, ustar
//! prefix/name, link names) and the PAX records, but the *framing* — which
//! blocks are headers, how much metadata is read into memory, where an
//! entry's content ends — is done here, because `tar::Archive` reads GNU
//! long names and PAX headers into memory whatever their declared size (a
//! 20 GiB "long name" would be a 20 GiB allocation). Here every metadata
//! member is size-checked against a small cap *before* it is read.

use std::io::{self, Read};

use tar::{EntryType, Header, PaxExtensions};

use super::UnpackError;

pub(crate) const BLOCK: u64 = 512;
/// Largest PAX extended header (local or global) accepted. Real ones are a
/// few hundred bytes; xattrs can make them a few KiB.
pub(crate) const MAX_PAX_BYTES: u64 = 1 << 20;
/// Bytes accepted after the end-of-archive marker (writers pad to a 10 KiB
/// record; anything much longer is not a tar stream's padding).
pub(crate) const MAX_TRAILING_BYTES: u64 = 1 << 20;

/// The layer stream, counting what was read.
pub(crate) struct Stream<R> {
    inner: R,
    pub(crate) pos: u64,
}

impl<R: Read> Read for Stream<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = loop {
            match self.inner.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read> Stream<R> {
    pub(crate) fn new(inner: R) -> Self {
        Stream { inner, pos: 0 }
    }

    /// Reads until `buf` is full or EOF; returns how much was read.
    fn read_full(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            let n = self.read(&mut buf[got..])?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }

    /// Discards exactly `n` bytes; EOF before that is an error.
    pub(crate) fn skip(&mut self, mut n: u64, scratch: &mut [u8]) -> io::Result<()> {
        while n > 0 {
            let want = n.min(scratch.len() as u64) as usize;
            let got = self.read(&mut scratch[..want])?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "layer stream ends inside an entry",
                ));
            }
            n -= got as u64;
        }
        Ok(())
    }

    /// After the end-of-archive marker: consumes the rest of the stream (so
    /// a caller hashing it sees every byte), at most [`MAX_TRAILING_BYTES`].
    pub(crate) fn drain_trailer(&mut self, scratch: &mut [u8]) -> Result<(), UnpackError> {
        let mut seen = 0u64;
        loop {
            let n = self.read(scratch).map_err(UnpackError::Read)?;
            if n == 0 {
                return Ok(());
            }
            seen += n as u64;
            if seen > MAX_TRAILING_BYTES {
                return Err(UnpackError::Limit(format!(
                    "more than {MAX_TRAILING_BYTES} bytes after the end-of-archive marker"
                )));
            }
        }
    }

    fn read_meta(&mut self, size: u64) -> Result<Vec<u8>, UnpackError> {
        // `size` is already capped by the caller.
        let mut data = vec![0u8; size as usize];
        if self.read_full(&mut data).map_err(UnpackError::Read)? != data.len() {
            return Err(truncated());
        }
        let mut pad = [0u8; BLOCK as usize];
        self.skip(padding(size), &mut pad)
            .map_err(UnpackError::Read)?;
        Ok(data)
    }
}

/// Bytes of padding after `size` bytes of content.
pub(crate) fn padding(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

fn truncated() -> UnpackError {
    UnpackError::Read(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "layer stream ends inside a tar header",
    ))
}

/// One member of the archive, metadata resolved (GNU long names and PAX
/// records applied), its content still in the stream.
#[derive(Debug)]
pub(crate) struct EntryMeta {
    pub path: Vec<u8>,
    pub link: Option<Vec<u8>>,
    pub kind: EntryType,
    /// Raw typeflag byte (`\0` is the pre-POSIX "regular file" flag).
    pub typeflag: u8,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: i64,
    /// Content bytes that follow the header (before padding).
    pub size: u64,
    /// xattr names carried in PAX records (never applied; counted).
    pub xattrs: u64,
}

pub(crate) enum Member {
    Entry(EntryMeta),
    /// A PAX global header, consumed (counts as an entry for the budget).
    Global,
    End,
}

fn malformed(offset: u64, reason: impl Into<String>) -> UnpackError {
    UnpackError::Hostile {
        path: format!("<tar header at byte {offset}>"),
        reason: reason.into(),
    }
}

fn parse_decimal(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

fn parse_pax_time(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    let secs = s.split('.').next()?;
    secs.parse().ok()
}

/// A numeric header field as parsed by the `tar` crate, except that an
/// empty field (all NUL/space, as some writers leave uid/gid/mtime) is 0.
fn numeric(
    field: &[u8],
    parsed: io::Result<u64>,
    offset: u64,
    what: &str,
) -> Result<u64, UnpackError> {
    if field.iter().all(|&b| b == 0 || b == b' ') {
        return Ok(0);
    }
    parsed.map_err(|e| malformed(offset, format!("{what} field: {e}")))
}

/// Reads the next member. Metadata members (GNU `L`/`K`, PAX `x`) are
/// accumulated into the following entry; each is capped before it is read:
/// long names at `max_path_len`, PAX headers at [`MAX_PAX_BYTES`].
pub(crate) fn next_member<R: Read>(
    s: &mut Stream<R>,
    max_path_len: usize,
) -> Result<Member, UnpackError> {
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax: Option<Vec<u8>> = None;
    loop {
        let offset = s.pos;
        let mut block = [0u8; BLOCK as usize];
        let got = s.read_full(&mut block).map_err(UnpackError::Read)?;
        let pending = long_name.is_some() || long_link.is_some() || pax.is_some();
        if got == 0 || (got == block.len() && block.iter().all(|&b| b == 0)) {
            if pending {
                return Err(malformed(
                    offset,
                    "extension header without a following entry",
                ));
            }
            return Ok(Member::End);
        }
        if got < block.len() {
            return Err(truncated());
        }
        let hdr = Header::from_byte_slice(&block);
        let sum: u32 = block[..148]
            .iter()
            .chain(&block[156..])
            .map(|&b| u32::from(b))
            .sum::<u32>()
            + 8 * u32::from(b' ');
        match hdr.cksum() {
            Ok(c) if c == sum => {}
            _ => return Err(malformed(offset, "header checksum mismatch")),
        }
        let kind = hdr.entry_type();
        let size = numeric(&block[124..136], hdr.entry_size(), offset, "size")?;
        match kind {
            EntryType::GNULongName | EntryType::GNULongLink => {
                // +1: GNU writes a terminating NUL.
                if size > max_path_len as u64 + 1 {
                    return Err(UnpackError::Limit(format!(
                        "GNU long name of {size} bytes at byte {offset} (limit {max_path_len})"
                    )));
                }
                let mut data = s.read_meta(size)?;
                while data.last() == Some(&0) {
                    data.pop();
                }
                let slot = if kind == EntryType::GNULongName {
                    &mut long_name
                } else {
                    &mut long_link
                };
                if slot.replace(data).is_some() {
                    return Err(malformed(offset, "two GNU long-name headers for one entry"));
                }
                continue;
            }
            EntryType::XHeader | EntryType::XGlobalHeader => {
                if size > MAX_PAX_BYTES {
                    return Err(UnpackError::Limit(format!(
                        "PAX header of {size} bytes at byte {offset} (limit {MAX_PAX_BYTES})"
                    )));
                }
                let data = s.read_meta(size)?;
                if kind == EntryType::XGlobalHeader {
                    if pending {
                        return Err(malformed(
                            offset,
                            "PAX global header inside an entry's headers",
                        ));
                    }
                    tracing::debug!(offset, "layer: PAX global header ignored");
                    return Ok(Member::Global);
                }
                if pax.replace(data).is_some() {
                    return Err(malformed(offset, "two PAX headers for one entry"));
                }
                continue;
            }
            _ => {}
        }

        let mut meta = EntryMeta {
            path: long_name
                .take()
                .unwrap_or_else(|| hdr.path_bytes().into_owned()),
            link: long_link
                .take()
                .or_else(|| hdr.link_name_bytes().map(|l| l.into_owned())),
            kind,
            typeflag: block[156],
            mode: numeric(&block[100..108], hdr.mode().map(u64::from), offset, "mode")? as u32,
            uid: numeric(&block[108..116], hdr.uid(), offset, "uid")?,
            gid: numeric(&block[116..124], hdr.gid(), offset, "gid")?,
            mtime: numeric(&block[136..148], hdr.mtime(), offset, "mtime")
                .map(|t| i64::try_from(t).unwrap_or(i64::MAX))?,
            size,
            xattrs: 0,
        };
        if let Some(pax) = pax.take() {
            for rec in PaxExtensions::new(&pax) {
                let rec = rec.map_err(|e| malformed(offset, format!("PAX record: {e}")))?;
                let (k, v) = (rec.key_bytes(), rec.value_bytes());
                let bad = |what: &str| {
                    malformed(
                        offset,
                        format!("PAX {what} {:?}", String::from_utf8_lossy(v)),
                    )
                };
                match k {
                    b"path" => meta.path = v.to_vec(),
                    b"linkpath" => meta.link = Some(v.to_vec()),
                    b"size" => meta.size = parse_decimal(v).ok_or_else(|| bad("size"))?,
                    b"uid" => meta.uid = parse_decimal(v).ok_or_else(|| bad("uid"))?,
                    b"gid" => meta.gid = parse_decimal(v).ok_or_else(|| bad("gid"))?,
                    b"mtime" => meta.mtime = parse_pax_time(v).ok_or_else(|| bad("mtime"))?,
                    _ if k.starts_with(b"SCHILY.xattr.") || k.starts_with(b"LIBARCHIVE.xattr.") => {
                        meta.xattrs += 1
                    }
                    _ if k.starts_with(b"GNU.sparse.") => {
                        return Err(malformed(
                            offset,
                            "PAX-format GNU sparse files are not supported",
                        ))
                    }
                    _ => {}
                }
            }
        }
        // Header-only types carry no content whatever their size field says
        // (as Go's archive/tar reads them, which wrote nearly every layer):
        // parsing them otherwise would let one layer mean two things.
        if matches!(
            kind,
            EntryType::Link
                | EntryType::Symlink
                | EntryType::Char
                | EntryType::Block
                | EntryType::Directory
                | EntryType::Fifo
        ) {
            meta.size = 0;
        }
        return Ok(Member::Entry(meta));
    }
}
