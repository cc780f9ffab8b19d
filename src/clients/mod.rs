//! Protocol clients: Home Assistant's REST API ([`ha_rest`]), one WebSocket
//! client for every channel that needs one ([`ws`]: Home Assistant today),
//! the Telegram Bot API ([`telegram`]) and the MQTT connection ([`mqtt`]).
//!
//! They speak a wire protocol and nothing more: no tool, channel or policy
//! decision lives here. Tools and channels both sit above this layer, so
//! either may hold a client (the `ha_*` tools and the `ha:notify` channel
//! share one [`ha_rest::HaRest`]); a client never knows who holds it.

/// Discord's REST API and gateway messages (feature `discord`).
#[cfg(feature = "discord")]
pub mod discord;
/// Feishu / Lark: the long connection's frames, the token, REST (feature `feishu`).
#[cfg(feature = "feishu")]
pub mod feishu;
#[cfg(feature = "homeassistant")]
pub mod ha_rest;
/// IMAP in and SMTP out, for the email channel (feature `email`).
#[cfg(feature = "email")]
pub mod imap;
#[cfg(feature = "matrix")]
pub mod matrix;
pub mod mqtt;
/// NATS: one JetStream key-value `create` per claim, for the fleet's `--on any` (feature `fleet`).
#[cfg(feature = "fleet")]
pub mod nats;
/// ntfy: publish and the JSON stream (feature `ntfy`).
#[cfg(feature = "ntfy")]
pub mod ntfy;
/// A signal-cli daemon's JSON-RPC (feature `signal`).
#[cfg(feature = "signal")]
pub mod signal;
#[cfg(feature = "email")]
pub mod smtp;
pub mod telegram;
#[cfg(feature = "webhook")]
pub mod webhook;
/// RFC 6455, shared by every WebSocket peer (Home Assistant, chat gateways).
#[cfg(any(feature = "homeassistant", feature = "discord", feature = "feishu"))]
pub mod ws;

/// The body of `resp`, at most `cap` bytes; `true` when there was more.
pub async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body: Vec<u8> = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = cap - body.len();
        if chunk.len() >= room {
            body.extend_from_slice(&chunk[..room]);
            let more = chunk.len() > room || resp.chunk().await.ok().flatten().is_some_and(|c| !c.is_empty());
            return Ok((body, more));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}
