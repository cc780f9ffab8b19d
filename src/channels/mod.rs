//! Channels: where messages come from and where reports go — Telegram, MQTT
//! and Home Assistant (the terminal is the CLI's own). Each implements
//! [`crate::delivery::Channel`] for its targets and feeds inbound messages
//! onto the bus; the outbox ([`crate::delivery`]) calls `deliver` and retries.

/// The gateway in, REST out (feature `discord`).
#[cfg(feature = "discord")]
pub mod discord;
/// Mail in by IMAP, reports out by SMTP (feature `email`).
#[cfg(feature = "email")]
pub mod email;
#[cfg(feature = "feishu")]
pub mod feishu;
#[cfg(feature = "homeassistant")]
pub mod homeassistant;
pub mod inbox;
#[cfg(feature = "matrix")]
pub mod matrix;
pub mod mqtt;
/// ntfy: reports as push notifications, commands from subscribed topics (feature `ntfy`).
#[cfg(feature = "ntfy")]
pub mod ntfy;
#[cfg(feature = "signal")]
pub mod signal;
#[cfg(any(feature = "matrix", feature = "feishu"))]
pub mod status_edits;
pub mod telegram;
#[cfg(feature = "webhook")]
pub mod webhook;
