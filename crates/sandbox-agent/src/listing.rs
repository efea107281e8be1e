//! `POST /v1/file/list` and `POST /v1/file/find`.
//!
//! Listings show direct children (or a depth-limited walk when
//! `recursive`), hidden entries included by default, never `.`/`..`, with
//! absolute, lexically normalized paths, integer sizes and `modified_time`
//! as an ISO-8601 string. Find matches a glob relative to the directory
//! (`**` crosses directories) and returns absolute paths.
//!
//! Owns: directory walking and the shape of entries. Must not read contents.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::paths::{normalize, PathBase};

pub use sandbox_abi::agent_api::{FileInfo, FindRequest, FindResult, ListRequest, ListResult};

#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a directory: {path}")]
    NotADirectory { path: PathBuf },
    /// The path names nothing (the platform's tests look for this wording).
    #[error("{path} does not exist")]
    NotFound { path: PathBuf },
    #[error("invalid glob pattern: {0}")]
    Pattern(#[from] glob::PatternError),
}

impl ListingError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            return Self::NotFound {
                path: path.to_path_buf(),
            };
        }
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn require_dir(path: &Path) -> Result<(), ListingError> {
    let meta = std::fs::metadata(path).map_err(|source| ListingError::io(path, source))?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(ListingError::NotADirectory {
            path: path.to_path_buf(),
        })
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff+00:00` for a Unix time (UTC).
pub fn iso8601_utc(secs: i64, micros: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn entry_info(path: &Path, opts: &ListRequest) -> FileInfo {
    // Follow symlinks like `os.path.isdir`; fall back to the link itself.
    let meta = std::fs::metadata(path)
        .or_else(|_| std::fs::symlink_metadata(path))
        .ok();
    let is_directory = meta.as_ref().is_some_and(|m| m.is_dir());
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let (mtime, modified_time) = match meta.as_ref().and_then(|m| m.modified().ok()) {
        Some(t) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            (
                d.as_secs_f64(),
                Some(iso8601_utc(d.as_secs() as i64, d.subsec_micros())),
            )
        }
        None => (0.0, None),
    };
    let extension = match (is_directory, name.rfind('.')) {
        (false, Some(i)) if i > 0 => Some(name[i..].to_string()),
        _ => None,
    };
    let permissions = if opts.include_permissions.unwrap_or(true) {
        use std::os::unix::fs::PermissionsExt;
        meta.as_ref()
            .map(|m| format!("{:o}", m.permissions().mode() & 0o7777))
    } else {
        None
    };
    FileInfo {
        path: path.display().to_string(),
        name,
        is_directory,
        size: meta
            .as_ref()
            .filter(|_| opts.include_size.unwrap_or(true))
            .map(|m| m.len()),
        modified_time,
        permissions,
        extension,
        mtime,
    }
}

fn walk(
    dir: &Path,
    depth: usize,
    max_depth: usize,
    opts: &ListRequest,
    out: &mut Vec<FileInfo>,
) -> Result<(), ListingError> {
    let rd = std::fs::read_dir(dir).map_err(|source| ListingError::io(dir, source))?;
    for entry in rd.flatten() {
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden && !opts.show_hidden.unwrap_or(true) {
            continue;
        }
        let info = entry_info(&entry.path(), opts);
        // Recurse into real directories only, never through symlinks.
        let real_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let keep = match &opts.file_types {
            Some(types) if !types.is_empty() && !info.is_directory => {
                info.extension.as_ref().is_some_and(|e| {
                    types.iter().any(|t| {
                        t.trim_start_matches('.')
                            .eq_ignore_ascii_case(e.trim_start_matches('.'))
                    })
                })
            }
            _ => true,
        };
        if keep {
            out.push(info);
        }
        if real_dir && depth < max_depth {
            // Unreadable subdirectories are skipped, not fatal.
            let _ = walk(&entry.path(), depth + 1, max_depth, opts, out);
        }
    }
    Ok(())
}

/// Sorts entries by `sort_by` (name, size, modified, type).
pub fn sort_entries(files: &mut [FileInfo], sort_by: Option<&str>, desc: bool) {
    match sort_by.unwrap_or("name") {
        "size" => files.sort_by(|a, b| a.size.cmp(&b.size).then(a.path.cmp(&b.path))),
        "modified" | "modified_time" | "mtime" => {
            files.sort_by(|a, b| a.mtime.total_cmp(&b.mtime).then(a.path.cmp(&b.path)))
        }
        "type" => files.sort_by(|a, b| {
            (!a.is_directory, &a.extension, &a.path).cmp(&(!b.is_directory, &b.extension, &b.path))
        }),
        _ => files.sort_by(|a, b| a.path.cmp(&b.path)),
    }
    if desc {
        files.reverse();
    }
}

pub fn list(base: &PathBase, req: ListRequest) -> Result<ListResult, ListingError> {
    let path = base.resolve(&req.path);
    require_dir(&path)?;
    let max_depth = if req.recursive.unwrap_or(false) {
        req.max_depth
            .filter(|d| *d > 0)
            .map_or(usize::MAX, |d| d as usize)
    } else {
        1
    };
    let mut files = Vec::new();
    walk(&path, 1, max_depth, &req, &mut files)?;
    sort_entries(
        &mut files,
        req.sort_by.as_deref(),
        req.sort_desc.unwrap_or(false),
    );
    let directory_count = files.iter().filter(|f| f.is_directory).count();
    Ok(ListResult {
        path: path.display().to_string(),
        total_count: files.len(),
        file_count: files.len() - directory_count,
        directory_count,
        files,
    })
}

pub fn find(base: &PathBase, req: FindRequest) -> Result<FindResult, ListingError> {
    let path = base.resolve(&req.path);
    require_dir(&path)?;
    let rel = req.glob.trim_start_matches("./");
    let pattern = if Path::new(rel).is_absolute() {
        rel.to_owned()
    } else {
        format!(
            "{}/{}",
            glob::Pattern::escape(&path.display().to_string()),
            rel
        )
    };
    let mut files: Vec<String> = glob::glob(&pattern)?
        .flatten()
        .map(|p| normalize(&p).display().to_string())
        .collect();
    files.sort();
    files.dedup();
    Ok(FindResult {
        path: path.display().to_string(),
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601_utc(0, 0), "1970-01-01T00:00:00.000000+00:00");
        assert_eq!(
            iso8601_utc(951_782_400, 5),
            "2000-02-29T00:00:00.000005+00:00"
        );
        assert_eq!(
            iso8601_utc(1_700_000_000, 0),
            "2023-11-14T22:13:20.000000+00:00"
        );
    }

    fn tree() -> (tempfile::TempDir, PathBase) {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("sub/deep")).unwrap();
        std::fs::write(r.join("a.txt"), "12345").unwrap();
        std::fs::write(r.join(".hidden"), "").unwrap();
        std::fs::write(r.join("sub/b.py"), "").unwrap();
        std::fs::write(r.join("sub/deep/c.py"), "").unwrap();
        let base = PathBase {
            cwd: r.to_path_buf(),
            home: r.to_path_buf(),
        };
        (dir, base)
    }

    fn req(path: &str) -> ListRequest {
        serde_json::from_value(serde_json::json!({ "path": path })).unwrap()
    }

    #[test]
    fn lists_direct_children_with_hidden_and_shapes() {
        let (dir, base) = tree();
        let r = list(&base, req(".")).unwrap();
        let names: Vec<_> = r.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [".hidden", "a.txt", "sub"]);
        assert_eq!((r.total_count, r.directory_count, r.file_count), (3, 1, 2));
        let a = &r.files[1];
        assert_eq!(a.path, dir.path().join("a.txt").display().to_string());
        assert_eq!((a.size, a.extension.as_deref()), (Some(5), Some(".txt")));
        assert!(a.modified_time.as_deref().unwrap().ends_with("+00:00"));
        let mut rq = req(".");
        rq.show_hidden = Some(false);
        rq.recursive = Some(true);
        rq.file_types = Some(vec![".py".into()]);
        let names: Vec<_> = list(&base, rq)
            .unwrap()
            .files
            .into_iter()
            .map(|f| f.name)
            .collect();
        // Sorted by full path: sub, sub/b.py, sub/deep, sub/deep/c.py.
        assert_eq!(names, ["sub", "b.py", "deep", "c.py"]);
    }

    #[test]
    fn list_errors() {
        let (_dir, base) = tree();
        assert!(matches!(
            list(&base, req("nope")),
            Err(ListingError::NotFound { .. })
        ));
        let e = list(&base, req("nope")).unwrap_err().to_string();
        assert!(e.ends_with("/nope does not exist"), "{e}");
        assert!(matches!(
            list(&base, req("a.txt")),
            Err(ListingError::NotADirectory { .. })
        ));
    }

    #[test]
    fn find_globs_relative_to_path() {
        let (dir, base) = tree();
        let r = find(
            &base,
            FindRequest {
                path: "sub".into(),
                glob: "**/*.py".into(),
            },
        )
        .unwrap();
        let root = dir.path().display().to_string();
        assert_eq!(
            r.files,
            [format!("{root}/sub/b.py"), format!("{root}/sub/deep/c.py")]
        );
        let r = find(
            &base,
            FindRequest {
                path: ".".into(),
                glob: "*.txt".into(),
            },
        )
        .unwrap();
        assert_eq!(r.files, [format!("{root}/a.txt")]);
    }
}
