//! The shapes of the channels' identifiers (addresses, numbers, room and
//! user ids, names), checked where a target, a principal or a config value
//! is read. Pure functions over text, kept apart from `bus.rs` (which
//! re-exports them) so the vocabulary stays one screen per type.

/// A `[[webhook]]` name: 1 to 64 of `a-z 0-9 _ -` (it is a URL path segment
/// and a session key).
pub fn is_webhook_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// An ntfy topic name: 1 to 64 of `A-Z a-z 0-9 _ -`, as the ntfy server allows.
pub fn is_ntfy_topic(topic: &str) -> bool {
    (1..=64).contains(&topic.len()) && topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `local@domain.tld`, printable ASCII without what splits or quotes a
/// header (spaces, `<>()[],;:\"`): what an address in a target or an
/// allow-list may be.
pub fn is_plain_address(text: &str) -> bool {
    let Some((local, domain)) = text.split_once('@') else { return false };
    let ok = |c: char| c.is_ascii_graphic() && !"<>()[],;:\\\"@".contains(c);
    !local.is_empty()
        && local.len() <= 64
        && domain.len() <= 253
        && local.chars().all(ok)
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && domain.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
}

/// A Signal number in E.164: `+` and 7 to 15 digits.
pub fn is_signal_number(n: &str) -> bool {
    n.strip_prefix('+').is_some_and(|d| (7..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
}

/// A Signal account uuid (ACI), `8-4-4-4-12` hex digits.
pub fn is_signal_uuid(u: &str) -> bool {
    let parts: Vec<&str> = u.split('-').collect();
    parts.len() == 5
        && parts.iter().zip([8, 4, 4, 4, 12]).all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A Signal group id as signal-cli writes it: standard base64 of 32 bytes (v2 groups) or 16 (v1).
pub fn is_signal_group(id: &str) -> bool {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(id).is_ok_and(|b| b.len() == 32 || b.len() == 16)
}

/// A Signal chat: a number, a uuid, or `group.<base64 id>`.
pub fn is_signal_chat(chat: &str) -> bool {
    match chat.strip_prefix("group.") {
        Some(id) => is_signal_group(id),
        None => is_signal_number(chat) || is_signal_uuid(chat),
    }
}

/// A Feishu / Lark id with its kind's prefix: `oc_` a chat, `ou_` a user's
/// open_id; then letters, digits, `_` or `-` (at most 128 in all).
pub fn is_feishu_id(id: &str, prefix: &str) -> bool {
    id.len() <= 128
        && id
            .strip_prefix(prefix)
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}

/// A Matrix user id: `@local:server`.
pub fn is_matrix_user(id: &str) -> bool {
    id.strip_prefix('@').and_then(|r| r.split_once(':')).is_some_and(|(l, s)| matrix_part(l) && matrix_part(s))
}

/// A Matrix room id (`!opaque:server`; from room version 12 on, `!opaque`
/// alone) or alias (`#alias:server`).
pub fn is_matrix_room(room: &str) -> bool {
    if let Some(id) = room.strip_prefix('!') {
        return matrix_part(id);
    }
    room.strip_prefix('#').and_then(|r| r.split_once(':')).is_some_and(|(l, s)| matrix_part(l) && matrix_part(s))
}

fn matrix_part(p: &str) -> bool {
    !p.is_empty() && p.len() <= 255 && !p.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/')
}
