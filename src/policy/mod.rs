//! Who may do what: the rules that do not belong to one channel or one tool.
//!
//! - [`pins`]: Telegram's `allow_from` — usernames pinned to the id that first
//!   used them, and [`AllowedChats`], the chats a turn may send to. The
//!   Telegram poller decides with it who is served; the `message` and `cron`
//!   tools decide with it where a report may go.
//! - [`feishu`]: `[feishu] allow_from`, and the chats a turn may post to.
//! - [`matrix`]: `[matrix] allow_from`, and the rooms a turn may post to.
//! - [`signal`]: `[signal] allow_from` (numbers pinned to uuids), and the chats a turn may send to.
//! - [`discord`]: `[discord] allow_from`, and the channels a turn may post to.
//! - [`pairing`]: users added with a one-time code (`bramble pair`, `/pair`).
//! - [`standing`]: whether a job's creator may still have it run (revoked
//!   users' jobs stop), and where members' reminders may go.
//!
//! Below the tools and the channels, above the configuration (see
//! `ARCHITECTURE.md`, "Layers").

pub mod discord;
pub mod feishu;
pub mod matrix;
pub mod pairing;
pub mod pins;
pub mod signal;
pub mod standing;

pub use pins::{pins_summary, Allow, AllowedChats, Verdict};
pub use standing::Standing;
