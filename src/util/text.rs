//! Text helpers with nothing bramble-specific in them.

use std::borrow::Cow;

/// `text` without `<!-- … -->` comments (an unclosed one runs to the end).
pub fn strip_html_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        match rest[start..].find("-->") {
            Some(end) => rest = &rest[start + end + 3..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whether `text` matches the glob `pattern`: `*` is any run of characters
/// (also none), `?` is exactly one, everything else matches itself. Iterative
/// with one backtrack point, so a pattern of many stars stays linear-ish.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether `c` must not reach a terminal raw: C0 controls, DEL, C1 controls
/// (U+0080–U+009F: U+009B is a one-character CSI for many terminals) and the
/// bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069, and the
/// marks U+200E, U+200F, U+061C), which reorder what the reader sees.
fn is_unsafe(c: char, one_line: bool) -> bool {
    match c {
        '\n' | '\t' => one_line,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}' => true,
        _ => false,
    }
}

/// `text` safe to print to a terminal: every control character but newline
/// and tab shown as an escape (`\x1b`, `\u{9b}`, `\u{202e}`), so text from
/// outside (a command an MQTT publisher asked for, a job's output, a server's
/// error) cannot move the cursor, retitle the window, write the clipboard
/// (OSC 52) or reorder a line. Borrowed when there is nothing to escape.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// [`escape_controls`] for a one-line field: newline, carriage return and
/// tab are escaped too (`\n`, `\r`, `\t`), so the text cannot forge a line.
pub fn escape_line(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

fn escape(text: &str, one_line: bool) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c, one_line)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !is_unsafe(c, one_line) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_for_a_terminal() {
        // OSC 52 (the clipboard), a CSI, C1's one-character CSI, a bidi override.
        let evil = "ls\u{1b}]52;c;ZWNobyBoaQ==\u{7}\u{1b}[2J\u{9b}31m\u{202e}txt.exe\u{7f}\r";
        let shown = escape_controls(evil);
        assert_eq!(shown, "ls\\x1b]52;c;ZWNobyBoaQ==\\x07\\x1b[2J\\u{9b}31m\\u{202e}txt.exe\\x7f\\r");
        assert!(!shown.chars().any(|c| c.is_control()), "{shown}");
        // Newline and tab stay in text, go in a one-line field.
        assert_eq!(escape_controls("a\n\tb"), "a\n\tb");
        assert_eq!(escape_line("a\n\tb\u{2067}"), "a\\n\\tb\\u{2067}");
        // Plain text, other scripts and emoji are untouched and not copied.
        assert!(matches!(escape_controls("Grüße, ĐŒ 日本 🌧 \\x1b"), Cow::Borrowed(_)));
        assert!(matches!(escape_line("df -h"), Cow::Borrowed(_)));
    }

    #[test]
    fn globs_match_stars_and_question_marks() {
        assert!(glob_match("light.*", "light.kitchen"));
        assert!(glob_match("binary_sensor.*_door", "binary_sensor.front_door"));
        assert!(!glob_match("binary_sensor.*_door", "binary_sensor.front_door_battery"));
        assert!(glob_match("switch.kitchen_?", "switch.kitchen_1"));
        assert!(!glob_match("switch.kitchen_?", "switch.kitchen_12"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(!glob_match("light.kitchen", "light.kitchen2"));
        assert!(glob_match("**.*", "x.y"));
    }
}
