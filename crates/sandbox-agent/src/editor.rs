//! `POST /v1/file/str_replace_editor`: the Anthropic-style editor tool.
//!
//! `str_replace` (replace_mode FIRST / ALL / LAST, or unset = old_str must be
//! unique; old_str absent is an error), `create`, `insert`, `view` (files
//! with `cat -n` numbering and `view_range`; directories two levels deep)
//! and `undo_edit` (in-memory history of this agent's edits).
//!
//! Owns: the edit semantics and history. File I/O goes through `files`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::files::{read_text, write_bytes, FileError};
use super::paths::PathBase;

pub use sandbox_abi::agent_api::{EditorRequest, EditorResult};

/// Lines of context shown around an edit.
const SNIPPET_CONTEXT: usize = 4;

/// Which occurrences `str_replace` replaces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReplaceMode {
    Unique,
    First,
    Last,
    All,
}

impl ReplaceMode {
    pub fn parse(raw: Option<&str>) -> Self {
        match raw.map(str::to_ascii_uppercase).as_deref() {
            Some("FIRST") => Self::First,
            Some("LAST") => Self::Last,
            Some("ALL") => Self::All,
            _ => Self::Unique,
        }
    }
}

/// Replaces `old` in `text`; returns the new text and the byte offset of
/// the first replacement.
pub fn replace(
    text: &str,
    old: &str,
    new: &str,
    mode: ReplaceMode,
    path: &Path,
) -> Result<(String, usize), FileError> {
    let count = if old.is_empty() {
        0
    } else {
        text.matches(old).count()
    };
    if count == 0 {
        return Err(FileError::OldStrNotFound {
            old: old.to_owned(),
            path: path.to_path_buf(),
        });
    }
    let at = match mode {
        ReplaceMode::Unique if count > 1 => {
            return Err(FileError::OldStrNotUnique {
                old: old.to_owned(),
                count,
                path: path.to_path_buf(),
            })
        }
        ReplaceMode::All => return Ok((text.replace(old, new), text.find(old).unwrap_or(0))),
        ReplaceMode::Last => text.rfind(old),
        ReplaceMode::Unique | ReplaceMode::First => text.find(old),
    }
    .unwrap_or(0);
    let mut out = String::with_capacity(text.len() + new.len());
    out.push_str(&text[..at]);
    out.push_str(new);
    out.push_str(&text[at + old.len()..]);
    Ok((out, at))
}

/// `cat -n` style numbering of `lines`, the first numbered `first` (1-based).
fn numbered<'a>(lines: impl Iterator<Item = &'a str>, first: usize) -> String {
    lines
        .enumerate()
        .map(|(i, l)| format!("{:6}\t{}\n", i + first, l))
        .collect()
}

/// Numbered lines around byte offset `at` of `text`, spanning `new_lines`.
fn snippet(text: &str, at: usize, new_lines: usize) -> String {
    let line = text[..at.min(text.len())].matches('\n').count();
    let start = line.saturating_sub(SNIPPET_CONTEXT);
    let take = line + new_lines + SNIPPET_CONTEXT + 1 - start;
    numbered(text.lines().skip(start).take(take), start + 1)
}

/// The editor with its undo history.
#[derive(Debug, Default)]
pub struct Editor {
    history: Mutex<HashMap<PathBuf, Vec<String>>>,
}

impl Editor {
    fn remember(&self, path: &Path, previous: String) {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let entry = h.entry(path.to_path_buf()).or_default();
        entry.push(previous);
        if entry.len() > 10 {
            entry.remove(0);
        }
    }

    pub fn run(&self, base: &PathBase, req: EditorRequest) -> Result<EditorResult, FileError> {
        let path = base.resolve(&req.path);
        let shown = path.display().to_string();
        let prev_exist = path.exists();
        let missing = |field| FileError::MissingField {
            field,
            command: req.command.clone(),
        };
        let output = match req.command.as_str() {
            "str_replace" => {
                let old = req.old_str.as_deref().ok_or_else(|| missing("old_str"))?;
                let new = req.new_str.as_deref().unwrap_or("");
                let text = read_text(&path)?;
                let mode = ReplaceMode::parse(req.replace_mode.as_deref());
                let (edited, at) = replace(&text, old, new, mode, &path)?;
                write_bytes(&path, edited.as_bytes(), false)?;
                let snip = snippet(&edited, at, new.matches('\n').count());
                self.remember(&path, text);
                format!("The file {shown} has been edited. Here's the result of running `cat -n` on a snippet of {shown}:\n{snip}Review the changes and make sure they are as expected. Edit the file again if necessary.")
            }
            "create" => {
                let body = req
                    .file_text
                    .as_deref()
                    .ok_or_else(|| missing("file_text"))?;
                if let Ok(previous) = read_text(&path) {
                    self.remember(&path, previous);
                }
                write_bytes(&path, body.as_bytes(), false)?;
                format!("File created successfully at: {shown}")
            }
            "insert" => {
                let line = req.insert_line.ok_or_else(|| missing("insert_line"))?;
                let new = req.new_str.as_deref().ok_or_else(|| missing("new_str"))?;
                let text = read_text(&path)?;
                let edited = insert_after(&text, line, new, &path)?;
                write_bytes(&path, edited.as_bytes(), false)?;
                self.remember(&path, text);
                let at = edited
                    .lines()
                    .take(line as usize)
                    .map(|l| l.len() + 1)
                    .sum::<usize>();
                let snip = snippet(&edited, at, new.matches('\n').count());
                format!("The file {shown} has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n{snip}Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary.")
            }
            "view" => view(&path, req.view_range.as_deref())?,
            "undo_edit" => {
                let previous = {
                    let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
                    h.get_mut(&path).and_then(Vec::pop)
                };
                let previous = previous.ok_or(FileError::NoHistory { path: path.clone() })?;
                write_bytes(&path, previous.as_bytes(), false)?;
                format!(
                    "Last edit to {shown} undone successfully.\n{}",
                    numbered(previous.lines(), 1)
                )
            }
            other => {
                return Err(FileError::UnsupportedCommand {
                    command: other.to_owned(),
                })
            }
        };
        Ok(EditorResult {
            output,
            path: shown,
            prev_exist,
        })
    }
}

/// Inserts `new` after line `line` (0 = at the top).
fn insert_after(text: &str, line: i64, new: &str, path: &Path) -> Result<String, FileError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    if line < 0 || line as usize > lines.len() {
        return Err(FileError::InvalidLine {
            line,
            lines: lines.len(),
            path: path.to_path_buf(),
        });
    }
    let mut out = String::with_capacity(text.len() + new.len() + 2);
    for l in &lines[..line as usize] {
        out.push_str(l);
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(new);
    if !new.ends_with('\n') {
        out.push('\n');
    }
    for l in &lines[line as usize..] {
        out.push_str(l);
    }
    Ok(out)
}

fn view(path: &Path, range: Option<&[i64]>) -> Result<String, FileError> {
    if path.is_dir() {
        let mut entries = Vec::new();
        collect_tree(path, 2, &mut entries);
        entries.sort();
        return Ok(format!(
            "Here's the files and directories up to 2 levels deep in {}, excluding hidden items:\n{}\n",
            path.display(),
            entries.join("\n")
        ));
    }
    let text = read_text(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let (first, last) = match range {
        Some([a, b, ..]) => (
            *a.max(&1) as usize,
            if *b < 0 { lines.len() } else { *b as usize },
        ),
        Some([a]) => (*a.max(&1) as usize, lines.len()),
        _ => (1, lines.len()),
    };
    let last = last.min(lines.len());
    let body = if first > last {
        String::new()
    } else {
        numbered(lines[first - 1..last].iter().copied(), first)
    };
    Ok(format!(
        "Here's the result of running `cat -n` on {}:\n{body}",
        path.display()
    ))
}

fn collect_tree(dir: &Path, depth: usize, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let p = entry.path();
        out.push(p.display().to_string());
        if depth > 1 && p.is_dir() {
            collect_tree(&p, depth - 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> PathBuf {
        PathBuf::from("/f")
    }

    #[test]
    fn replace_modes() {
        let t = "a x b x c";
        assert_eq!(
            replace(t, "x", "Y", ReplaceMode::First, &p()).unwrap().0,
            "a Y b x c"
        );
        assert_eq!(
            replace(t, "x", "Y", ReplaceMode::Last, &p()).unwrap().0,
            "a x b Y c"
        );
        assert_eq!(
            replace(t, "x", "Y", ReplaceMode::All, &p()).unwrap().0,
            "a Y b Y c"
        );
        assert!(matches!(
            replace(t, "x", "Y", ReplaceMode::Unique, &p()),
            Err(FileError::OldStrNotUnique { count: 2, .. })
        ));
        assert_eq!(
            replace(t, "b", "", ReplaceMode::Unique, &p()).unwrap(),
            ("a x  x c".into(), 4)
        );
        assert!(matches!(
            replace(t, "zz", "Y", ReplaceMode::All, &p()),
            Err(FileError::OldStrNotFound { .. })
        ));
        assert!(replace(t, "", "Y", ReplaceMode::All, &p()).is_err());
        assert_eq!(ReplaceMode::parse(Some("all")), ReplaceMode::All);
        assert_eq!(ReplaceMode::parse(None), ReplaceMode::Unique);
    }

    #[test]
    fn insert_after_lines() {
        assert_eq!(insert_after("a\nb\n", 1, "X", &p()).unwrap(), "a\nX\nb\n");
        assert_eq!(insert_after("a\nb", 0, "X\n", &p()).unwrap(), "X\na\nb");
        assert_eq!(insert_after("a\nb", 2, "X", &p()).unwrap(), "a\nb\nX\n");
        assert!(insert_after("a", 5, "X", &p()).is_err());
    }

    #[test]
    fn editor_round_trip_with_undo() {
        let dir = tempfile::tempdir().unwrap();
        let base = PathBase {
            cwd: dir.path().to_path_buf(),
            home: dir.path().to_path_buf(),
        };
        std::fs::write(dir.path().join("f.txt"), "one\ntwo\n").unwrap();
        let ed = Editor::default();
        let req = |command: &str, old: Option<&str>, new: Option<&str>| EditorRequest {
            command: command.into(),
            path: "f.txt".into(),
            file_text: None,
            old_str: old.map(Into::into),
            new_str: new.map(Into::into),
            insert_line: None,
            view_range: None,
            replace_mode: None,
        };
        let r = ed
            .run(&base, req("str_replace", Some("two"), Some("2")))
            .unwrap();
        assert!(
            r.prev_exist && r.output.contains("     2\t2"),
            "{}",
            r.output
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f.txt")).unwrap(),
            "one\n2\n"
        );
        ed.run(&base, req("undo_edit", None, None)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f.txt")).unwrap(),
            "one\ntwo\n"
        );
        assert!(ed
            .run(&base, req("str_replace", Some("nope"), Some("")))
            .is_err());
        assert!(ed.run(&base, req("explode", None, None)).is_err());
    }
}
