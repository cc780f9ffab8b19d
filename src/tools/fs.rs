//! File tools confined to the workspace: `read_file`, `write_file`, `edit_file`, `list_dir`.
//!
//! A model names paths; nothing it names may reach outside the workspace —
//! not `/etc/passwd`, not `../x`, and not a symlink someone (or an earlier
//! command) planted inside the workspace pointing out of it. The confinement
//! is [`crate::workspace`] (the kernel resolves every path beneath a
//! descriptor of the root), shared with bramble's own reads and writes; this
//! file holds only the four tools over it. Symlinks that stay inside the
//! workspace are followed here ([`Workspace::new`]), as a model would expect.
//!
//! A leading `~/` means the workspace root (commands run with `HOME` set to
//! it), and an absolute path inside the workspace is accepted as relative.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::fstatat;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, BoxFuture, Tool, ToolContext, ToolError};
use crate::workspace::read_names;
pub use crate::workspace::{resolution, PathError, Resolution, Workspace};

/// Bytes of file content `read_file` returns at most.
const READ_CAP: usize = 128 * 1024;
/// Lines `read_file` returns when no `limit` is given.
const DEFAULT_LINES: u64 = 2000;
/// Bytes scanned past the shown window to count a file's lines.
const COUNT_SCAN_LIMIT: u64 = 64 * 1024 * 1024;
/// Largest file `edit_file` will load.
const EDIT_CAP: u64 = 4 * 1024 * 1024;
/// Entries `list_dir` shows at most.
const LIST_CAP: usize = 500;

impl From<PathError> for ToolError {
    fn from(e: PathError) -> Self {
        ToolError(e.to_string())
    }
}

/// Run blocking filesystem work off the async thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ToolError::new(format!("file operation failed: {e}")))?
}

/// The four file tools over one workspace.
pub fn fs_tools(workspace: &Path) -> Vec<Arc<dyn Tool>> {
    let ws = Workspace::new(workspace);
    vec![
        Arc::new(ReadFile { ws: ws.clone() }),
        Arc::new(WriteFile { ws: ws.clone() }),
        Arc::new(EditFile { ws: ws.clone() }),
        Arc::new(ListDir { ws }),
    ]
}

/// `read_file`: lines of a text file.
struct ReadFile {
    ws: Workspace,
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> &str {
        "Read a text file in the workspace. Returns up to `limit` lines (default 2000, at most 128 KiB) \
         starting at line `offset` (1-based); a header says which lines are shown when not all are."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)"},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return"}
            },
            "required": ["path"]
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: ReadArgs = parse_args("read_file", args)?;
            let ws = self.ws.clone();
            blocking(move || {
                let (file, _) = ws.open_regular(&a.path)?;
                let offset = a.offset.unwrap_or(1).max(1);
                let limit = a.limit.unwrap_or(DEFAULT_LINES).max(1);
                read_lines(file, offset, limit, &a.path)
            })
            .await
        })
    }
}

/// Lines `offset..offset+limit` of `file`, capped at [`READ_CAP`] bytes, with a
/// header when partial. Reads in chunks: a huge single line never grows memory.
fn read_lines(file: File, offset: u64, limit: u64, path: &str) -> Result<String, ToolError> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let io_err = |e: io::Error| ToolError::from(PathError::io(e, path));
    let end = offset.saturating_add(limit);
    let mut line = 1u64; // number of the line the next byte belongs to
    let mut out: Vec<u8> = Vec::new();
    let mut last_shown = 0u64;
    let mut capped = false;
    let mut cut_line = false;
    let mut at_line_start = true;
    let mut line_start = 0usize;
    let mut ends_with_newline = true;
    let mut scanned = 0u64;
    let mut complete = true;
    loop {
        let chunk = reader.fill_buf().map_err(io_err)?;
        if chunk.is_empty() {
            break;
        }
        if scanned == 0 && chunk[..chunk.len().min(8192)].contains(&0) {
            return Err(ToolError::new(format!(
                "{path} looks like a binary file (it contains NUL bytes); use exec with `file`, `xxd` or `strings` to inspect it"
            )));
        }
        let len = chunk.len();
        let mut i = 0;
        while i < len {
            let newline = chunk[i..].iter().position(|&b| b == b'\n');
            let stop = newline.map_or(len, |p| i + p + 1);
            if line >= offset && line < end && !capped {
                if at_line_start {
                    line_start = out.len();
                }
                let piece = &chunk[i..stop];
                let room = READ_CAP - out.len();
                if piece.len() <= room {
                    out.extend_from_slice(piece);
                    last_shown = line;
                } else if line_start == 0 {
                    // The first line alone is over the cap: show its head.
                    out.extend_from_slice(&piece[..room]);
                    last_shown = line;
                    cut_line = true;
                    capped = true;
                } else {
                    // Never end on half a line: drop the part of it already kept.
                    out.truncate(line_start);
                    last_shown = line - 1;
                    capped = true;
                }
            }
            at_line_start = newline.is_some();
            if at_line_start {
                line += 1;
            }
            i = stop;
        }
        ends_with_newline = chunk[len - 1] == b'\n';
        scanned += len as u64;
        reader.consume(len);
        if (capped || line >= end) && scanned > COUNT_SCAN_LIMIT {
            complete = false;
            break;
        }
    }
    if out.contains(&0) {
        return Err(ToolError::new(format!("{path} looks like a binary file (it contains NUL bytes)")));
    }
    let total = if ends_with_newline { line - 1 } else { line };
    if total == 0 {
        return Ok(format!("({path} is empty)"));
    }
    if offset > total {
        return Err(ToolError::new(format!("offset {offset} is past the end of {path} ({total} lines)")));
    }
    let text = String::from_utf8_lossy(&out);
    let total_text = if complete { total.to_string() } else { format!("more than {total}") };
    if offset == 1 && last_shown == total && complete && !capped {
        return Ok(text.into_owned());
    }
    let mut header = format!("[lines {offset}-{last_shown} of {total_text}");
    if cut_line {
        header.push_str(&format!("; line {last_shown} is longer than {} KiB and was cut", READ_CAP / 1024));
    } else if capped {
        header.push_str(&format!("; output capped at {} KiB", READ_CAP / 1024));
    }
    if last_shown < total || !complete {
        header.push_str(&format!("; use offset={} to continue", last_shown + 1));
    }
    header.push(']');
    Ok(format!("{header}\n{text}"))
}

/// `write_file`: create or replace a file.
struct WriteFile {
    ws: Workspace,
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

impl Tool for WriteFile {
    fn name(&self) -> &str {
        "write_file"
    }
    fn description(&self) -> &str {
        "Create or replace a file in the workspace with the given content. Missing parent directories are created."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "content": {"type": "string", "description": "The complete new content"}
            },
            "required": ["path", "content"]
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: WriteArgs = parse_args("write_file", args)?;
            let ws = self.ws.clone();
            blocking(move || {
                ws.write_atomic(&a.path, a.content.as_bytes())?;
                Ok(format!("Wrote {} bytes to {}", a.content.len(), a.path))
            })
            .await
        })
    }
}

/// `edit_file`: exact text replacement.
struct EditFile {
    ws: Workspace,
}

#[derive(Deserialize)]
struct EditArgs {
    path: String,
    old_text: String,
    new_text: String,
    #[serde(default)]
    replace_all: bool,
}

impl Tool for EditFile {
    fn name(&self) -> &str {
        "edit_file"
    }
    fn description(&self) -> &str {
        "Replace exact text in a workspace file. `old_text` must match exactly once (include enough \
         surrounding lines to make it unique), or set `replace_all` to replace every occurrence."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "old_text": {"type": "string", "description": "Exact text to find"},
                "new_text": {"type": "string", "description": "Replacement text"},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)"}
            },
            "required": ["path", "old_text", "new_text"]
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: EditArgs = parse_args("edit_file", args)?;
            let ws = self.ws.clone();
            blocking(move || {
                let data = ws.read_all(&a.path, EDIT_CAP)?;
                let text = String::from_utf8(data)
                    .map_err(|_| ToolError::new(format!("{} is not UTF-8 text; edit_file only edits text", a.path)))?;
                let (new, count) = apply_edit(&text, &a.old_text, &a.new_text, a.replace_all, &a.path)?;
                ws.write_atomic(&a.path, new.as_bytes())?;
                let plural = if count == 1 { "" } else { "s" };
                Ok(format!("Edited {}: replaced {count} occurrence{plural}", a.path))
            })
            .await
        })
    }
}

/// The edited text and the number of replacements, or why the edit is ambiguous or impossible.
fn apply_edit(text: &str, old: &str, new: &str, all: bool, path: &str) -> Result<(String, usize), ToolError> {
    if old.is_empty() {
        return Err(ToolError::new("old_text is empty; give the exact text to replace"));
    }
    let count = text.matches(old).count();
    match count {
        0 => {
            let mut msg = format!("old_text was not found in {path}");
            if squash_ws(text).contains(&squash_ws(old)) {
                msg.push_str(
                    "; it does match if whitespace is ignored: check indentation, tabs and line breaks \
                     (read_file shows the exact text)",
                );
            } else {
                msg.push_str("; read the file again and copy the text exactly");
            }
            Err(ToolError::new(msg))
        }
        n if n > 1 && !all => Err(ToolError::new(format!(
            "old_text matches {n} times in {path}; include more surrounding text to make it unique, \
             or set replace_all to true"
        ))),
        n if all => Ok((text.replace(old, new), n)),
        _ => Ok((text.replacen(old, new, 1), 1)),
    }
}

/// Collapse every run of whitespace to one space (for the "matches ignoring whitespace" hint).
fn squash_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `list_dir`: the entries of a directory.
struct ListDir {
    ws: Workspace,
}

#[derive(Deserialize)]
struct ListArgs {
    #[serde(default = "dot")]
    path: String,
}

fn dot() -> String {
    ".".to_string()
}

impl Tool for ListDir {
    fn name(&self) -> &str {
        "list_dir"
    }
    fn description(&self) -> &str {
        "List a directory in the workspace: names sorted, directories end with `/`, files show their size."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory, relative to the workspace (default: the workspace root)"}
            }
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: ListArgs = parse_args("list_dir", args)?;
            let ws = self.ws.clone();
            blocking(move || Ok(list(&ws, &a.path)?)).await
        })
    }
}

fn list(ws: &Workspace, path: &str) -> Result<String, PathError> {
    let fd = ws.open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    let stat_fd = fd.try_clone().map_err(|e| PathError::io(e, path))?;
    let names = read_names(fd).map_err(|e| PathError::from_errno(e, path))?;
    let mut entries: Vec<String> = Vec::new();
    for name in &names {
        let name = name.as_c_str();
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let shown = String::from_utf8_lossy(bytes);
        let line = match fstatat(&stat_fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => format!("{shown}/"),
                libc::S_IFREG => format!("{shown} ({})", human_size(st.st_size as u64)),
                libc::S_IFLNK => match readlinkat(&stat_fd, name) {
                    Ok(target) => format!("{shown} -> {}", target.to_string_lossy()),
                    Err(_) => format!("{shown} -> ?"),
                },
                _ => format!("{shown} (special file)"),
            },
            // Removed while listing.
            Err(_) => continue,
        };
        entries.push(line);
    }
    if entries.is_empty() {
        return Ok(format!("({path} is empty)"));
    }
    entries.sort();
    let total = entries.len();
    let mut out = entries.into_iter().take(LIST_CAP).collect::<Vec<_>>().join("\n");
    if total > LIST_CAP {
        out.push_str(&format!("\n... and {} more entries ({total} in total)", total - LIST_CAP));
    }
    Ok(out)
}

fn human_size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn read_lines_windows_and_headers() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, lines(340)).unwrap();
        let open = || File::open(&p).unwrap();
        let all = read_lines(open(), 1, 2000, "f").unwrap();
        assert_eq!(all, lines(340));
        let part = read_lines(open(), 1, 120, "f").unwrap();
        assert!(part.starts_with("[lines 1-120 of 340; use offset=121 to continue]\nline 1\n"), "{part}");
        assert!(part.ends_with("line 120\n"));
        let tail = read_lines(open(), 300, 2000, "f").unwrap();
        assert!(tail.starts_with("[lines 300-340 of 340]\nline 300\n"), "{tail}");
        let err = read_lines(open(), 341, 10, "f").unwrap_err();
        assert_eq!(err.0, "offset 341 is past the end of f (340 lines)");

        std::fs::write(&p, "no newline").unwrap();
        assert_eq!(read_lines(open(), 1, 10, "f").unwrap(), "no newline");
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_lines(open(), 1, 10, "f").unwrap(), "(f is empty)");
        std::fs::write(&p, b"ELF\0\x01\x02").unwrap();
        assert!(read_lines(open(), 1, 10, "f").unwrap_err().0.contains("binary file"));
    }

    #[test]
    fn read_lines_caps_bytes_even_for_one_huge_line() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("big");
        let mut data = "x".repeat(1 << 20);
        data.push_str("\nsecond\n");
        std::fs::write(&p, &data).unwrap();
        let out = read_lines(File::open(&p).unwrap(), 1, 2000, "big").unwrap();
        let (header, body) = out.split_once('\n').unwrap();
        assert_eq!(header, "[lines 1-1 of 2; line 1 is longer than 128 KiB and was cut; use offset=2 to continue]");
        assert_eq!(body.len(), READ_CAP);

        // Many lines: the cap falls on a line boundary.
        let line = format!("{}\n", "y".repeat(99));
        std::fs::write(&p, line.repeat(5000)).unwrap();
        let out = read_lines(File::open(&p).unwrap(), 1, 2000, "big").unwrap();
        let (header, body) = out.split_once('\n').unwrap();
        let shown = READ_CAP / 100;
        assert_eq!(
            header,
            format!("[lines 1-{shown} of 5000; output capped at 128 KiB; use offset={} to continue]", shown + 1)
        );
        assert_eq!(body, line.repeat(shown));
    }

    #[test]
    fn edit_rules() {
        let text = "fn a() {\n    one();\n}\nfn b() {\n    one();\n}\n";
        let err = apply_edit(text, "two()", "x", false, "f.rs").unwrap_err();
        assert!(err.0.starts_with("old_text was not found in f.rs; read the file again"), "{}", err.0);
        let err = apply_edit(text, "fn a() {\none();", "x", false, "f.rs").unwrap_err();
        assert!(err.0.contains("it does match if whitespace is ignored"), "{}", err.0);
        let err = apply_edit(text, "one();", "two();", false, "f.rs").unwrap_err();
        assert!(err.0.contains("matches 2 times in f.rs"), "{}", err.0);
        let (new, n) = apply_edit(text, "one();", "two();", true, "f.rs").unwrap();
        assert_eq!((new.matches("two();").count(), n), (2, 2));
        let (new, n) = apply_edit(text, "fn b() {\n    one();", "fn b() {\n    three();", false, "f.rs").unwrap();
        assert_eq!(n, 1);
        assert!(new.contains("three();") && new.contains("one();"));
        assert!(apply_edit(text, "", "x", false, "f.rs").is_err());
    }

    #[test]
    fn sizes_are_readable() {
        assert_eq!(human_size(12), "12 bytes");
        assert_eq!(human_size(2048), "2.0 KiB");
        assert_eq!(human_size(3 << 20), "3.0 MiB");
    }
}
