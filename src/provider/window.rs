//! The model's context window: how many tokens it reads at most, prompt and
//! answer together. A small local model (a 4k Ollama default, an 8k
//! llama.cpp server) silently drops the start of a prompt that is too long
//! (the system prompt and the tool specs first), and then calls no tool at
//! all; so the agent fits its prompt to the window, and a small window
//! chooses the lean profile ([`crate::config::Profile`]).
//!
//! Where the figure comes from, first that answers:
//! 1. `[provider] context_window` in the config;
//! 2. the server, where it says (asked once per process, then cached):
//!    Ollama's `POST /api/show` (a `num_ctx` in the model's parameters, else
//!    the model's `*.context_length` capped at the 4096 tokens Ollama serves
//!    by default on small machines), llama.cpp server's `GET /props`
//!    (`default_generation_settings.n_ctx`, what it was started with);
//! 3. [`known`]: the published window of common local models, by name;
//! 4. unknown: the prompt is then bounded by `[agent] context_tokens` only.
//!
//! A server's answer is data from the network: it is read to at most
//! [`ANSWER_CAP`] bytes, and a value that is not a number between
//! [`ContextWindow::MIN`] and [`ContextWindow::MAX`], or an answer that is
//! not the JSON expected, is ignored with a log line (the next source is used).

use std::time::Duration;

use serde_json::Value;

use crate::config::{ContextWindow, Profile, ProviderConfig, ProviderKind};

/// Bytes of a server's answer read at most (Ollama's carries the model's
/// license and template: tens of KiB).
pub const ANSWER_CAP: usize = 1 << 20;

/// How long one question to the server may take: a dead LAN box must not hold up a turn.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// Ollama's window when the model sets no `num_ctx` and the server no
/// `OLLAMA_CONTEXT_LENGTH`: 4096 below 24 GiB of VRAM (Ollama's
/// docs/context-length.mdx; 2048 before 0.6). A Pi has none.
pub const OLLAMA_DEFAULT_CTX: u32 = 4096;

/// Where a window figure came from (for logs, `check` and `doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowSource {
    Config,
    /// The server at this URL said so.
    Server(String),
    /// The published window of the model family named.
    Known(&'static str),
}

impl std::fmt::Display for WindowSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WindowSource::Config => f.write_str("[provider] context_window"),
            WindowSource::Server(url) => write!(f, "reported by {url}"),
            WindowSource::Known(family) => write!(f, "the published window of {family}"),
        }
    }
}

/// A resolved window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub tokens: u32,
    pub source: WindowSource,
    /// The server said its chat template has no place for tools (llama.cpp's
    /// `/props`: `chat_template_caps.supports_tools: false`): it renders the
    /// prompt without them, silently, and the model never sees a tool.
    pub tools_dropped: bool,
}

/// One family of models and its published window.
struct Family {
    /// The name's start, letters and digits only (`qwen25coder` for `qwen2.5-coder`).
    prefix: &'static str,
    /// A size that must appear as a part of the name (`1b`), when the family's sizes differ.
    size: Option<&'static str>,
    tokens: u32,
    /// The family as shown to the user.
    name: &'static str,
}

/// Published windows, most specific first. Where each figure comes from:
/// - Qwen2.5 / Qwen2.5-Coder / Qwen3: their Hugging Face model cards, "Context
///   Length: Full 32,768 tokens" (131,072 only with YaRN turned on by hand);
/// - Llama 3.1 / 3.2 / 3.3: Meta's model cards, 128K; Llama 3: 8K;
/// - Gemma 3: Google's model card, 128K, 32K for the 1B (and 270M); Gemma 3n: its card, 32K;
///   Gemma 2: its config.json, 8,192;
/// - Phi-4-mini-instruct: Microsoft's model card, 128K; Phi-4: 16K;
///   Phi-3.5-mini: its card, 128K; Phi-3 mini as Ollama ships it (`phi3`): the 4K variant;
/// - Mistral NeMo: Mistral's announcement, 128K; Mistral 7B Instruct v0.3: its card, 32K;
/// - SmolLM2: its model card, 8K; TinyLlama: its card, 2,048.
const FAMILIES: &[Family] = &[
    Family { prefix: "qwen25coder", size: None, tokens: 32_768, name: "Qwen2.5-Coder" },
    Family { prefix: "qwen25", size: None, tokens: 32_768, name: "Qwen2.5" },
    Family { prefix: "qwen3", size: None, tokens: 32_768, name: "Qwen3" },
    Family { prefix: "llama33", size: None, tokens: 131_072, name: "Llama 3.3" },
    Family { prefix: "llama32", size: None, tokens: 131_072, name: "Llama 3.2" },
    Family { prefix: "llama31", size: None, tokens: 131_072, name: "Llama 3.1" },
    Family { prefix: "llama3", size: None, tokens: 8_192, name: "Llama 3" },
    Family { prefix: "metallama3", size: None, tokens: 8_192, name: "Llama 3" },
    Family { prefix: "gemma3n", size: None, tokens: 32_768, name: "Gemma 3n" },
    Family { prefix: "gemma3", size: Some("1b"), tokens: 32_768, name: "Gemma 3 1B" },
    Family { prefix: "gemma3", size: Some("270m"), tokens: 32_768, name: "Gemma 3 270M" },
    Family { prefix: "gemma3", size: None, tokens: 131_072, name: "Gemma 3" },
    Family { prefix: "gemma2", size: None, tokens: 8_192, name: "Gemma 2" },
    Family { prefix: "phi4mini", size: None, tokens: 131_072, name: "Phi-4-mini" },
    Family { prefix: "phi4", size: None, tokens: 16_384, name: "Phi-4" },
    Family { prefix: "phi35", size: None, tokens: 131_072, name: "Phi-3.5-mini" },
    Family { prefix: "phi3", size: None, tokens: 4_096, name: "Phi-3 mini (4k)" },
    Family { prefix: "mistralnemo", size: None, tokens: 131_072, name: "Mistral NeMo" },
    Family { prefix: "mistral", size: None, tokens: 32_768, name: "Mistral 7B" },
    Family { prefix: "smollm2", size: None, tokens: 8_192, name: "SmolLM2" },
    Family { prefix: "tinyllama", size: None, tokens: 2_048, name: "TinyLlama" },
];

/// The published window of `model` (`qwen2.5:3b`, `Qwen/Qwen2.5-3B-Instruct-GGUF`,
/// `lan/llama3.2:1b`), if its family is known.
pub fn known(model: &str) -> Option<Window> {
    let lower = model.to_ascii_lowercase();
    // The model's own name: after a provider's `name/` or an organisation's.
    let own = lower.rsplit('/').next().unwrap_or(&lower);
    let compact: String = own.chars().filter(char::is_ascii_alphanumeric).collect();
    let parts: Vec<&str> = own.split(|c: char| !c.is_ascii_alphanumeric() && c != '.').collect();
    FAMILIES
        .iter()
        .find(|f| compact.starts_with(f.prefix) && f.size.is_none_or(|s| parts.contains(&s)))
        .map(|f| Window { tokens: f.tokens, source: WindowSource::Known(f.name), tools_dropped: false })
}

/// Why a server's answer gave no window (logged, never fatal).
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("the answer is longer than {ANSWER_CAP} bytes")]
    TooLong,
    #[error("the answer is not JSON ({0})")]
    NotJson(serde_json::Error),
    #[error("the answer names no context window")]
    Missing,
    #[error("the answer's context window {0} is not believable (expected {min} to {max} tokens)", min = ContextWindow::MIN, max = ContextWindow::MAX)]
    Unbelievable(String),
}

/// The window Ollama's `/api/show` answer says it serves `model` with: the
/// `num_ctx` of its parameters, else its `*.context_length` capped at
/// [`OLLAMA_DEFAULT_CTX`].
pub fn from_ollama_show(answer: &Value) -> Result<u32, AskError> {
    let num_ctx = answer.get("parameters").and_then(Value::as_str).and_then(|p| {
        p.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("num_ctx")).then(|| words.next().unwrap_or("").to_string())
        })
    });
    if let Some(n) = num_ctx {
        return believable_text(&n);
    }
    let info = answer.get("model_info").and_then(Value::as_object).ok_or(AskError::Missing)?;
    let (_, length) = info.iter().find(|(k, _)| k.ends_with(".context_length")).ok_or(AskError::Missing)?;
    Ok(believable(length)?.min(OLLAMA_DEFAULT_CTX))
}

/// The window llama.cpp's `/props` answer says it was started with.
pub fn from_llamacpp_props(answer: &Value) -> Result<u32, AskError> {
    let n = answer.pointer("/default_generation_settings/n_ctx").ok_or(AskError::Missing)?;
    believable(n)
}

/// What a server whose template drops the tools means, and what to do.
pub const TOOLS_DROPPED: &str = "the model's chat template has no tools section (chat_template_caps.supports_tools is false): \
     the server leaves bramble's tools out of the prompt and the model never calls one; \
     serve it with a template that has one (docs/small-models.md, \"If your model's chat template has no tools section\")";

/// Whether llama.cpp's `/props` says its chat template cannot hold tools.
pub fn template_drops_tools(answer: &Value) -> bool {
    answer.pointer("/chat_template_caps/supports_tools") == Some(&Value::Bool(false))
}

fn believable(v: &Value) -> Result<u32, AskError> {
    v.as_u64().and_then(ContextWindow::checked).map(ContextWindow::get).ok_or_else(|| {
        let mut shown = v.to_string();
        shown.truncate(40);
        AskError::Unbelievable(shown)
    })
}

fn believable_text(n: &str) -> Result<u32, AskError> {
    n.parse::<u64>()
        .ok()
        .and_then(ContextWindow::checked)
        .map(ContextWindow::get)
        .ok_or_else(|| AskError::Unbelievable(n.chars().take(40).collect()))
}

/// The server's root: `base_url` without its `/v1` (`http://box:11434/v1` → `http://box:11434`).
fn root(base_url: &str) -> &str {
    let b = base_url.trim_end_matches('/');
    b.strip_suffix("/v1").unwrap_or(b)
}

async fn read_json(resp: reqwest::Response) -> Result<Value, AskError> {
    if !resp.status().is_success() {
        return Err(AskError::Status(resp.status().as_u16()));
    }
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > ANSWER_CAP {
            return Err(AskError::TooLong);
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(AskError::NotJson)
}

/// Ask the server behind `base_url` for `model`'s window: llama.cpp's
/// `/props`, then Ollama's `/api/show`. No key is sent (both answer without
/// one on a LAN server; where they do not, the next source is used).
pub async fn ask_server(base_url: &str, model: &str) -> Option<Window> {
    let client = match super::http_client(ASK_TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("cannot ask the server for its context window: {e}");
            return None;
        }
    };
    let root = root(base_url);
    let props = format!("{root}/props");
    let answer = async { read_json(client.get(&props).send().await?).await }.await;
    let tools_dropped = answer.as_ref().is_ok_and(template_drops_tools);
    if tools_dropped {
        tracing::warn!("{props}: {TOOLS_DROPPED}");
    }
    match answer.and_then(|v| from_llamacpp_props(&v)) {
        Ok(tokens) => return Some(Window { tokens, source: WindowSource::Server(props), tools_dropped }),
        // Down or silent: the second question would wait as long again.
        Err(AskError::Http(e)) if e.is_connect() || e.is_timeout() => {
            tracing::debug!("{props}: no context window: {e}");
            return None;
        }
        Err(e @ (AskError::Unbelievable(_) | AskError::TooLong)) => {
            tracing::warn!("{props}: its context window is ignored: {e}")
        }
        Err(e) => tracing::debug!("{props}: no context window: {e}"),
    }
    let show = format!("{root}/api/show");
    let ask = async { read_json(client.post(&show).json(&serde_json::json!({ "model": model })).send().await?).await };
    match ask.await.and_then(|v| from_ollama_show(&v)) {
        Ok(tokens) => Some(Window { tokens, source: WindowSource::Server(show), tools_dropped: false }),
        Err(e @ (AskError::Unbelievable(_) | AskError::TooLong)) => {
            tracing::warn!("{show}: its context window is ignored: {e}");
            None
        }
        Err(e) => {
            tracing::debug!("{show}: no context window: {e}");
            None
        }
    }
}

/// The window of the default provider's model, resolved once per process
/// and shared (the agent's prompt fitting, the tool registry's profile).
#[derive(Debug)]
pub struct WindowProbe {
    configured: Option<u32>,
    /// `(base_url, model)` of a custom OpenAI-compatible server to ask.
    server: Option<(String, String)>,
    model: String,
    profile: Option<Profile>,
    resolved: tokio::sync::OnceCell<Option<Window>>,
}

impl WindowProbe {
    /// The probe of the config's default model (`[agent] model`, a
    /// `provider/model` read against the providers' names) and `[agent] profile`.
    pub fn for_config(c: &crate::config::Config) -> WindowProbe {
        let model = c.model();
        let named = model
            .split_once('/')
            .and_then(|(name, rest)| c.providers.iter().find(|p| p.is_named() && p.name() == name).map(|p| (p, rest)));
        let (provider, model) = named.unwrap_or((c.provider(), model));
        WindowProbe::new(provider, model, c.agent.profile)
    }

    /// The probe for `provider` serving `model`, with `[agent] profile`.
    pub fn new(provider: &ProviderConfig, model: &str, profile: Option<Profile>) -> WindowProbe {
        let custom = provider.kind == ProviderKind::Openai && provider.base_url.is_some();
        WindowProbe {
            configured: provider.context_window.map(ContextWindow::get),
            server: custom.then(|| (provider.base_url().to_string(), model.to_string())),
            model: model.to_string(),
            profile,
            resolved: tokio::sync::OnceCell::new(),
        }
    }

    /// A probe with a fixed answer and no server (tests, a config without a provider).
    pub fn fixed(tokens: Option<u32>, profile: Option<Profile>) -> WindowProbe {
        WindowProbe { configured: tokens, server: None, model: String::new(), profile, resolved: Default::default() }
    }

    /// What is known without asking the server: the config, else the name.
    pub fn offline(&self) -> Option<Window> {
        match self.configured {
            Some(tokens) => Some(Window { tokens, source: WindowSource::Config, tools_dropped: false }),
            None => known(&self.model),
        }
    }

    /// The window, asking the server the first time (later calls wait for
    /// that answer, then share it).
    pub async fn resolve(&self) -> Option<Window> {
        self.resolved
            .get_or_init(|| async {
                if self.configured.is_none() {
                    if let Some((url, model)) = &self.server {
                        if let Some(w) = ask_server(url, model).await {
                            tracing::info!(tokens = w.tokens, "context window {}", w.source);
                            return Some(w);
                        }
                    }
                }
                self.offline()
            })
            .await
            .clone()
    }

    /// The window as far as it is known now: the server's once asked, else [`Self::offline`].
    pub fn current(&self) -> Option<Window> {
        match self.resolved.get() {
            Some(w) => w.clone(),
            None => self.offline(),
        }
    }

    /// The profile: `[agent] profile`, else lean for a small window.
    pub fn profile(&self) -> Profile {
        Profile::choose(self.profile, self.current().map(|w| w.tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn common_local_models_are_known_by_name() {
        let t = |m: &str| known(m).map(|w| w.tokens);
        assert_eq!(t("qwen2.5:3b"), Some(32_768));
        assert_eq!(t("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"), Some(32_768));
        assert_eq!(t("lan/llama3.2:1b"), Some(131_072));
        assert_eq!(t("llama3:8b"), Some(8_192));
        assert_eq!(t("gemma3:1b"), Some(32_768));
        assert_eq!(t("gemma3:12b"), Some(131_072));
        assert_eq!(t("gemma-3-1b-it-Q4_K_M.gguf"), Some(32_768));
        assert_eq!(t("phi4-mini"), Some(131_072));
        assert_eq!(t("phi-4"), Some(16_384));
        assert_eq!(t("mistral:7b"), Some(32_768));
        assert_eq!(t("phi3.5:3.8b"), Some(131_072));
        assert_eq!(t("phi3:mini"), Some(4_096));
        assert_eq!(t("gemma3n:e2b"), Some(32_768));
        assert_eq!(t("mistral-nemo"), Some(131_072));
        assert_eq!(t("gpt-4.1-mini"), None);
        assert_eq!(t(""), None);
    }

    #[test]
    fn ollama_answers_are_read_and_capped_at_its_default() {
        let with =
            json!({"parameters": "stop \"<|im_end|>\"\nnum_ctx 8192", "model_info": {"qwen2.context_length": 32768}});
        assert_eq!(from_ollama_show(&with).unwrap(), 8192);
        let without = json!({"model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}});
        assert_eq!(from_ollama_show(&without).unwrap(), OLLAMA_DEFAULT_CTX);
        let small = json!({"model_info": {"llama.context_length": 2048}});
        assert_eq!(from_ollama_show(&small).unwrap(), 2048);
    }

    #[test]
    fn bad_huge_or_malformed_answers_are_refused() {
        for bad in [
            json!({"parameters": "num_ctx 99999999999"}),
            json!({"parameters": "num_ctx -1"}),
            json!({"parameters": "num_ctx lots"}),
            json!({"model_info": {"llama.context_length": 1}}),
            json!({"model_info": {"llama.context_length": "4096"}}),
            json!({"model_info": {"llama.context_length": 1e300}}),
            json!({"model_info": []}),
            json!([1, 2]),
            json!(null),
        ] {
            assert!(from_ollama_show(&bad).is_err(), "{bad}");
        }
        assert_eq!(from_llamacpp_props(&json!({"default_generation_settings": {"n_ctx": 4096}})).unwrap(), 4096);
        for bad in [
            json!({"default_generation_settings": {"n_ctx": 0}}),
            json!({"default_generation_settings": {"n_ctx": u64::MAX}}),
            json!({"default_generation_settings": {"n_ctx": "8192"}}),
            json!({"n_ctx": 8192}),
        ] {
            assert!(from_llamacpp_props(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_config_wins_and_picks_the_profile() {
        assert_eq!(root("http://box:11434/v1/"), "http://box:11434");
        assert_eq!(root("http://box:8080"), "http://box:8080");
        let p = WindowProbe::fixed(Some(4096), None);
        assert_eq!(p.current().map(|w| w.source), Some(WindowSource::Config));
        assert_eq!(p.profile(), Profile::Lean);
        assert_eq!(WindowProbe::fixed(Some(32_768), None).profile(), Profile::Default);
        assert_eq!(WindowProbe::fixed(None, None).profile(), Profile::Default);
        assert_eq!(WindowProbe::fixed(Some(32_768), Some(Profile::Lean)).profile(), Profile::Lean);
    }
}
