//! File-level helpers for what libcgroups does not cover: reading limits and
//! counters back, writing single values, listing and removing directories.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::CgroupError;
use sandbox_abi::model::validate_node_key;

/// v1 reports "no limit" as a huge page-aligned number (`PAGE_COUNTER_MAX`
/// times the page size); anything at or above 2^62 is treated as unlimited.
const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

pub(crate) fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `value` with a single `write(2)` into an existing cgroup file
/// (`O_TRUNC` as runc does: ignored by cgroupfs, right for fake trees).
pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    let err = |source| CgroupError::WriteFile {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    };
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(err)?
        .write_all(value.as_bytes())
        .map_err(err)
}

/// Value of `key` in a flat-keyed file (`memory.events`, `cpu.stat`,
/// `memory.oom_control`: one `key value` pair per line).
pub(crate) fn flat_keyed(content: &str, key: &str) -> Option<u64> {
    content.lines().find_map(|line| {
        let (k, v) = line.split_once(char::is_whitespace)?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Parses a limit file: `max` (v2), `-1` (v1 quota) or a v1 "unlimited"
/// sentinel give `None`.
pub(crate) fn parse_limit(path: &Path, content: &str) -> Result<Option<u64>, CgroupError> {
    let v = content.trim();
    if v == "max" || v == "-1" {
        return Ok(None);
    }
    match v.parse::<u64>() {
        Ok(n) if n >= V1_UNLIMITED_FLOOR => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(CgroupError::Parse {
            path: path.to_path_buf(),
            content: v.to_string(),
        }),
    }
}

/// Reads and parses a limit file.
pub(crate) fn read_limit(path: &Path) -> Result<Option<u64>, CgroupError> {
    parse_limit(path, &read(path)?)
}

/// Reads a single unsigned number.
pub(crate) fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let content = read(path)?;
    content.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        content: content.trim().to_string(),
    })
}

/// Parses v2 `cpu.max` (`"<quota|max> <period>"`).
pub(crate) fn parse_cpu_max(path: &Path, content: &str) -> Result<(Option<u64>, u64), CgroupError> {
    let bad = || CgroupError::Parse {
        path: path.to_path_buf(),
        content: content.trim().to_string(),
    };
    let mut it = content.split_whitespace();
    let quota = parse_limit(path, it.next().ok_or_else(bad)?)?;
    let period = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    Ok((quota, period))
}

/// Names of the sandbox cgroups directly under `dir` (subdirectories whose
/// name is a valid sandbox id). A missing `dir` is an empty list.
pub(crate) fn child_ids(dir: &Path) -> Result<Vec<String>, CgroupError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CgroupError::ReadFile {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut ids = Vec::new();
    for entry in entries.flatten() {
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let name = entry.file_name();
        if let Some(name) = name.to_str() {
            if is_dir && validate_node_key(name).is_ok() {
                ids.push(name.to_string());
            }
        }
    }
    Ok(ids)
}

/// Removes the child cgroups under `dir`, deepest first, leaving `dir`
/// itself (libcgroups only removes the sandbox's own directory). A payload
/// cannot normally create children, but a leftover must not block removal.
pub(crate) fn remove_children(dir: &Path) -> Result<(), CgroupError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::ReadFile {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let children: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path())
        .collect();
    for child in children {
        remove_children(&child)?;
        match fs::remove_dir(&child) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(_) => return Err(CgroupError::StillPresent { path: child }),
        }
    }
    Ok(())
}

/// Creates `dir` and its missing ancestors below `base`, calling `on_new`
/// for each directory right after creating it (before it has children).
pub(crate) fn create_dirs(
    base: &Path,
    rel: &Path,
    mut on_new: impl FnMut(&Path) -> Result<(), CgroupError>,
) -> Result<(), CgroupError> {
    let mut cur = base.to_path_buf();
    for comp in rel.components() {
        cur.push(comp);
        match fs::create_dir(&cur) {
            Ok(()) => on_new(&cur)?,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CgroupError::CreateDir { path: cur, source }),
        }
    }
    Ok(())
}
