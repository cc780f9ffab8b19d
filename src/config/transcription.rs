//! `[transcription]`: turning voice notes into text (an OpenAI-compatible
//! `/audio/transcriptions` endpoint, or Groq's), kept apart from `mod.rs`.

use serde::Deserialize;

use super::{secret_from_env, Dur, HttpUrl, Secret};

/// `[transcription]`: turning voice notes into text.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TranscriptionConfig {
    /// `openai`: any OpenAI-compatible `/v1/audio/transcriptions` (OpenAI,
    /// Groq, a LAN faster-whisper server); `whispercpp`: whisper.cpp's own
    /// server (`POST <base_url>/inference`); `none`: voice notes are kept in
    /// the inbox and the user is told transcription is off.
    pub kind: TranscriptionKind,
    /// Default `https://api.openai.com/v1` (`openai`), `http://127.0.0.1:8080` (`whispercpp`).
    pub base_url: Option<HttpUrl>,
    /// Default `whisper-1`.
    pub model: Option<String>,
    pub api_key: Option<Secret>,
    /// Default `OPENAI_API_KEY`.
    pub api_key_env: Option<String>,
    /// ISO-639-1 language hint (`en`, `de`); unset: the server guesses.
    pub language: Option<String>,
    /// Voice notes longer than this are refused (kept in the inbox).
    pub max_duration: Dur,
    /// Limit for one transcription, from connect to the end of the answer.
    pub timeout: Dur,
}

/// `[transcription] kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TranscriptionKind {
    #[default]
    None,
    Openai,
    /// whisper.cpp's `examples/server` (`/inference`).
    #[serde(rename = "whispercpp", alias = "whisper.cpp")]
    WhisperCpp,
}

impl Default for TranscriptionConfig {
    fn default() -> Self {
        TranscriptionConfig {
            kind: TranscriptionKind::None,
            base_url: None,
            model: None,
            api_key: None,
            api_key_env: None,
            language: None,
            max_duration: Dur::secs(5 * 60),
            timeout: Dur::secs(120),
        }
    }
}

impl TranscriptionConfig {
    pub fn base_url(&self) -> &str {
        let default = match self.kind {
            TranscriptionKind::WhisperCpp => "http://127.0.0.1:8080",
            _ => "https://api.openai.com/v1",
        };
        self.base_url.as_ref().map(HttpUrl::as_str).unwrap_or(default)
    }

    /// Where the audio is posted.
    pub fn endpoint(&self) -> String {
        let base = self.base_url().trim_end_matches('/');
        match self.kind {
            TranscriptionKind::WhisperCpp => format!("{base}/inference"),
            _ => format!("{base}/audio/transcriptions"),
        }
    }
    pub fn model(&self) -> &str {
        self.model.as_deref().unwrap_or("whisper-1")
    }
    pub fn key_env(&self) -> &str {
        self.api_key_env.as_deref().unwrap_or("OPENAI_API_KEY")
    }
    /// The key: `api_key`, else the `api_key_env` variable (or credential).
    pub fn api_key(&self) -> Option<Secret> {
        self.api_key.clone().or_else(|| secret_from_env(self.key_env()))
    }
    /// A public endpoint needs a key; a LAN server (and whisper.cpp's) usually does not.
    pub fn key_required(&self) -> bool {
        self.base_url.is_none() && self.kind == TranscriptionKind::Openai
    }
}
