//! `POST /v1/file/upload` (multipart) and `GET /v1/file/download`.
//!
//! Both stream: an upload is written to disk chunk by chunk as it arrives
//! (any size, never held in memory), into a temporary file beside the
//! destination that is renamed onto the exact given path at the end; a
//! download is sent in 64 KiB frames with a `Content-Length`. Byte-exact
//! both ways.
//!
//! Downloads send regular files only (procfs files are regular too): a
//! FIFO, device or socket is refused with 400 before anything is sent.
//!
//! Owns: moving file bytes over HTTP. Must not interpret file contents.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{header, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::body::AgentBody;
use super::paths::PathBase;

pub use sandbox_abi::agent_api::UploadResult;

const DOWNLOAD_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("is a directory, a file is expected: {path}")]
    IsDirectory { path: PathBuf },
    /// The path names nothing (the platform's tests look for this wording).
    #[error("{path} does not exist")]
    NotFound { path: PathBuf },
    /// A FIFO, device or socket where a file is expected.
    #[error("{path} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error("missing destination: give a `path` field (or `?path=`) or a file name")]
    MissingPath,
    #[error("missing multipart file part named `file`")]
    MissingFile,
    #[error("reading multipart body: {0}")]
    Multipart(#[from] multer::Error),
}

fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> TransferError + 'a {
    move |source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            return TransferError::NotFound {
                path: path.to_path_buf(),
            };
        }
        TransferError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A file part written to a temporary path, not yet at its destination.
struct Staged {
    temp: PathBuf,
    size: u64,
    filename: Option<String>,
}

/// A temporary name in `dir` that no one else uses.
fn temp_in(dir: &Path, hint: &str) -> PathBuf {
    let tag = sandbox_abi::random::u64();
    dir.join(format!(".{hint}.sandbox-agent-upload.{tag:016x}"))
}

/// Streams one multipart field into a new file at `temp`.
async fn stream_to(field: &mut multer::Field<'_>, temp: &Path) -> Result<u64, TransferError> {
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temp)
        .await
        .map_err(io_err("create", temp))?;
    let mut size = 0u64;
    while let Some(chunk) = field.chunk().await? {
        file.write_all(&chunk)
            .await
            .map_err(io_err("write", temp))?;
        size += chunk.len() as u64;
    }
    // tokio's File completes writes in the background; flush before rename.
    file.flush().await.map_err(io_err("write", temp))?;
    Ok(size)
}

/// Where the upload goes, with parents created.
async fn prepare_dest(base: &PathBase, raw: &str) -> Result<PathBuf, TransferError> {
    let dest = base.resolve(raw);
    if tokio::fs::metadata(&dest).await.is_ok_and(|m| m.is_dir()) {
        return Err(TransferError::IsDirectory { path: dest });
    }
    if let Some(parent) = dest.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(io_err("create directory", parent))?;
    }
    Ok(dest)
}

/// Moves a staged file onto `dest` (copying across filesystems).
async fn place(temp: &Path, dest: &Path) -> Result<(), TransferError> {
    match tokio::fs::rename(temp, dest).await {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let copy = temp_in(dest.parent().unwrap_or(Path::new("/")), "x");
            tokio::fs::copy(temp, &copy)
                .await
                .map_err(io_err("copy", dest))?;
            let _ = tokio::fs::remove_file(temp).await;
            tokio::fs::rename(&copy, dest)
                .await
                .map_err(io_err("rename", dest))
        }
        Err(e) => Err(io_err("rename", dest)(e)),
    }
}

pub async fn upload(
    base: &PathBase,
    query_path: Option<String>,
    req: Request<Incoming>,
) -> Result<UploadResult, TransferError> {
    let boundary = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(multer::parse_boundary)
        .ok_or(multer::Error::NoMultipart)??;
    let mut multipart = multer::Multipart::new(BodyDataStream::new(req.into_body()), boundary);
    let mut path = query_path.filter(|p| !p.is_empty());
    let mut dest: Option<PathBuf> = None;
    let mut staged: Option<Staged> = None;
    let result = async {
        while let Some(mut field) = multipart.next_field().await? {
            match field.name() {
                Some("path") => {
                    path = Some(field.text().await?).filter(|p| !p.is_empty());
                }
                Some("file") if staged.is_none() => {
                    let filename = field.file_name().map(str::to_owned);
                    // Stream next to the destination when it is known already
                    // (clients send `path` first); otherwise into the temp dir.
                    if let Some(raw) = &path {
                        dest = Some(prepare_dest(base, raw).await?);
                    }
                    let dir = match &dest {
                        Some(d) => d.parent().unwrap_or(Path::new("/")).to_path_buf(),
                        None => std::env::temp_dir(),
                    };
                    let temp = temp_in(&dir, "file");
                    let outcome = stream_to(&mut field, &temp).await;
                    match outcome {
                        Ok(size) => {
                            staged = Some(Staged {
                                temp,
                                size,
                                filename,
                            })
                        }
                        Err(e) => {
                            let _ = tokio::fs::remove_file(&temp).await;
                            return Err(e);
                        }
                    }
                }
                _ => {}
            }
        }
        let Some(file) = &staged else {
            return Err(TransferError::MissingFile);
        };
        let dest = match (&dest, &path, &file.filename) {
            (Some(d), _, _) => d.clone(),
            (None, Some(raw), _) => prepare_dest(base, raw).await?,
            (None, None, Some(name)) if !name.is_empty() => {
                let leaf = Path::new(name)
                    .file_name()
                    .ok_or(TransferError::MissingPath)?;
                prepare_dest(base, &leaf.to_string_lossy()).await?
            }
            _ => return Err(TransferError::MissingPath),
        };
        place(&file.temp, &dest).await?;
        Ok(UploadResult {
            file_path: dest.display().to_string(),
            file_size: file.size,
            success: true,
        })
    }
    .await;
    if let (Err(_), Some(s)) = (&result, &staged) {
        let _ = tokio::fs::remove_file(&s.temp).await;
    }
    result
}

/// `filename*=` parameter value (RFC 5987).
fn disposition(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let encoded: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("attachment; filename*=UTF-8''{encoded}")
}

pub async fn download(base: &PathBase, raw: &str) -> Result<Response<AgentBody>, TransferError> {
    let path = base.resolve(raw);
    // O_NONBLOCK so a FIFO cannot block the open; then fstat what was
    // opened: only regular files are sent (a FIFO or `/dev/zero` planted
    // where a file is expected would stall the download forever).
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .await
        .map_err(io_err("open", &path))?;
    let meta = file.metadata().await.map_err(io_err("stat", &path))?;
    if meta.is_dir() {
        return Err(TransferError::IsDirectory { path });
    }
    if !meta.is_file() {
        return Err(TransferError::NotRegular { path });
    }
    // Sent with their length (and never past it, should the file grow
    // meanwhile); files that report no size (procfs) chunked to EOF.
    let length = (meta.len() > 0).then_some(meta.len());
    let file = file.take(length.unwrap_or(u64::MAX));
    let stream = futures_util::stream::unfold(Some(file), |state| async move {
        let mut file = state?;
        let mut buf = vec![0u8; DOWNLOAD_CHUNK];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some(file)))
            }
            // Headers are out: report the error once, then end the stream.
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut resp = Response::new(StreamBody::new(stream.boxed()).boxed_unsync());
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(len) = length {
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
    }
    if let Ok(v) = header::HeaderValue::from_str(&disposition(&path)) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_is_ascii_safe() {
        assert_eq!(
            disposition(Path::new("/a/b c\".bin")),
            "attachment; filename*=UTF-8''b%20c%22.bin"
        );
        assert_eq!(
            disposition(Path::new("/x/é")),
            "attachment; filename*=UTF-8''%C3%A9"
        );
    }
}
