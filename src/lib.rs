//! # bramble
//!
//! A scheduler-first AI agent daemon for small Linux boards.
//!
//! ## Layout
//!
//! The modules mirror the architecture (see `ARCHITECTURE.md`, which also
//! gives the layers: a module uses only its own layer and those below,
//! checked by a test in `layers.rs`). From the bottom up:
//!
//! - [`util`], [`workspace`], [`logging`]: the leaf — helpers, the path
//!   confinement for workspace files, log setup.
//! - [`bus`]: delivery targets, messages, bounded queues between channels and the agent.
//! - [`config`]: `config.toml`, defaults, validation with `FILE:LINE:COL`, paths.
//! - [`provider`]: LLM backends (OpenAI-compatible, Anthropic) behind one trait, retries.
//! - [`sandbox`]: how commands run (the kernel jail, limits, output caps).
//! - [`scheduler`]: jobs, schedules, the job store and the loop that runs them; the heartbeat file.
//! - [`delivery`]: the outbox, its dispatcher, the `Channel` and `Publisher` traits.
//! - [`policy`]: who may do what (`allow_from` pins).
//! - [`clients`]: protocol clients — Home Assistant REST and WebSocket, the Telegram Bot API.
//! - [`tools`]: what the model may call — files, exec, web, message, cron, memory, MQTT.
//! - [`agent`]: the ReAct loop, the context builder, sessions, memory, sub-agents.
//! - [`work`]: jobs, the heartbeat and triggers run and reported one way.
//! - [`channels`]: Telegram and MQTT.
//! - [`daemon`]: `bramble run` — builds and runs everything.
//! - [`cli`]: the commands.

// Every `unsafe` block says why it is sound, and holds one unsafe operation.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::multiple_unsafe_ops_per_block)]

pub mod agent;
pub mod bus;
pub mod channels;
pub mod cli;
pub mod clients;
pub mod config;
pub mod daemon;
pub mod delivery;
#[cfg(feature = "fleet")]
pub mod fleet;
#[cfg(test)]
mod layers;
pub mod logging;
pub mod policy;
pub mod provider;
pub mod sandbox;
pub mod scheduler;
pub mod tools;
pub mod util;
pub mod work;
pub mod workspace;

/// Install rustls' ring crypto provider as the process default.
///
/// reqwest is built without a bundled provider (the default would pull aws-lc,
/// which needs cmake and bindgen to cross-compile for armv7), and a client built
/// before a provider is installed panics. Call this first thing; it is
/// idempotent and cheap.
pub fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is already installed: fine either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
