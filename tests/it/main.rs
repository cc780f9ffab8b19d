//! The integration tests: one binary, so the shared support code is built
//! once. Each module tests one part of bramble from outside — real processes,
//! a real MQTT broker, and fake remote APIs (LLM, Telegram) on 127.0.0.1 that
//! speak the published wire formats (see [`support`]).
//!
//! Run one part with `cargo test --test it <module>::`, e.g. `cargo test --test it mqtt::`.

mod support;

mod agent;
mod agent_eval;
mod chat;
mod cli;
mod cli_daily;
mod cli_json;
mod cron_reference;
mod daemon;
#[cfg(feature = "discord")]
mod discord;
mod docs;
#[cfg(feature = "email")]
mod email;
#[cfg(feature = "feishu")]
mod feishu;
mod firsthour;
mod firstrun;
#[cfg(feature = "fleet")]
mod fleet;
#[cfg(feature = "fleet")]
mod fleet_any;
#[cfg(feature = "fleet")]
mod fleet_standby;
#[cfg(feature = "homeassistant")]
mod homeassistant;
#[cfg(all(feature = "matrix", feature = "email", feature = "webhook"))]
mod idle_cost;
mod lean;
mod local_models;
#[cfg(feature = "matrix")]
mod matrix;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "mcp")]
mod mcp_conformance;
#[cfg(feature = "mcp")]
mod mcp_oauth;
#[cfg(feature = "mcp")]
mod mcp_stream;
mod memory;
mod mqtt;
mod mqtt_ha_schema;
mod mqtt_v311;
#[cfg(feature = "ntfy")]
mod ntfy;
mod pairing;
#[cfg(any(feature = "discord", feature = "signal", feature = "feishu"))]
mod pairing_chats;
mod provider;
mod redirects;
mod rights;
#[cfg(feature = "web-search")]
mod search;
mod security;
#[cfg(feature = "signal")]
mod signal;
mod slim;
mod smoke;
mod telegram;
#[cfg(feature = "telegram-media")]
mod telegram_media;
mod tools;
#[cfg(feature = "webhook")]
mod webhook;
