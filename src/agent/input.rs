//! What came with a message, made ready for the model: voice notes become
//! their transcript, photos image parts, documents a path the model can read.
//!
//! Nothing here ever hands the model a placeholder. A voice note that cannot
//! be transcribed (no `[transcription]`, a note over `max_duration`, the
//! server failing) ends the turn with one answer that says why and where the
//! audio was kept ([`TurnError::Input`]); the model is not asked to answer
//! "[voice]". The session stores text only: the transcript, marked as one,
//! and references to inbox files (`[image: inbox/…]`), never base64, so
//! session files stay small and history replays as text.
//!
//! Runs inside the turn, under its session's lock: a voice note and the text
//! sent after it are answered in the order they came, and `/stop` cancels a
//! transcription like any other step.

use super::{Agent, TurnError, TurnRequest};
use crate::bus::{Attachment, AttachmentKind};
use crate::provider::{Image, ProviderError};

/// The largest voice file read for transcription (Telegram's own download limit is 20 MB).
const MAX_AUDIO_BYTES: u64 = 25 * 1024 * 1024;
/// The largest image sent to a model (Anthropic's per-image limit); bigger
/// ones are named by path only.
const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// A turn's user message, ready: its text and the images that go with it.
#[derive(Debug, Default)]
pub(super) struct Input {
    pub text: String,
    pub images: Vec<Image>,
    /// Images were left out because the model cannot see them.
    pub blind: bool,
}

impl Input {
    /// Leave the images out (the text still names their files).
    pub fn drop_images(&mut self) {
        if !self.images.is_empty() {
            self.images.clear();
            self.blind = true;
        }
    }
}

/// The message's text with a reference to each attachment before it: what a
/// pending record keeps, so a crash loses neither.
pub fn with_references(text: &str, attachments: &[Attachment]) -> String {
    let mut parts: Vec<String> = attachments.iter().map(Attachment::reference).collect();
    if !text.trim().is_empty() {
        parts.push(text.to_string());
    }
    parts.join("\n")
}

/// Whether a provider's refusal is about the image parts (a text-only model
/// behind an OpenAI-compatible server, a llama.cpp server without a
/// projector): then the turn is asked again without them.
pub(super) fn refused_images(e: &ProviderError) -> bool {
    let ProviderError::Http { status, message, .. } = e else { return false };
    if *status == 429 || !(400..600).contains(status) {
        return false;
    }
    let m = message.to_ascii_lowercase();
    ["image", "vision", "multimodal", "mmproj", "content must be a string", "expected string"]
        .iter()
        .any(|needle| m.contains(needle))
}

impl Agent {
    /// Turn `req`'s text and attachments into the user message.
    pub(super) async fn prepare_input(&self, req: &TurnRequest) -> Result<Input, TurnError> {
        if req.attachments.is_empty() {
            return Ok(Input { text: req.text.clone(), ..Input::default() });
        }
        let mut input = Input::default();
        let mut parts = Vec::new();
        for a in &req.attachments {
            match a.kind {
                AttachmentKind::Voice { seconds } => parts.push(self.transcribe(a, seconds).await?),
                AttachmentKind::Image => {
                    if a.size <= MAX_IMAGE_BYTES {
                        match self.read_inbox(&a.path, MAX_IMAGE_BYTES).await {
                            Ok(bytes) => input.images.push(Image::new(image_mime(&a.mime), &bytes)),
                            Err(e) => tracing::warn!(path = %a.path, "an image for the model cannot be read: {e}"),
                        }
                    }
                    parts.push(a.reference());
                }
                AttachmentKind::File => parts.push(a.reference()),
            }
        }
        if !req.text.trim().is_empty() {
            parts.push(req.text.clone());
        }
        input.text = parts.join("\n");
        Ok(input)
    }

    /// A voice note's transcript, marked as one; or the answer that says why not.
    async fn transcribe(&self, a: &Attachment, seconds: u64) -> Result<String, TurnError> {
        let kept = format!("The audio is kept at {}.", a.path);
        let t = match &self.transcriber {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Err(TurnError::Input(format!(
                    "I got your voice note, but voice transcription is not set up ([transcription] in the config), \
                     so I cannot listen to it. {kept}"
                )))
            }
            Err(why) => return Err(TurnError::Input(format!("I cannot transcribe voice notes: {why}. {kept}"))),
        };
        let max = t.max_duration().as_secs();
        if seconds > max {
            return Err(TurnError::Input(format!(
                "Your voice note is {} long; I transcribe notes up to {} ([transcription] max_duration). {kept}",
                clock(seconds),
                clock(max)
            )));
        }
        let audio = self
            .read_inbox(&a.path, MAX_AUDIO_BYTES)
            .await
            .map_err(|e| TurnError::Input(format!("I cannot read your voice note: {e}. {kept}")))?;
        let name = a.path.rsplit('/').next().unwrap_or("voice.ogg");
        let started = std::time::Instant::now();
        let text = t
            .transcribe(name, &a.mime, &audio)
            .await
            .map_err(|e| TurnError::Input(format!("I could not transcribe your voice note: {e}. {kept}")))?;
        tracing::info!(path = %a.path, seconds, chars = text.chars().count(), took_ms = started.elapsed().as_millis() as u64, "voice note transcribed");
        Ok(format!("[voice note {}, transcribed; audio at {}]\n{text}", clock(seconds), a.path))
    }

    /// A file of the workspace inbox, read safely (no links, regular files only), off the runtime thread.
    async fn read_inbox(&self, path: &str, cap: u64) -> Result<Vec<u8>, crate::workspace::PathError> {
        let ws = crate::workspace::Workspace::strict(self.context.workspace());
        let path = path.to_string();
        crate::util::tasks::blocking(move || ws.read_all(&path, cap)).await
    }
}

/// `m:ss`.
fn clock(seconds: u64) -> String {
    format!("{}:{:02}", seconds / 60, seconds % 60)
}

/// The image types vision APIs take; anything else is sent as JPEG's type
/// (Telegram's photos are JPEG).
fn image_mime(mime: &str) -> &str {
    match mime {
        "image/png" | "image/gif" | "image/webp" | "image/jpeg" => mime,
        _ => "image/jpeg",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_come_first_and_the_caption_last() {
        let a = |kind, path: &str, size| Attachment { kind, path: path.into(), mime: "application/pdf".into(), size };
        let text = with_references(
            "what is in it?",
            &[a(AttachmentKind::File, "inbox/2026-11-23/r.pdf", 12_000), a(AttachmentKind::Image, "inbox/p.jpg", 900)],
        );
        assert_eq!(
            text,
            "[file: inbox/2026-11-23/r.pdf, 12 KB, application/pdf; read it with read_file]\n[image: inbox/p.jpg, 900 B]\nwhat is in it?"
        );
        assert_eq!(
            with_references("", &[a(AttachmentKind::Voice { seconds: 67 }, "inbox/v.ogg", 1)]),
            "[voice note 1:07: inbox/v.ogg]"
        );
    }

    #[test]
    fn image_refusals_are_recognised_and_others_are_not() {
        let http = |status, m: &str| ProviderError::Http { status, message: m.into(), retry_after: None };
        assert!(refused_images(&http(400, "Invalid content type. image_url is only supported by certain models.")));
        assert!(refused_images(&http(
            500,
            "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
        )));
        assert!(!refused_images(&http(429, "image rate limit")));
        assert!(!refused_images(&http(400, "maximum context length exceeded")));
        assert!(!refused_images(&ProviderError::Decode("image".into())));
    }
}
