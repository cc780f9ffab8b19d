//! Skills: `skills/<name>/SKILL.md`, instructions the agent reads when a task needs them.
//!
//! A skill starts with a YAML frontmatter block:
//!
//! ```text
//! ---
//! name: system-health
//! description: Check temperature, disk, memory and throttling of this board
//! always: false
//! requires:
//!   bins: [vcgencmd]
//!   env: [HA_TOKEN]
//! ---
//! ```
//!
//! nanobot's form, `metadata: {"nanobot": {"requires": {...}, "always": true}}`
//! (or `openclaw`), is read too. `always` skills whose requirements are met are
//! inlined into the system prompt; every skill is listed with its path and
//! whether it is available (and if not, what is missing).
//!
//! The frontmatter is parsed here, not by a YAML crate: the subset skills use
//! (mappings by indentation, plain/quoted scalars, `[a, b]` and `- a` lists,
//! `>`/`|` blocks, JSON flow mappings) is small, and the YAML crates are either
//! deprecated (serde_yaml) or large. Anything outside the subset is an error
//! that names the file and line, logged at start and shown by `bramble check`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::workspace::Workspace;

/// Bytes of a SKILL.md read at most: far beyond a real skill, and a bound on
/// what a planted `/dev/zero` or a runaway file can cost.
const SKILL_FILE_CAP: usize = 1 << 20;

/// One skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// Relative to the workspace (`skills/<dir>/SKILL.md`).
    pub path: String,
    pub always: bool,
    pub requires_bins: Vec<String>,
    pub requires_env: Vec<String>,
    /// Unmet requirements (`bin vcgencmd`, `env HA_TOKEN`); empty when available.
    pub missing: Vec<String>,
}

impl Skill {
    pub fn available(&self) -> bool {
        self.missing.is_empty()
    }
}

/// A SKILL.md that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}: {message}")]
pub struct SkillError {
    /// Relative to the workspace.
    pub path: String,
    /// 1-based line in the file.
    pub line: usize,
    pub message: String,
}

/// The workspace's skills, sorted by name, and the files that could not be read.
pub fn load(workspace: &Path) -> (Vec<Skill>, Vec<SkillError>) {
    let ws = Workspace::strict(workspace);
    let dirs = match ws.subdirectories("skills") {
        Ok(dirs) => dirs,
        Err(e) => {
            return (
                Vec::new(),
                vec![SkillError { path: "skills".into(), line: 1, message: format!("cannot read it: {e}") }],
            )
        }
    };
    let mut skills = Vec::new();
    let mut errors = Vec::new();
    for dir_name in dirs {
        let rel = format!("skills/{dir_name}/SKILL.md");
        let text = match ws.read_text(&rel, SKILL_FILE_CAP) {
            Ok(Some(t)) => t.text,
            Ok(None) => continue,
            Err(e) => {
                errors.push(SkillError { path: rel, line: 1, message: format!("cannot read it: {e}") });
                continue;
            }
        };
        match parse(&text, &dir_name, &rel) {
            Ok(mut s) => {
                s.missing = missing(&s.requires_bins, &s.requires_env);
                skills.push(s);
            }
            Err(e) => errors.push(e),
        }
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    (skills, errors)
}

/// A skill from its file's text (requirements not checked yet).
pub fn parse(text: &str, dir_name: &str, rel: &str) -> Result<Skill, SkillError> {
    let err = |line: usize, message: String| SkillError { path: rel.to_string(), line, message };
    let fm = frontmatter(text).map_err(|(line, m)| err(line, m))?;
    let get_str = |key: &str| -> Result<Option<String>, SkillError> {
        match fm.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(other) => Err(err(1, format!("`{key}` must be a string, not {other}"))),
        }
    };
    let name = get_str("name")?.filter(|n| !n.is_empty()).unwrap_or_else(|| dir_name.to_string());
    let description = get_str("description")?
        .filter(|d| !d.is_empty())
        .ok_or_else(|| err(1, "the frontmatter needs a `description`".into()))?;
    // nanobot / openclaw put `always` and `requires` under metadata.<name>.
    let meta =
        fm.get("metadata").and_then(|m| m.get("nanobot").or_else(|| m.get("openclaw"))).cloned().unwrap_or(Value::Null);
    let always = match fm.get("always").or_else(|| meta.get("always")) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(err(1, format!("`always` must be true or false, not {other}"))),
    };
    let requires = fm.get("requires").or_else(|| meta.get("requires")).cloned().unwrap_or(Value::Null);
    let list = |key: &str| -> Result<Vec<String>, SkillError> {
        match requires.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| match i {
                    Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                    other => Err(err(1, format!("`requires.{key}` must list names, found {other}"))),
                })
                .collect(),
            Some(other) => Err(err(1, format!("`requires.{key}` must be a list, not {other}"))),
        }
    };
    if !(requires.is_null() || requires.is_object()) {
        return Err(err(1, "`requires` must be a mapping with `bins` and/or `env`".into()));
    }
    Ok(Skill {
        name,
        description,
        path: rel.to_string(),
        always,
        requires_bins: list("bins")?,
        requires_env: list("env")?,
        missing: Vec::new(),
    })
}

/// The skill's text without its frontmatter.
pub fn body(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("---") else { return text };
    match rest.find("\n---") {
        Some(end) => {
            let after = &rest[end + 4..];
            after.split_once('\n').map(|(_, b)| b).unwrap_or("").trim_start_matches(['\r', '\n'])
        }
        None => text,
    }
}

/// Unmet requirements: programs not on `PATH`, environment variables unset.
fn missing(bins: &[String], env: &[String]) -> Vec<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut out = Vec::new();
    for b in bins {
        let found = std::env::split_paths(&path).any(|d| is_executable(&d.join(b)));
        if !found {
            out.push(format!("bin {b}"));
        }
    }
    for e in env {
        if std::env::var_os(e).is_none_or(|v| v.is_empty()) {
            out.push(format!("env {e}"));
        }
    }
    out
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

// ---------------------------------------------------------------------------
// The YAML subset
// ---------------------------------------------------------------------------

type Fm<T> = Result<T, (usize, String)>;

struct Line<'a> {
    /// 1-based, in the file.
    no: usize,
    indent: usize,
    text: &'a str,
}

/// The frontmatter as a JSON object. No frontmatter at all is an error: a skill needs a description.
fn frontmatter(text: &str) -> Fm<Map<String, Value>> {
    let mut raw = text.lines().enumerate();
    match raw.next() {
        Some((_, first)) if first.trim_end() == "---" => {}
        _ => return Err((1, "no frontmatter: the file must start with a `---` line".into())),
    }
    let mut lines = Vec::new();
    let mut closed = false;
    for (i, l) in raw {
        if l.trim_end() == "---" {
            closed = true;
            break;
        }
        let no = i + 1;
        let content = l.trim_end();
        let stripped = content.trim_start();
        if stripped.is_empty() || stripped.starts_with('#') {
            continue;
        }
        let lead = &content[..content.len() - stripped.len()];
        if lead.contains('\t') {
            return Err((no, "tabs are not allowed for indentation in YAML".into()));
        }
        lines.push(Line { no, indent: lead.len(), text: stripped });
    }
    if !closed {
        return Err((1, "the frontmatter is not closed by a `---` line".into()));
    }
    if lines.is_empty() {
        return Ok(Map::new());
    }
    let mut i = 0;
    let indent = lines[0].indent;
    let v = block(&lines, &mut i, indent)?;
    if let Some(l) = lines.get(i) {
        return Err((l.no, "unexpected indentation".into()));
    }
    match v {
        Value::Object(m) => Ok(m),
        _ => Err((lines[0].no, "the frontmatter must be a mapping of `key: value` lines".into())),
    }
}

fn block(lines: &[Line<'_>], i: &mut usize, indent: usize) -> Fm<Value> {
    if lines[*i].text == "-" || lines[*i].text.starts_with("- ") {
        let mut items = Vec::new();
        while let Some(l) = lines.get(*i).filter(|l| l.indent == indent) {
            let Some(rest) = l.text.strip_prefix('-').filter(|r| r.is_empty() || r.starts_with(' ')) else {
                return Err((l.no, "expected a `- item` line like the ones above".into()));
            };
            *i += 1;
            let rest = rest.trim();
            if rest.is_empty() {
                match lines.get(*i).filter(|n| n.indent > indent) {
                    Some(n) => items.push(block(lines, i, n.indent)?),
                    None => items.push(Value::Null),
                }
            } else {
                items.push(scalar(rest, l.no)?);
            }
        }
        return Ok(Value::Array(items));
    }
    let mut map = Map::new();
    while let Some(l) = lines.get(*i).filter(|l| l.indent == indent) {
        let (key, value) = split_key(l.text).ok_or((l.no, format!("expected `key: value`, found `{}`", l.text)))?;
        if map.contains_key(key) {
            return Err((l.no, format!("`{key}` appears twice")));
        }
        *i += 1;
        let v = match value {
            "" => match lines.get(*i).filter(|n| n.indent > indent) {
                Some(n) => block(lines, i, n.indent)?,
                None => Value::Null,
            },
            ">" | ">-" | "|" | "|-" => {
                let mut parts = Vec::new();
                while let Some(n) = lines.get(*i).filter(|n| n.indent > indent) {
                    parts.push(n.text);
                    *i += 1;
                }
                Value::String(parts.join(if value.starts_with('>') { " " } else { "\n" }))
            }
            v => scalar(v, l.no)?,
        };
        map.insert(key.to_string(), v);
    }
    if let Some(l) = lines.get(*i).filter(|l| l.indent > indent) {
        return Err((l.no, "unexpected indentation".into()));
    }
    Ok(Value::Object(map))
}

/// `key: value` → (key, value); the key is a plain word.
fn split_key(text: &str) -> Option<(&str, &str)> {
    let pos = text.char_indices().find(|&(i, c)| c == ':' && text[i + 1..].chars().next().is_none_or(|n| n == ' '))?.0;
    let key = text[..pos].trim();
    let key = key.trim_matches(|c| c == '"' || c == '\'');
    let ok = !key.is_empty() && key.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then(|| (key, text[pos + 1..].trim()))
}

/// A quoted scalar without a ` # comment` after its closing quote.
fn strip_comment_after_quote(t: &str) -> &str {
    let Some(q) = t.chars().next().filter(|c| *c == '"' || *c == '\'') else { return t };
    let bytes = t.as_bytes();
    let mut i = 1;
    while i < bytes.len() {
        let b = bytes[i];
        if q == '"' && b == b'\\' {
            i += 2;
            continue;
        }
        if b == q as u8 {
            if q == '\'' && bytes.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            let rest = t[i + 1..].trim_start();
            return if rest.starts_with('#') { &t[..=i] } else { t };
        }
        i += 1;
    }
    t
}

fn scalar(text: &str, no: usize) -> Fm<Value> {
    let t = strip_comment_after_quote(text.trim());
    if t.starts_with('"') {
        return serde_json::from_str::<String>(t).map(Value::String).map_err(|_| {
            (no, format!("bad double-quoted string `{t}` (unterminated, or text after the closing quote)"))
        });
    }
    if let Some(inner) = t.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .filter(|s| !s.replace("''", "").contains('\''))
            .ok_or((no, format!("bad single-quoted string `{t}`")))?;
        return Ok(Value::String(inner.replace("''", "'")));
    }
    if t.starts_with('{') {
        return serde_json::from_str::<Value>(t)
            .map_err(|e| (no, format!("a `{{…}}` mapping must be valid JSON here ({e})")));
    }
    if let Some(inner) = t.strip_prefix('[') {
        if let Ok(v) = serde_json::from_str::<Value>(t) {
            return Ok(v);
        }
        let inner = inner.strip_suffix(']').ok_or((no, format!("the list `{t}` is not closed by `]`")))?;
        if inner.contains(['[', ']', '{', '}']) {
            return Err((no, format!("nested lists or mappings in `{t}` are not supported: use JSON")));
        }
        let items: Fm<Vec<Value>> =
            inner.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| scalar(s, no)).collect();
        return items.map(Value::Array);
    }
    // A comment after a plain value.
    let t = t.split(" #").next().unwrap_or(t).trim();
    Ok(match t {
        "true" | "True" | "TRUE" | "yes" | "Yes" => Value::Bool(true),
        "false" | "False" | "FALSE" | "no" | "No" => Value::Bool(false),
        "null" | "~" | "Null" => Value::Null,
        _ if t.starts_with(['&', '*', '!', '|', '>', '@', '`']) => {
            return Err((no, format!("`{t}`: YAML anchors, tags and this kind of value are not supported")))
        }
        _ => Value::String(t.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Skill, SkillError> {
        parse(text, "dir", "skills/dir/SKILL.md")
    }

    #[test]
    fn the_documented_forms_parse() {
        let s = p("---\nname: health\ndescription: \"Check the board\" \nalways: true\nrequires:\n  bins: [vcgencmd, df]\n  env:\n    - HOME\n---\nbody\n").unwrap();
        assert_eq!(s.name, "health");
        assert_eq!(s.description, "Check the board");
        assert!(s.always);
        assert_eq!(s.requires_bins, ["vcgencmd", "df"]);
        assert_eq!(s.requires_env, ["HOME"]);

        let s = p("---\ndescription: >\n  folded\n  text\n# comment\nmetadata: {\"nanobot\": {\"always\": true, \"requires\": {\"bins\": [\"git\"]}}}\n---\n").unwrap();
        assert_eq!(s.name, "dir", "the directory name by default");
        assert_eq!(s.description, "folded text");
        assert!(s.always);
        assert_eq!(s.requires_bins, ["git"]);

        let s = p("---\ndescription: 'it''s fine' # a comment\nalways: no\n---\n").unwrap();
        assert_eq!(s.description, "it's fine");
        assert!(!s.always);
    }

    #[test]
    fn bad_frontmatter_names_the_file_and_line() {
        let cases = [
            ("no frontmatter\n", 1, "no frontmatter"),
            ("---\ndescription: x\n", 1, "not closed"),
            ("---\ndescription: \"unterminated\nalways: true\n---\n", 2, "bad double-quoted string"),
            ("---\ndescription: x\n\talways: true\n---\n", 3, "tabs"),
            ("---\ndescription: x\nrequires:\n  bins: [a, [b]]\n---\n", 4, "nested lists"),
            ("---\ndescription: x\njust words\n---\n", 3, "expected `key: value`"),
            ("---\ndescription: x\n  indented: y\n---\n", 3, "unexpected indentation"),
            ("---\ndescription: x\ndescription: y\n---\n", 3, "appears twice"),
            ("---\nname: n\n---\n", 1, "needs a `description`"),
            ("---\ndescription: x\nalways: maybe\n---\n", 1, "`always` must be true or false"),
            ("---\ndescription: x\nmetadata: {nanobot: 1}\n---\n", 3, "must be valid JSON"),
        ];
        for (text, line, what) in cases {
            let e = p(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(what), "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("skills/dir/SKILL.md:{line}: ")), "{e}");
        }
    }

    #[test]
    fn load_checks_requirements_and_reports_bad_files() {
        let ws = tempfile::tempdir().unwrap();
        let write = |dir: &str, text: &str| {
            std::fs::create_dir_all(ws.path().join("skills").join(dir)).unwrap();
            std::fs::write(ws.path().join("skills").join(dir).join("SKILL.md"), text).unwrap();
        };
        write("shell", "---\ndescription: uses sh\nrequires:\n  bins: [sh]\n---\n");
        write("nope", "---\ndescription: needs a unicorn\nrequires: {\"bins\": [\"unicorn-9f2\"], \"env\": [\"BRAMBLE_NO_SUCH_VAR\"]}\n---\n");
        write("broken", "---\ndescription: [x\n---\n");
        let (skills, errors) = load(ws.path());
        assert_eq!(skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["nope", "shell"]);
        assert!(skills[1].available());
        assert_eq!(skills[0].missing, ["bin unicorn-9f2", "env BRAMBLE_NO_SUCH_VAR"]);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, "skills/broken/SKILL.md");
        assert!(errors[0].message.contains("not closed by `]`"), "{}", errors[0]);
    }

    #[test]
    fn shipped_skills_parse() {
        let shipped: Vec<_> =
            crate::config::templates::WORKSPACE.iter().filter(|(rel, _)| rel.starts_with("skills/")).collect();
        assert_eq!(shipped.len(), 2);
        for (rel, text) in shipped {
            let dir = rel.split('/').nth(1).unwrap();
            let s = parse(text, dir, rel).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.name, dir);
            assert!(!s.always);
            assert!(body(text).starts_with("# "), "{rel}");
        }
    }

    #[test]
    fn body_drops_the_frontmatter() {
        assert_eq!(body("---\na: b\n---\n\nHello\n"), "Hello\n");
        assert_eq!(body("no frontmatter"), "no frontmatter");
    }
}
