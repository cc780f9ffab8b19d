//! Every error of a config file at once, in plain words.
//!
//! serde stops at the first error, so a file with three mistakes took three
//! rounds of `bramble check`. Here the file is parsed once into a table that
//! keeps positions (`toml::de::DeTable`); the config is read from it, and
//! each error's entry is taken out and the rest read again, until it reads or
//! [`MAX_ERRORS`] are found. Syntax errors come all at once from the parser
//! (the rest of the file cannot be trusted then, so nothing more is read).
//!
//! serde's words (`invalid type: string "x", expected u32`, `unknown field`)
//! are for programmers: [`plain`] says the same to the user, with what they
//! wrote and a close name when a key or section is misspelled.

use std::ops::Range;

use serde::Deserialize as _;
use toml::de::{DeTable, DeValue};

use super::Config;

/// At most this many errors are reported for one file.
const MAX_ERRORS: usize = 20;

/// One error: where in the text (a byte span) and what.
pub(super) type Found = (Option<Range<usize>>, String);

/// Read `text` as a config: the config, or every error found (in file order).
pub(super) fn read(text: &str) -> Result<Config, Vec<Found>> {
    let (mut table, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        return Err(syntax.iter().map(|e| (e.span(), plain(e.message().trim(), text, e.span(), &[]))).collect());
    }
    let mut errors: Vec<Found> = Vec::new();
    loop {
        match Config::deserialize(toml::de::Deserializer::from(table.clone())) {
            Ok(config) if errors.is_empty() => return Ok(config),
            Ok(_) => break,
            Err(e) => {
                let span = e.span();
                let removed = span.as_ref().and_then(|s| remove_at(table.get_mut(), s.start));
                let path = removed.as_deref().unwrap_or(&[]);
                errors.push((span.clone(), plain(e.message().trim(), text, span, path)));
                if removed.is_none() || errors.len() >= MAX_ERRORS {
                    break;
                }
            }
        }
    }
    errors.sort_by_key(|(span, _)| span.as_ref().map_or(usize::MAX, |s| s.start));
    Err(errors)
}

/// Take out the innermost entry whose key or value holds byte `at`; its
/// path of keys (`["agent", "modle"]`), or `None` when no entry holds it.
fn remove_at(table: &mut DeTable<'_>, at: usize) -> Option<Vec<String>> {
    let holds = |s: Range<usize>| s.contains(&at) || s.start == at;
    let mut hit: Option<String> = None;
    for (key, value) in table.iter_mut() {
        let inner = match value.get_mut() {
            DeValue::Table(t) => remove_at(t, at),
            DeValue::Array(items) => items.iter_mut().find_map(|item| match item.get_mut() {
                DeValue::Table(t) => remove_at(t, at),
                _ => None,
            }),
            _ => None,
        };
        if let Some(mut path) = inner {
            path.insert(0, key.get_ref().to_string());
            return Some(path);
        }
        if hit.is_none() && (holds(key.span()) || holds(value.span())) {
            hit = Some(key.get_ref().to_string());
        }
    }
    let key = hit?;
    table.remove(key.as_str());
    Some(vec![key])
}

/// serde's message said to a user: what was expected, what was found (the
/// text at `span`), a close name for a misspelled key. `path` is where the
/// entry was (`["heartbeat", "every"]`), empty when not known.
pub(super) fn plain(message: &str, text: &str, span: Option<Range<usize>>, path: &[String]) -> String {
    let found = span.and_then(|s| text.get(s)).map(str::trim).filter(|s| !s.is_empty() && s.len() <= 80);
    if let Some(rest) = message.strip_prefix("unknown field `") {
        return unknown(rest, path);
    }
    let Some(rest) = message.strip_prefix("invalid type: ") else {
        return message.to_string();
    };
    let expected = rest.split_once(", expected ").map_or("", |(_, e)| e);
    let shown = found.map(|f| format!(", found `{f}`")).unwrap_or_default();
    let what = match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" | "i8" | "i16" | "i32" | "i64" | "isize" | "an integer" => {
            "a whole number, like `10`".to_string()
        }
        "f32" | "f64" | "a float" => "a number, like `0.5`".to_string(),
        "a boolean" => "`true` or `false`".to_string(),
        "a string" => "text in quotes, like `\"…\"`".to_string(),
        "a sequence" => match found {
            Some(f) => format!("a list like `[{f}]`"),
            None => "a list like `[111]`".to_string(),
        },
        e if e.starts_with("struct ") || e == "a map" => "a section (a table like `[name]`)".to_string(),
        _ => return message.to_string(),
    };
    let at = match path {
        [] => String::new(),
        [key] => format!("`{key}`: "),
        [.., section, key] => format!("[{section}] `{key}`: "),
    };
    format!("{at}expected {what}{shown}")
}

/// `unknown field `x`, expected one of `a`, `b`` as a user reads it.
fn unknown(rest: &str, path: &[String]) -> String {
    let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
    let choices: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let close = choices
        .iter()
        .copied()
        .filter(|c| distance(c, name) <= 2.max(name.len() / 4))
        .min_by_key(|c| distance(c, name));
    let top = path.len() <= 1;
    let what = match (top, path.len()) {
        (true, _) => format!("unknown section `{name}`"),
        (false, n) => format!("unknown key `{name}` in [{}]", path[..n - 1].join(".")),
    };
    match close {
        Some(c) => format!("{what}: did you mean `{c}`?"),
        None if !choices.is_empty() => format!("{what}: expected one of {}", choices.join(", ")),
        None => what,
    }
}

/// Edit distance (Levenshtein), for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut row = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            row.push((prev[j] + cost).min(prev[j + 1] + 1).min(row[j] + 1));
        }
        prev = row;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        read(text).err().unwrap_or_default().into_iter().map(|(_, m)| m).collect()
    }

    #[test]
    fn every_error_of_a_file_at_once_in_plain_words() {
        let text = "[hearbeat]\nevery = \"1h\"\n\n[agent]\nmax_iterations = \"ten\"\nmodle = \"m\"\n\n[telegram]\nallow_from = 111\n\n[heartbeat]\nevery = 60\n";
        let found = errors(text);
        assert_eq!(found.len(), 5, "{found:#?}");
        assert_eq!(found[0], "unknown section `hearbeat`: did you mean `heartbeat`?");
        assert_eq!(found[1], "[agent] `max_iterations`: expected a whole number, like `10`, found `\"ten\"`");
        assert_eq!(found[2], "unknown key `modle` in [agent]: did you mean `model`?");
        assert_eq!(found[3], "[telegram] `allow_from`: expected a list like `[111]`, found `111`");
        assert!(found[4].starts_with("`60` has no unit: did you mean `60m`?"), "{}", found[4]);
    }

    #[test]
    fn syntax_errors_come_all_at_once_and_stop_there() {
        let found = errors("[agent\nmodel = \"m\"\n[exec]\ntimeout = \n");
        assert!(found.len() >= 2, "{found:#?}");
    }

    #[test]
    fn a_file_of_mistakes_stops_at_the_limit() {
        let text: String = (0..50).map(|i| format!("[nosuch{i}]\nx = 1\n")).collect();
        assert_eq!(errors(&text).len(), MAX_ERRORS);
        // Errors inside arrays of tables and deep tables are found and taken out one by one.
        let text = "[[provider]]\nname = \"a\"\nkindd = \"openai\"\n[[provider]]\nname = \"b\"\ntimeout = 5\n";
        let found = errors(text);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(found[0], "unknown key `kindd` in [provider]: did you mean `kind`?");
        assert!(found[1].starts_with("`5` has no unit"), "{}", found[1]);
    }

    #[test]
    fn a_good_file_reads() {
        assert!(read("[agent]\nmodel = \"m\"\n").is_ok());
        assert_eq!(distance("hearbeat", "heartbeat"), 1);
    }
}
