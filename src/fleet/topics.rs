//! The fleet's topics, all under `bramble/<board>/` (CONTRACT.md's prefix):
//!
//! | topic | who publishes | what |
//! |---|---|---|
//! | `bramble/<board>/status` | the board (retained, last will) | `online` / `offline` (as before) |
//! | `bramble/<board>/fleet/board` | the board (retained) | presence: role, version, capabilities, jobs |
//! | `bramble/<primary>/fleet/cmd/<node>` | the primary | signed commands for one node |
//! | `bramble/<node>/fleet/up` | the node | signed replies and reports for the primary |
//! | `bramble/<node>/fleet/answer/<id>` | the node | a `/on` turn's answer (the id is the request's) |
//!
//! Every board writes only under its own prefix: the ACL (`bramble fleet
//! acl`) is one pattern line, and a board's words are the broker's proof of
//! who said them.

use crate::config::fleet::BoardName;

/// The root every board's prefix is under.
pub const ROOT: &str = "bramble";

pub fn status(board: &BoardName) -> String {
    format!("{ROOT}/{board}/status")
}

pub fn presence(board: &BoardName) -> String {
    format!("{ROOT}/{board}/fleet/board")
}

pub fn command(primary: &BoardName, node: &BoardName) -> String {
    format!("{ROOT}/{primary}/fleet/cmd/{node}")
}

pub fn up(node: &BoardName) -> String {
    format!("{ROOT}/{node}/fleet/up")
}

pub fn answer(node: &BoardName, id: &str) -> String {
    format!("{ROOT}/{node}/fleet/answer/{id}")
}

/// What a board subscribes to: everyone's presence; on the primary, every
/// node's replies, reports and answers; on a node, its own command topic.
pub fn subscriptions(me: &BoardName, primary: Option<&BoardName>) -> Vec<String> {
    let mut v = vec![format!("{ROOT}/+/status"), format!("{ROOT}/+/fleet/board")];
    match primary {
        None => v.extend([format!("{ROOT}/+/fleet/up"), format!("{ROOT}/+/fleet/answer/+")]),
        Some(p) => v.push(command(p, me)),
    }
    v
}

/// What a fleet topic is, and whose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetTopic {
    Status(BoardName),
    Presence(BoardName),
    /// A command from `.0` for `.1`.
    Command(BoardName, BoardName),
    Up(BoardName),
    Answer(BoardName, String),
}

/// Read a topic back (`None`: not a fleet topic, or a board name that is not one).
pub fn parse(topic: &str) -> Option<FleetTopic> {
    let rest = topic.strip_prefix(ROOT)?.strip_prefix('/')?;
    let (board, rest) = rest.split_once('/')?;
    let board: BoardName = board.parse().ok()?;
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["status"] => Some(FleetTopic::Status(board)),
        ["fleet", "board"] => Some(FleetTopic::Presence(board)),
        ["fleet", "cmd", node] => Some(FleetTopic::Command(board, node.parse().ok()?)),
        ["fleet", "up"] => Some(FleetTopic::Up(board)),
        ["fleet", "answer", id] if !id.is_empty() => Some(FleetTopic::Answer(board, id.to_string())),
        _ => None,
    }
}

/// A mosquitto ACL for the fleet (`bramble fleet acl`): each board's broker
/// user is its board name; it reads the fleet and writes only under its own
/// prefix (and Home Assistant discovery under its own node).
pub fn mosquitto_acl(boards: &[BoardName]) -> String {
    let mut out = String::from(
        "# bramble fleet: mosquitto ACL (acl_file). Each board logs in as its board name\n\
         # ([mqtt] username = \"<board>\"); a board writes only under bramble/<board>/.\n\
         # Other accounts read the boards' status and presence, nothing else under bramble/.\n\n\
         # Every board (pattern: %u is the user name)\n\
         pattern write bramble/%u/#\n\
         pattern write homeassistant/+/bramble_%u/#\n\
         pattern read bramble/+/status\n\
         pattern read bramble/+/fleet/board\n\
         pattern read bramble/%u/#\n\
         pattern read bramble/+/fleet/cmd/%u\n\
         pattern read homeassistant/+/bramble_%u/#\n",
    );
    if !boards.is_empty() {
        out.push_str("\n# The primary also reads the nodes' replies, reports and answers, and where the\n");
        out.push_str("# chat's polling stands (add the last line under `user <standby>` for each standby)\n");
        for b in boards {
            out.push_str(&format!(
                "user {b}\ntopic read bramble/+/fleet/up\ntopic read bramble/+/fleet/answer/+\ntopic read bramble/+/fleet/chat\n"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::mqtt::topic_matches;

    fn b(n: &str) -> BoardName {
        n.parse().unwrap()
    }

    #[test]
    fn topics_read_back() {
        let (p, n) = (b("living"), b("garage"));
        assert_eq!(parse(&command(&p, &n)), Some(FleetTopic::Command(p.clone(), n.clone())));
        assert_eq!(parse(&up(&n)), Some(FleetTopic::Up(n.clone())));
        assert_eq!(parse(&answer(&n, "ab12")), Some(FleetTopic::Answer(n.clone(), "ab12".into())));
        assert_eq!(parse(&presence(&n)), Some(FleetTopic::Presence(n.clone())));
        assert_eq!(parse(&status(&n)), Some(FleetTopic::Status(n.clone())));
        for other in ["bramble/Garage/status", "bramble/garage/in", "x/garage/status", "bramble/garage/fleet/cmd/A"] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_node_hears_only_its_primary_and_presence() {
        let subs = subscriptions(&b("garage"), Some(&b("living")));
        let hears = |t: &str| subs.iter().any(|f| topic_matches(f, t));
        assert!(hears("bramble/living/fleet/cmd/garage"));
        assert!(!hears("bramble/attic/fleet/cmd/garage"), "another board's commands are not even heard");
        assert!(!hears("bramble/living/fleet/cmd/attic"));
        assert!(!hears("bramble/attic/fleet/up"));
        let primary = subscriptions(&b("living"), None);
        assert!(primary.iter().any(|f| topic_matches(f, "bramble/garage/fleet/answer/x1")));
        assert!(!primary.iter().any(|f| topic_matches(f, "bramble/garage/fleet/cmd/living")));
    }
}
