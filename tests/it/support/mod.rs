//! Shared test infrastructure: a tiny HTTP/1.1 server and fakes built on it.
//!
//! The integration tests (`tests/it/`) and the benches (`benches/`, through
//! `#[path]`) share it; each bench uses a subset, hence the `dead_code` allowance.
//!
//! - [`http`]: `TestServer`, a request/response server on 127.0.0.1 for fake remote APIs.
//! - [`daemon`]: `Daemon`, a real `bramble run` process.
//! - [`mosquitto`]: `Mosquitto`, Debian's MQTT broker on a free port, and `Watcher`, a test client.
//! - [`amqtt`]: `Amqtt`, an MQTT 3.1.1-only broker from PyPI, the second broker.
//! - [`fake_llm`]: `FakeLlm`, a scripted OpenAI- or Anthropic-dialect model server.
//! - [`fake_ha`]: `FakeHa`, Home Assistant's REST and WebSocket APIs (a real RFC 6455 server).
//! - [`feishu`]: `FakeFeishu`, the Feishu / Lark long connection (pbbp2 frames) and REST.
//! - [`discord`]: `FakeDiscord`, Discord's gateway (a real RFC 6455 server) and REST API v10.
//! - [`ntfy`]: `FakeNtfy`, an ntfy server (JSON publish, uploads, the JSON stream with `since`), from ntfy's docs.
//! - [`telegram`]: `FakeTelegram`, a Bot API server (long polling, sendMessage, …).
//! - [`setup`]: `TestHome`, a config, workspace and state directory in a temp dir, and the agent they build.
//! - [`env`]: running one test in a child process with environment variables set.
//! - [`signal`]: `FakeSignal`, a signal-cli daemon's HTTP JSON-RPC and event stream (signal-cli-jsonrpc(5)).
//! - [`synapse`]: `Synapse`, a real Matrix homeserver from PyPI, shared by the process, and `User`, a human on it.
//! - [`procstat`]: a process's wake-ups and RSS from `/proc`, for the idle-cost measurements.
//! - [`python`]: a venv with pinned PyPI packages, for outside references written in Python.
#![allow(dead_code)]

pub mod amqtt;
pub mod daemon;
pub mod discord;
/// Variables in the process environment, for one test, in a child process.
#[path = "../../../src/util/test_env.rs"]
pub mod env;
pub mod fake_ha;
pub mod fake_llm;
pub mod feishu;
pub mod http;
pub mod mail;
pub mod mosquitto;
pub mod ntfy;
pub mod procstat;
pub mod pty;
pub mod python;
pub mod setup;
pub mod signal;
pub mod synapse;
pub mod telegram;
