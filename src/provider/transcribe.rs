//! Speech to text for voice notes: any OpenAI-compatible
//! `POST <base_url>/audio/transcriptions` (OpenAI, Groq, a LAN faster-whisper
//! server), or whisper.cpp's own server (`POST <base_url>/inference`, the same
//! multipart form; it decodes OGG when started with `--convert`).
//!
//! The audio goes as it came (Telegram's OGG/Opus): every one of those servers
//! decodes it itself, so bramble carries no codec and spends no CPU on a Pi
//! transcoding. One multipart request (`file`, `model`, `language`,
//! `response_format=json`), one `{"text": …}` back. Errors are mapped as the
//! chat providers' are ([`super::post_json`]): a refused key, a 413, a server
//! that is down — each a sentence the user is shown.

use std::time::Duration;

use serde::Deserialize;

use super::ProviderError;
use crate::config::{Secret, TranscriptionConfig, TranscriptionKind};

/// Transcripts longer than this are cut (a 5-minute note is ~5,000 characters).
const MAX_TRANSCRIPT_CHARS: usize = 20_000;

/// A configured transcription endpoint.
pub struct Transcriber {
    client: reqwest::Client,
    url: String,
    model: String,
    language: Option<String>,
    key: Option<Secret>,
    max_duration: Duration,
}

impl std::fmt::Debug for Transcriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcriber").field("url", &self.url).field("model", &self.model).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    text: Option<String>,
}

impl Transcriber {
    /// `Ok(None)` when `[transcription] kind = "none"`; `Err` when a key is
    /// required and missing (the reason, for `/status` and the user).
    pub fn from_config(cfg: &TranscriptionConfig) -> Result<Option<Transcriber>, super::Unconfigured> {
        if cfg.kind == TranscriptionKind::None {
            return Ok(None);
        }
        let key = cfg.api_key();
        if key.is_none() && cfg.key_required() {
            return Err(super::Unconfigured::new(format!(
                "[transcription] needs an API key for {}: set {} (or `api_key_env`), or point `base_url` at a local server",
                cfg.base_url(),
                cfg.key_env()
            )));
        }
        let client = super::http_client(cfg.timeout.get()).map_err(|e| super::Unconfigured::new(e.to_string()))?;
        Ok(Some(Transcriber {
            client,
            url: cfg.endpoint(),
            model: cfg.model().to_string(),
            language: cfg.language.clone().filter(|l| !l.trim().is_empty()),
            key,
            max_duration: cfg.max_duration.get(),
        }))
    }

    /// Where and with what model, for `/status`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.url, self.model)
    }

    /// The longest voice note transcribed.
    pub fn max_duration(&self) -> Duration {
        self.max_duration
    }

    /// The text of `audio` (a file named `file_name`, of `mime`). An empty
    /// transcript is an error: there is nothing to answer.
    pub async fn transcribe(&self, file_name: &str, mime: &str, audio: &[u8]) -> Result<String, ProviderError> {
        let mut form = crate::util::multipart::Form::new(audio).text("model", &self.model);
        if let Some(lang) = &self.language {
            form = form.text("language", lang);
        }
        let (body, ctype) = form.text("response_format", "json").file("file", file_name, mime, audio).finish();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &self.key {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                ProviderError::NotConfigured(
                    "the transcription API key has characters not allowed in HTTP headers".into(),
                )
            })?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        let bytes = super::post_body(&self.client, &self.url, headers, body, &ctype, self.key.as_ref()).await?;
        let answer: Answer = serde_json::from_slice(&bytes).map_err(|e| {
            ProviderError::Decode(format!("the transcription server's answer is not the expected JSON: {e}"))
        })?;
        let text = answer.text.unwrap_or_default();
        let text = text.trim();
        if text.is_empty() {
            return Err(ProviderError::Decode(
                "the transcription came back empty (silence, or speech it could not make out)".into(),
            ));
        }
        Ok(text.chars().take(MAX_TRANSCRIPT_CHARS).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_off_and_the_public_endpoint_needs_a_key() {
        let mut cfg = TranscriptionConfig::default();
        assert!(Transcriber::from_config(&cfg).unwrap().is_none());
        cfg.kind = TranscriptionKind::Openai;
        cfg.api_key_env = Some("BRAMBLE_TEST_NO_SUCH_KEY".into());
        let err = Transcriber::from_config(&cfg).unwrap_err();
        assert!(err.reason.contains("BRAMBLE_TEST_NO_SUCH_KEY"), "{err}");
        cfg.base_url = Some(crate::config::HttpUrl("http://127.0.0.1:9000/v1/".into()));
        let t = Transcriber::from_config(&cfg).unwrap().unwrap();
        assert_eq!(t.describe(), "http://127.0.0.1:9000/v1/audio/transcriptions (whisper-1)");
        // whisper.cpp's server: its own path, no key needed, a local default.
        let cpp = TranscriptionConfig { kind: TranscriptionKind::WhisperCpp, ..TranscriptionConfig::default() };
        assert_eq!(
            Transcriber::from_config(&cpp).unwrap().unwrap().describe(),
            "http://127.0.0.1:8080/inference (whisper-1)"
        );
    }
}
