//! The primary's chat commands: `/on <board> <text>` and `/boards`.

use crate::config::fleet::BoardName;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Boards,
    On {
        board: BoardName,
        text: String,
    },
    /// A fleet command written wrong: what to say.
    Bad(String),
}

/// `None`: not a fleet command (the agent gets it).
pub fn parse(text: &str) -> Option<Command> {
    let t = text.trim();
    let (head, rest) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
    // `/boards@my_bot` in a Telegram group.
    let head = head.split_once('@').map_or(head, |(h, _)| h);
    match head {
        "/boards" => Some(Command::Boards),
        "/on" => {
            let rest = rest.trim();
            let (board, text) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let text = text.trim();
            if board.is_empty() || text.is_empty() {
                return Some(Command::Bad("Usage: /on <board> <text> (/boards lists the boards).".into()));
            }
            match board.parse() {
                Ok(board) => Some(Command::On { board, text: text.to_string() }),
                Err(e) => Some(Command::Bad(format!("{e}"))),
            }
        }
        _ => None,
    }
}

/// The text of a `/on <board> <text>` without the command.
pub fn strip_on(text: &str) -> String {
    match parse(text) {
        Some(Command::On { text, .. }) => text,
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_and_boards() {
        assert_eq!(parse("/boards"), Some(Command::Boards));
        assert_eq!(parse("/boards@bramble_bot"), Some(Command::Boards));
        assert_eq!(
            parse("/on garage  how warm is it?"),
            Some(Command::On { board: "garage".parse().unwrap(), text: "how warm is it?".into() })
        );
        assert!(matches!(parse("/on garage"), Some(Command::Bad(_))));
        assert!(matches!(parse("/on Garage hi"), Some(Command::Bad(_))));
        assert_eq!(parse("/online"), None);
        assert_eq!(parse("hello /on garage x"), None);
        assert_eq!(strip_on("/on garage hi there"), "hi there");
    }
}
