//! Files that come in: an `image`, `file`, `audio` or `media` message's
//! resource, fetched with "Get resources in a message" (`GET
//! /open-apis/im/v1/messages/{message_id}/resources/{key}?type=image|file`,
//! the platform serves up to 100 MB) within a cap of ours, and kept in the
//! workspace inbox like every channel's ([`crate::channels::inbox`]).
//!
//! The message's `content` (a JSON string) names the key: `image_key` for an
//! image; `file_key` (and `file_name`) for a file, an audio clip (opus) or a
//! video. A sticker, a card or a merged forward has no resource the API
//! serves: [`FileInError::NotAFile`]. The event handler calls
//! [`super::Feishu::fetch_file`] for
//! a message of an allowed user and hands the [`Attachment`] to the turn;
//! a file that cannot be taken is told to the chat instead.

use serde_json::Value;

use crate::bus::{Attachment, AttachmentKind};
use crate::clients::feishu::FeishuError;

/// Why a file that came in was not taken.
#[derive(Debug, thiserror::Error)]
pub enum FileInError {
    #[error("a `{0}` message carries no file bramble can fetch")]
    NotAFile(String),
    #[error("it is larger than {0} MB")]
    TooLarge(u64),
    #[error("cannot fetch it: {0}")]
    Fetch(FeishuError),
    #[error("cannot save it in the workspace inbox: {0}")]
    Save(#[from] crate::channels::inbox::SaveError),
}

/// What a message of `message_type` with `content` carries: (key, is an image, file name).
pub fn resource(message_type: &str, content: &str) -> Result<(String, bool, String), FileInError> {
    let v: Value = serde_json::from_str(content).unwrap_or_default();
    let key = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let not_a_file = || FileInError::NotAFile(message_type.chars().take(32).collect());
    match message_type {
        "image" => key("image_key").map(|k| (k, true, "image.jpg".to_string())).ok_or_else(not_a_file),
        "file" | "audio" | "media" => {
            let k = key("file_key").ok_or_else(not_a_file)?;
            let fallback = match message_type {
                "audio" => "voice.opus",
                "media" => "video.mp4",
                _ => "file",
            };
            Ok((k, false, key("file_name").unwrap_or_else(|| fallback.to_string())))
        }
        _ => Err(not_a_file()),
    }
}

impl super::Feishu {
    /// The file of message `message_id` (its type and content as the event
    /// has them), at most `cap_mb` MB, saved to `inbox/<day>/`.
    pub async fn fetch_file(
        &self,
        message_id: &str,
        message_type: &str,
        content: &str,
        cap_mb: u64,
    ) -> Result<Attachment, FileInError> {
        fetch(&self.shared, message_id, message_type, content, cap_mb).await
    }
}

async fn fetch(
    shared: &super::Shared,
    message_id: &str,
    message_type: &str,
    content: &str,
    cap_mb: u64,
) -> Result<Attachment, FileInError> {
    let (key, image, name) = resource(message_type, content)?;
    let cap = usize::try_from(cap_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX);
    let (data, ctype) = match shared.client.resource(message_id, &key, image, cap).await {
        Ok(got) => got,
        Err(FeishuError::TooLarge { .. }) => return Err(FileInError::TooLarge(cap_mb)),
        Err(e) => return Err(FileInError::Fetch(e)),
    };
    let name = crate::channels::inbox::safe_name(&name);
    let mime = ctype
        .as_deref()
        .and_then(|t| t.split(';').next())
        .map(str::trim)
        .filter(|t| !t.is_empty() && *t != "application/octet-stream")
        .unwrap_or_else(|| crate::channels::inbox::mime_of(&name))
        .to_string();
    let kind = if image || mime.starts_with("image/") { AttachmentKind::Image } else { AttachmentKind::File };
    let (ws, size) = (shared.workspace.clone(), data.len() as u64);
    let path = crate::util::tasks::blocking(move || crate::channels::inbox::save_new(&ws, &name, &data)).await?;
    tracing::info!(path, size, "Feishu / Lark file saved to the inbox");
    Ok(Attachment { kind, path, mime, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_read_from_each_kind_of_message() {
        let (k, image, _) = resource("image", r#"{"image_key":"img_v3_1"}"#).unwrap();
        assert_eq!((k.as_str(), image), ("img_v3_1", true));
        let (k, image, name) = resource("file", r#"{"file_key":"file_v3_1","file_name":"a.pdf"}"#).unwrap();
        assert_eq!((k.as_str(), image, name.as_str()), ("file_v3_1", false, "a.pdf"));
        assert_eq!(resource("audio", r#"{"file_key":"f","duration":2000}"#).unwrap().2, "voice.opus");
        assert!(matches!(resource("sticker", r#"{"file_key":"f"}"#), Err(FileInError::NotAFile(_))));
        assert!(matches!(resource("image", "not json"), Err(FileInError::NotAFile(_))));
        assert!(matches!(resource("file", r#"{"file_key":""}"#), Err(FileInError::NotAFile(_))));
    }
}
