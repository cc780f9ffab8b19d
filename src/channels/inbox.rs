//! The inbox: where files that come with a message are kept, for every
//! channel (Telegram, Matrix, email). One naming rule and one no-overwrite
//! writer, so a file from any channel lands the same way: under
//! `inbox/<day>/` in the workspace, with a safe name, never replacing
//! another file and never written through a link.

use crate::workspace::Workspace;

/// A file name safe in the inbox: `[A-Za-z0-9._-]`, no leading dot, at most 80 characters (the extension kept).
pub fn safe_name(raw: &str) -> String {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or(raw);
    let mut name: String =
        base.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    while name.starts_with('.') {
        name.remove(0);
    }
    if name.chars().count() > 80 {
        let ext = name.rsplit_once('.').map(|(_, e)| e).filter(|e| e.len() <= 10).unwrap_or("").to_string();
        let keep = 80 - ext.len().min(10) - 1;
        name = format!("{}.{ext}", &name[..keep]).trim_end_matches('.').to_string();
    }
    if name.is_empty() || name.chars().all(|c| c == '_' || c == '.') {
        return "file".into();
    }
    name
}

/// Write `data` as `inbox/<today>/<name>` without replacing anything: the
/// first free of `name`, `stem-1.ext`, `stem-2.ext`, … Returns the path written.
pub fn save_new(ws: &Workspace, name: &str, data: &[u8]) -> Result<String, SaveError> {
    let day = jiff::Zoned::now().date();
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s, format!(".{e}")),
        _ => (name, String::new()),
    };
    for n in 0..100 {
        let file = if n == 0 { name.to_string() } else { format!("{stem}-{n}{ext}") };
        let path = format!("inbox/{day}/{file}");
        match ws.write_new(&path, data) {
            Ok(true) => return Ok(path),
            Ok(false) => continue,
            Err(e) => return Err(SaveError::Write(e)),
        }
    }
    Err(SaveError::Crowded { name: name.to_string(), day: day.to_string() })
}

/// Why a file that came with a message was not saved in the inbox.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error(transparent)]
    Write(crate::workspace::PathError),
    #[error("100 files named like {name} are already in inbox/{day}")]
    Crowded { name: String, day: String },
}

/// The content type of a file by its extension, for the chat apps that ask
/// for one with an upload (Telegram looks at the bytes itself).
pub fn mime_of(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "pdf" => "application/pdf",
        "txt" | "md" | "log" => "text/plain",
        "csv" => "text/csv",
        "json" => "application/json",
        "zip" => "application/zip",
        "ogg" | "oga" => "audio/ogg",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        _ => "application/octet-stream",
    }
}

/// Put `msg` on the agent's queue, waiting at most `wait` for room and never
/// past `stop`: whether it is on. A reader that gets `false` leaves its
/// position where it was, so the message comes again.
pub async fn hand_over(
    inbound: &tokio::sync::mpsc::Sender<crate::bus::InboundMessage>,
    msg: crate::bus::InboundMessage,
    wait: std::time::Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> bool {
    tokio::select! {
        r = tokio::time::timeout(wait, inbound.send(msg)) => matches!(r, Ok(Ok(()))),
        _ = stop.cancelled() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_safe() {
        assert_eq!(safe_name("report.pdf"), "report.pdf");
        assert_eq!(safe_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_name(".bashrc"), "bashrc");
        assert_eq!(safe_name("Ü bër näme (1).txt"), "__b_r_n_me__1_.txt");
        assert_eq!(safe_name("..."), "file");
        assert_eq!(safe_name(""), "file");
        let long = format!("{}.pdf", "a".repeat(200));
        let cut = safe_name(&long);
        assert!(cut.len() <= 80 && cut.ends_with(".pdf"), "{cut}");
    }

    #[test]
    fn files_are_never_overwritten_nor_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::strict(dir.path());
        let a = save_new(&ws, "r.pdf", b"one").unwrap();
        let b = save_new(&ws, "r.pdf", b"two").unwrap();
        assert!(a.ends_with("/r.pdf") && b.ends_with("/r-1.pdf"), "{a} {b}");
        assert_eq!(std::fs::read(dir.path().join(&a)).unwrap(), b"one");
        assert_eq!(std::fs::read(dir.path().join(&b)).unwrap(), b"two");
        // An inbox that a command replaced with a link out of the workspace.
        let other = tempfile::tempdir().unwrap();
        let evil = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path(), evil.path().join("inbox")).unwrap();
        assert!(save_new(&Workspace::strict(evil.path()), "x.txt", b"x").is_err());
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0, "nothing written through the link");
    }
}
