//! Text helpers with nothing bramble-specific in them.

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

#[cfg(test)]
mod tests {
    use super::*;

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
