//! The leaf of the crate: helpers that could have been in std (rust-analyzer's
//! `stdx`). Nothing here imports another bramble module; everything may import
//! this (see `ARCHITECTURE.md`, "Layers").
//!
//! - [`fs`]: atomic replace, durable appends, private state files, lock files.
//! - [`timer`]: long sleeps that wake the process once (timerfd), backoff.
//! - [`text`]: small text transformations.
//! - [`sys`]: facts about the machine (host name).
//! - [`mqtt`]: MQTT topic filters.
//! - [`tasks`]: the daemon's supervised services; a bounded number of tasks over a bounded queue.
//! - [`shutdown`]: the two-phase shutdown (stop taking work, then abort it) every loop is handed.
//! - [`pulse`]: a loop's sign of life, for the dead-man.
//! - [`tls`]: the HTTP clients' TLS, CA store loaded at the first https handshake.
//! - [`multipart`]: `multipart/form-data` bodies (file uploads).
//! - [`sha1`]: SHA-1, for the WebSocket handshake.
//! - [`secrets`]: what a server sent a credential may answer, redacted; redirects refused.

pub mod addr;
pub mod fs;
/// Channel identifiers' shapes (re-exported by `bus`).
pub mod ids;
pub mod mqtt;
pub mod multipart;
pub mod pulse;
pub mod secrets;
pub mod sha1;
pub mod shutdown;
pub mod sys;
pub mod tasks;
#[cfg(test)]
pub mod test_env;
pub mod text;
pub mod timer;
pub mod tls;
pub mod unique;

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future: what the object-safe async traits (providers,
/// tools, channels, job executors) return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
