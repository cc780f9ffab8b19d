//! Files that come with Telegram messages: voice notes, audio, round video
//! notes, photos and documents, saved to the workspace's `inbox/<date>/`.
//!
//! The poller saves a message's file *before* it confirms the update to
//! Telegram (the offset), like every message: a crash or a torn download
//! means Telegram sends the update again, never that the file is lost. A
//! failure that waiting will not mend (a 25 MB file: bots may download 20 MB)
//! is answered at once and the update confirmed; a network failure leaves the
//! update unconfirmed for the next poll, and after [`MAX_TRIES`] the user is
//! told instead of the bot being stuck on it.
//!
//! Names are made safe (`[A-Za-z0-9._-]`, no leading dot, at most 80
//! characters) and never overwrite: `report.pdf`, then `report-1.pdf`, …
//! Writing goes through [`Workspace::strict`]: the inbox may have been
//! tampered with by a command (a symlinked `inbox/` pointing at `/etc`), and a
//! write never follows a link.
// Without the `telegram-media` feature (the slim build) files are refused with
// a reply; the downloading code is left for the linker to drop.
#![cfg_attr(not(feature = "telegram-media"), allow(dead_code, unused_imports))]

use crate::bus::{Attachment, AttachmentKind};
use crate::channels::inbox::{safe_name, save_new};
use crate::workspace::Workspace;

use crate::clients::telegram::{Api, ApiError, FileRef, Message, MAX_DOWNLOAD};

/// The reply to a file, and the note for an attachment, in a build without `telegram-media`.
pub const NO_MEDIA: &str = "this bramble is the slim build: it takes and sends text only, not photos, voice notes \
                            or files (cargo feature `telegram-media`); send the text instead";

/// Downloads of one update tried this often before the user is told.
pub const MAX_TRIES: u32 = 3;
/// A document whose type is one of these (and small enough) is also shown to the model as an image.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/webp", "image/gif"];

/// What became of a message's file.
#[derive(Debug)]
pub enum Fetched {
    /// Saved; the turn gets it.
    Saved(Attachment),
    /// It will not work however often it is tried: this is the reply.
    Refused(String),
    /// It may work later (network, Telegram's 5xx): the update is not confirmed.
    Later(String),
}

/// Where files go and how large they may be.
#[derive(Clone)]
pub struct Inbox {
    workspace: Workspace,
    max_bytes: u64,
    max_image_px: u32,
}

/// The file of a message, and what it is.
struct Wanted<'a> {
    file: &'a FileRef,
    kind: AttachmentKind,
    mime: String,
    name: String,
}

impl Inbox {
    pub fn new(workspace: &std::path::Path, max_file_mb: u64, max_image_px: u32) -> Inbox {
        Inbox {
            workspace: Workspace::strict(workspace),
            max_bytes: max_file_mb.saturating_mul(1024 * 1024).min(MAX_DOWNLOAD),
            max_image_px: max_image_px.max(64),
        }
    }

    /// Whether the message carries a file bramble takes.
    pub fn has_file(m: &Message) -> bool {
        m.voice.is_some() || m.audio.is_some() || m.video_note.is_some() || !m.photo.is_empty() || m.document.is_some()
    }

    /// Download the message's file into the inbox.
    #[cfg(feature = "telegram-media")]
    pub async fn fetch(&self, api: &Api, m: &Message) -> Option<Fetched> {
        let wanted = self.wanted(m)?;
        Some(self.fetch_one(api, wanted).await)
    }

    /// The slim build takes no files: the sender is told so, and the update is done.
    #[cfg(not(feature = "telegram-media"))]
    pub async fn fetch(&self, _: &Api, _: &Message) -> Option<Fetched> {
        Some(Fetched::Refused(NO_MEDIA.to_string()))
    }

    async fn fetch_one(&self, api: &Api, w: Wanted<'_>) -> Fetched {
        let too_big = |size: u64| {
            Fetched::Refused(format!(
                "That file is {}; I can take files up to {} (bots may download at most 20 MB from Telegram).",
                crate::bus::human_size(size),
                crate::bus::human_size(self.max_bytes)
            ))
        };
        if let Some(size) = w.file.file_size.filter(|s| *s > self.max_bytes) {
            return too_big(size);
        }
        let file = match api.get_file(&w.file.file_id).await {
            Ok(f) => f,
            Err(e) if e.code() == Some(400) && e.to_string().contains("too big") => {
                return too_big(w.file.file_size.unwrap_or(MAX_DOWNLOAD + 1))
            }
            Err(e) => return failed(e),
        };
        let Some(path) = file.file_path else {
            return too_big(file.file_size.or(w.file.file_size).unwrap_or(MAX_DOWNLOAD + 1));
        };
        let data = match api.download(&path, self.max_bytes).await {
            Ok(d) => d,
            Err(e) if e.code() == Some(413) => return too_big(self.max_bytes + 1),
            Err(e) => return failed(e),
        };
        let size = data.len() as u64;
        let (ws, name) = (self.workspace.clone(), w.name);
        let saved = crate::util::tasks::blocking(move || save_new(&ws, &name, &data)).await;
        match saved {
            Ok(path) => {
                let kind = match w.kind {
                    AttachmentKind::File if IMAGE_TYPES.contains(&w.mime.as_str()) => AttachmentKind::Image,
                    k => k,
                };
                Fetched::Saved(Attachment { kind, path, mime: w.mime, size })
            }
            // A full or read-only disk may clear up; the update stays unconfirmed.
            Err(e) => Fetched::Later(format!("cannot save the file in the workspace inbox: {e}")),
        }
    }

    /// The one file of `m` bramble takes, its kind and the name it gets.
    fn wanted<'a>(&self, m: &'a Message) -> Option<Wanted<'a>> {
        let id = m.message_id;
        let mime = |f: &FileRef, default: &str| f.mime_type.clone().unwrap_or_else(|| default.to_string());
        let seconds = |f: &FileRef| AttachmentKind::Voice { seconds: f.duration.unwrap_or(0) };
        if let Some(f) = &m.voice {
            return Some(Wanted {
                file: f,
                kind: seconds(f),
                mime: mime(f, "audio/ogg"),
                name: format!("voice-{id}.ogg"),
            });
        }
        if let Some(f) = &m.video_note {
            return Some(Wanted {
                file: f,
                kind: seconds(f),
                mime: mime(f, "video/mp4"),
                name: format!("video-note-{id}.mp4"),
            });
        }
        if let Some(f) = &m.audio {
            let name = f.file_name.as_deref().map(safe_name).unwrap_or_else(|| format!("audio-{id}.mp3"));
            return Some(Wanted { file: f, kind: seconds(f), mime: mime(f, "audio/mpeg"), name });
        }
        if !m.photo.is_empty() {
            let f = pick_photo(&m.photo, self.max_image_px)?;
            return Some(Wanted {
                file: f,
                kind: AttachmentKind::Image,
                mime: "image/jpeg".into(),
                name: format!("photo-{id}.jpg"),
            });
        }
        let f = m.document.as_ref()?;
        let name = f.file_name.as_deref().map(safe_name).unwrap_or_else(|| format!("file-{id}"));
        Some(Wanted { file: f, kind: AttachmentKind::File, mime: mime(f, "application/octet-stream"), name })
    }
}

/// A failed call, sorted: Telegram's 4xx will not change; the rest may.
fn failed(e: ApiError) -> Fetched {
    match e.code() {
        Some(code) if (400..500).contains(&code) && code != 429 && !e.is_unauthorized() => {
            Fetched::Refused(format!("I could not get that file from Telegram: {e}"))
        }
        _ => Fetched::Later(e.to_string()),
    }
}

/// The largest photo size whose longer side fits `max_px` (the smallest if none does).
pub fn pick_photo(sizes: &[FileRef], max_px: u32) -> Option<&FileRef> {
    let side = |f: &FileRef| f.width.unwrap_or(0).max(f.height.unwrap_or(0));
    sizes.iter().filter(|f| side(f) <= max_px).max_by_key(|f| side(f)).or_else(|| sizes.iter().min_by_key(|f| side(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_photo_within_the_limit_is_taken() {
        let size =
            |id: &str, w, h| FileRef { file_id: id.into(), width: Some(w), height: Some(h), ..Default::default() };
        let sizes = [size("s", 90, 67), size("m", 320, 240), size("l", 1280, 960), size("xl", 2560, 1920)];
        assert_eq!(pick_photo(&sizes, 1280).unwrap().file_id, "l");
        assert_eq!(pick_photo(&sizes, 800).unwrap().file_id, "m");
        assert_eq!(pick_photo(&sizes, 10).unwrap().file_id, "s", "none fits: the smallest");
        assert!(pick_photo(&[], 1280).is_none());
    }
}
