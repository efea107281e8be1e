//! `POST /v1/file/read` and `POST /v1/file/write`, plus the error type and
//! file helpers the editor shares.
//!
//! Reads are byte-exact: text is returned as is; non-UTF-8 content is an
//! error whose message matches Python's (`'utf-8' codec can't decode ...`),
//! which callers already handle. Files are created with the process umask
//! (mode 0666 & ~umask; the sandbox runs with umask 077).
//!
//! Only regular files are read or written: a path is opened with
//! `O_NONBLOCK` (so a FIFO cannot block the open) and checked with `fstat`
//! on the opened descriptor, so a FIFO, a device or a socket planted where
//! a file is expected is refused at once instead of blocking or streaming
//! forever.
//!
//! Owns: reading and writing whole files. Must not list directories.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;

use super::paths::PathBase;

pub use sandbox_abi::agent_api::{ReadRequest, ReadResult, WriteRequest, WriteResult};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: 'utf-8' codec can't decode byte 0x{byte:02x} in position {position}: invalid start byte")]
    NotUtf8 {
        path: PathBuf,
        byte: u8,
        position: usize,
    },
    #[error("is a directory, a file is expected: {path}")]
    IsDirectory { path: PathBuf },
    /// The path names nothing (the platform's tests look for this wording).
    #[error("{path} does not exist")]
    NotFound { path: PathBuf },
    /// A FIFO, device or socket where a file is expected.
    #[error("{path} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error("invalid base64 content: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("no replacement was performed, old_str `{old}` did not appear verbatim in {path}")]
    OldStrNotFound { old: String, path: PathBuf },
    #[error("no replacement was performed: old_str `{old}` occurs {count} times in {path}; make it unique or pass replace_mode FIRST/ALL/LAST")]
    OldStrNotUnique {
        old: String,
        count: usize,
        path: PathBuf,
    },
    #[error("missing required field `{field}` for command {command}")]
    MissingField {
        field: &'static str,
        command: String,
    },
    #[error("unsupported command `{command}`")]
    UnsupportedCommand { command: String },
    #[error("invalid line number {line} for {path} ({lines} lines)")]
    InvalidLine {
        line: i64,
        lines: usize,
        path: PathBuf,
    },
    #[error("no edit to undo for {path}")]
    NoHistory { path: PathBuf },
}

impl FileError {
    pub fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        // Reading or writing a directory fails with EISDIR: a 400, not a 500.
        if source.raw_os_error() == Some(libc::EISDIR) {
            return Self::IsDirectory {
                path: path.to_path_buf(),
            };
        }
        if source.kind() == std::io::ErrorKind::NotFound {
            return Self::NotFound {
                path: path.to_path_buf(),
            };
        }
        Self::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Refuses an opened `file` unless it is a regular file (`fstat` on the
/// descriptor: what was opened, whatever the path names by now).
fn require_regular(file: &File, path: &Path) -> Result<(), FileError> {
    let meta = file
        .metadata()
        .map_err(|e| FileError::io("stat", path, e))?;
    if meta.is_dir() {
        return Err(FileError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    if !meta.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Opens a regular file for reading; anything else is refused without
/// blocking (see the module documentation).
pub fn open_regular(path: &Path) -> Result<File, FileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| FileError::io("open", path, e))?;
    require_regular(&file, path)?;
    Ok(file)
}

/// Reads a whole file as UTF-8 text; directories, special files and
/// binary are errors.
pub fn read_text(path: &Path) -> Result<String, FileError> {
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| FileError::io("read", path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        let position = e.utf8_error().valid_up_to();
        FileError::NotUtf8 {
            path: path.to_path_buf(),
            byte: e.as_bytes()[position],
            position,
        }
    })
}

/// Writes `bytes` to `path`, creating parent directories; umask applies.
pub fn write_bytes(path: &Path, bytes: &[u8], append: bool) -> Result<(), FileError> {
    if path.is_dir() {
        return Err(FileError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| FileError::io("create directory", parent, e))?;
    }
    // O_NONBLOCK: opening a FIFO for writing fails with ENXIO when nobody
    // reads it, instead of waiting for a reader.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => FileError::NotRegular {
                path: path.to_path_buf(),
            },
            _ => FileError::io("open", path, e),
        })?;
    require_regular(&file, path)?;
    file.write_all(bytes)
        .map_err(|e| FileError::io("write", path, e))
}

/// Python-style slice `[start:end]` of the file's lines (line endings kept).
pub fn line_range(text: &str, start: Option<i64>, end: Option<i64>) -> &str {
    if start.is_none() && end.is_none() {
        return text;
    }
    // Byte offset where each line starts, plus the end of the text.
    let mut bounds: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .filter(|&i| i < text.len())
        .collect();
    let lines = bounds.len() as i64;
    bounds.push(text.len());
    let clamp = |v: i64| -> usize {
        let v = if v < 0 { v + lines } else { v };
        v.clamp(0, lines) as usize
    };
    let s = clamp(start.unwrap_or(0));
    let e = end.map_or(lines as usize, clamp);
    if s >= e {
        return "";
    }
    &text[bounds[s]..bounds[e]]
}

pub fn read(base: &PathBase, req: ReadRequest) -> Result<ReadResult, FileError> {
    let path = base.resolve(&req.file);
    let text = read_text(&path)?;
    let content = line_range(&text, req.start_line, req.end_line).to_owned();
    Ok(ReadResult {
        content,
        file: path.display().to_string(),
    })
}

/// The bytes a write request puts on disk.
pub fn write_payload(req: &WriteRequest) -> Result<Vec<u8>, FileError> {
    let encoding = req
        .encoding
        .as_deref()
        .unwrap_or("utf-8")
        .to_ascii_lowercase();
    if encoding == "base64" {
        let cleaned: String = req.content.split_whitespace().collect();
        return Ok(base64::engine::general_purpose::STANDARD.decode(cleaned)?);
    }
    let mut text = String::with_capacity(req.content.len() + 2);
    if req.leading_newline.unwrap_or(false) {
        text.push('\n');
    }
    text.push_str(&req.content);
    if req.trailing_newline.unwrap_or(false) {
        text.push('\n');
    }
    Ok(text.into_bytes())
}

pub fn write(base: &PathBase, req: WriteRequest) -> Result<WriteResult, FileError> {
    let path = base.resolve(&req.file);
    let bytes = write_payload(&req)?;
    write_bytes(&path, &bytes, req.append.unwrap_or(false))?;
    Ok(WriteResult {
        file: path.display().to_string(),
        bytes_written: bytes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "l0\nl1\nl2\nl3";

    #[test]
    fn line_ranges_follow_python_slices() {
        assert_eq!(line_range(T, None, None), T);
        assert_eq!(line_range(T, Some(1), Some(3)), "l1\nl2\n");
        assert_eq!(line_range(T, Some(2), None), "l2\nl3");
        assert_eq!(line_range(T, Some(0), Some(1)), "l0\n");
        assert_eq!(line_range(T, Some(-1), None), "l3");
        assert_eq!(line_range(T, Some(3), Some(2)), "");
        assert_eq!(line_range(T, Some(10), Some(20)), "");
        assert_eq!(line_range("a\nb\n", Some(1), Some(5)), "b\n");
        assert_eq!(line_range("", Some(0), Some(5)), "");
    }

    #[test]
    fn payload_newlines_and_base64() {
        let mut req = WriteRequest {
            file: "f".into(),
            content: "x".into(),
            encoding: None,
            append: None,
            leading_newline: Some(true),
            trailing_newline: Some(true),
        };
        assert_eq!(write_payload(&req).unwrap(), b"\nx\n");
        req.encoding = Some("base64".into());
        req.content = "AP8K\n".into();
        assert_eq!(write_payload(&req).unwrap(), vec![0, 255, 10]);
        req.content = "***".into();
        assert!(matches!(write_payload(&req), Err(FileError::Base64(_))));
    }

    #[test]
    fn binary_read_reports_like_python() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bin");
        std::fs::write(&p, [b'o', b'k', 0x89, 0x50]).unwrap();
        let err = read_text(&p).unwrap_err().to_string();
        assert!(
            err.contains("'utf-8' codec can't decode byte 0x89 in position 2"),
            "{err}"
        );
        assert!(matches!(
            read_text(dir.path()),
            Err(FileError::IsDirectory { .. })
        ));
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for p in [&fifo, &zero] {
            assert!(
                matches!(read_text(p), Err(FileError::NotRegular { .. })),
                "{p:?}"
            );
            assert!(
                matches!(
                    write_bytes(p, b"x", false),
                    Err(FileError::NotRegular { .. })
                ),
                "{p:?}"
            );
        }
        let e = read_text(&fifo).unwrap_err().to_string();
        assert!(e.ends_with("/fifo is not a regular file"), "{e}");
    }

    #[test]
    fn write_creates_parents_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b/c.txt");
        write_bytes(&p, b"one", false).unwrap();
        write_bytes(&p, b"two", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"onetwo");
        write_bytes(&p, b"3", false).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"3");
        assert!(matches!(
            write_bytes(dir.path(), b"x", false),
            Err(FileError::IsDirectory { .. })
        ));
    }
}
