//! `[matrix]`: a Matrix account bramble talks through (the client-server
//! API of its homeserver; see docs/channels/matrix.md).
//!
//! Its own file so the section's types and checks sit together. Secrets
//! only by `*_env` names: the access token, or a password used once to log
//! in (the token it gives is kept 0600 in the state directory).

use serde::Deserialize;

use super::{secret_from_env, HttpUrl, Secret};
use crate::bus::{is_matrix_room as is_room, is_matrix_user as is_user_id};

/// `[matrix]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MatrixConfig {
    /// `https://matrix.example.org` (the client-server API's base); unset: no Matrix.
    pub homeserver: Option<HttpUrl>,
    /// The bot's account, `@bramble:example.org` (needed for a password login).
    pub user_id: Option<String>,
    /// The variable (or systemd credential) holding an access token.
    pub access_token_env: Option<String>,
    /// The variable holding the account's password: used once to log in when
    /// there is no token; the token is then kept in `<state>/matrix-session.json`.
    pub password_env: Option<String>,
    /// User ids that may talk to the bot (`@owner:example.org`). Empty: nobody.
    /// Invites from anyone else are refused.
    pub allow_from: Vec<String>,
    /// Rooms (ids `!abc:server` or aliases `#room:server`) the bot joins at
    /// start and may post to; what their allowed members write is answered.
    pub rooms: Vec<String>,
    /// Files and images larger than this are not downloaded.
    pub max_file_mb: u64,
    /// A message longer than this many characters is cut to it.
    pub max_message_chars: usize,
}

impl Default for MatrixConfig {
    fn default() -> Self {
        MatrixConfig {
            homeserver: None,
            user_id: None,
            access_token_env: None,
            password_env: None,
            allow_from: Vec::new(),
            rooms: Vec::new(),
            max_file_mb: 20,
            max_message_chars: 16_000,
        }
    }
}

impl MatrixConfig {
    /// The access token from `access_token_env`, if set and present.
    pub fn access_token(&self) -> Option<Secret> {
        self.access_token_env.as_deref().and_then(secret_from_env)
    }

    /// The password from `password_env`, if set and present.
    pub fn password(&self) -> Option<Secret> {
        self.password_env.as_deref().and_then(secret_from_env)
    }

    /// What `bramble check` says about the section (`None`: fine or not configured).
    pub fn problem(&self) -> Option<String> {
        self.homeserver.as_ref()?;
        for id in &self.allow_from {
            if !is_user_id(id) {
                return Some(format!(
                    "[matrix] allow_from: `{id}` is not a Matrix user id like \"@owner:example.org\""
                ));
            }
        }
        if let Some(id) = self.user_id.as_deref().filter(|id| !is_user_id(id)) {
            return Some(format!("[matrix] user_id: `{id}` is not a Matrix user id like \"@bramble:example.org\""));
        }
        for room in &self.rooms {
            if !is_room(room) {
                return Some(format!(
                    "[matrix] rooms: `{room}` is not a room id (\"!abc:example.org\") or alias (\"#room:example.org\")"
                ));
            }
        }
        if self.access_token_env.is_none() && (self.password_env.is_none() || self.user_id.is_none()) {
            return Some("[matrix] needs access_token_env, or user_id and password_env, to log in".to_string());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(is_user_id("@owner:example.org") && is_user_id("@a:localhost:8448"));
        assert!(!is_user_id("owner:example.org") && !is_user_id("@owner") && !is_user_id("@:x"));
        assert!(is_room("!abc:example.org") && is_room("#room:example.org"));
        assert!(is_room("!abcDEF-_x"), "room version 12 ids have no server part");
        assert!(!is_room("room:example.org") && !is_room("#abc") && !is_room("#a b:x") && !is_room("!"));
        let c = MatrixConfig {
            homeserver: Some(HttpUrl("http://127.0.0.1:8008".into())),
            allow_from: vec!["owner".into()],
            ..Default::default()
        };
        assert!(c.problem().unwrap().contains("`owner` is not a Matrix user id"));
        let c = MatrixConfig { allow_from: vec!["@o:x".into()], ..c };
        assert!(c.problem().unwrap().contains("access_token_env"));
        assert!(MatrixConfig::default().problem().is_none(), "not configured: nothing to say");
    }
}
