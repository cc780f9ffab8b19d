//! The documents: links that resolve, a configuration reference that names
//! every key the parser accepts (and no key it refuses), the size budgets
//! that keep the top-level files readable, and a user guide that says what
//! bramble is rather than how it was made.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use bramble::config::keys::reference_keys;
use bramble::config::Config;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown file of the project (build outputs and hidden folders aside).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name.starts_with("target") || name == "node_modules" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(root(), &mut out);
    out.sort();
    out
}

/// The text outside fenced code blocks and inline code spans, line by line.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        out.push(kept);
    }
    out
}

/// GitHub's anchor for a heading: the rendered text lower-cased, everything
/// but letters, digits, spaces, `-` and `_` dropped, spaces made `-`; a
/// repeated anchor gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let Some(heading) = line.strip_prefix('#').map(|h| h.trim_start_matches('#')) else { continue };
        if !heading.starts_with(' ') {
            continue;
        }
        let rendered = link_text(heading.trim());
        let slug: String = rendered
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// `[text](dest)` → `text`, for headings that hold links.
fn link_text(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else { break };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else { break };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The destinations of the inline links (`[text](dest)`) and reference
/// definitions (`[name]: dest`) of one file, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        let trimmed = line.trim_start();
        if let Some(def) = trimmed.strip_prefix('[').and_then(|r| r.split_once("]: ")) {
            out.push(def.1.split_whitespace().next().unwrap_or("").to_string());
        }
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let dest = after[..end].split_whitespace().next().unwrap_or("");
            out.push(dest.trim_matches(['<', '>']).to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    assert!(files.len() > 10, "the Markdown files were not found: {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file);
        for dest in links(&text) {
            if dest.is_empty() || dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = dest.split_once('#').unwrap_or((&dest, ""));
            let target = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            let shown = format!("{}: {dest}", file.strip_prefix(root()).unwrap().display());
            if !target.exists() {
                broken.push(format!("{shown} (no such file)"));
                continue;
            }
            if !anchor.is_empty() {
                if target.extension().is_none_or(|e| e != "md") {
                    broken.push(format!("{shown} (an anchor into a file that is not Markdown)"));
                } else if !anchors(&read(&target)).contains(anchor) {
                    broken.push(format!("{shown} (no heading makes #{anchor})"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The anchors are GitHub's: the checker above agrees with what the forge renders.
#[test]
fn anchors_follow_githubs_rules() {
    let text = "# Install on a Raspberry Pi\n## `[[mqtt.trigger]]`\n## `[policy.<source>]`\n\
                ## Voice notes, photos, files\n## Logs: journalctl -u bramble\n## FAQ\n## FAQ\n\
                ## [Link](x.md) here\n## 快速开始\n```\n# not a heading\n```\n";
    let got = anchors(text);
    for want in [
        "install-on-a-raspberry-pi",
        "mqtttrigger",
        "policysource",
        "voice-notes-photos-files",
        "logs-journalctl--u-bramble",
        "faq",
        "faq-1",
        "link-here",
        "快速开始",
    ] {
        assert!(got.contains(want), "{want} not in {got:?}");
    }
    assert!(!got.contains("not-a-heading"), "{got:?}");
}

/// The keys docs/configuration.md documents: `section.key` for each table
/// row under a heading that names a table (`[agent]`, `[[mqtt.trigger]]`,
/// `[policy.<source>]` as `policy.*`).
fn documented_keys(text: &str) -> BTreeSet<String> {
    let mut section: Option<String> = None;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with('#') {
            section = line.split('`').nth(1).filter(|s| s.starts_with('[')).map(|s| {
                let name = s.trim_matches(['[', ']']);
                let mut cleaned = String::new();
                let mut in_angle = false;
                for c in name.chars() {
                    match c {
                        '<' => {
                            in_angle = true;
                            cleaned.push('*');
                        }
                        '>' => in_angle = false,
                        _ if !in_angle => cleaned.push(c),
                        _ => {}
                    }
                }
                cleaned
            });
        } else if let (Some(section), Some(row)) = (&section, line.strip_prefix("| `")) {
            if let Some(key) = row.split('`').next() {
                out.insert(format!("{section}.{key}"));
            }
        }
    }
    out
}

#[test]
fn the_configuration_reference_documents_every_key_and_no_other() {
    let accepted: BTreeSet<String> = reference_keys().into_iter().collect();
    assert!(accepted.len() > 100, "the key list from the types is too short: {accepted:?}");
    let documented = documented_keys(&read(&root().join("docs/configuration.md")));
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "keys the config accepts that docs/configuration.md does not document: {undocumented:?}; \
         keys it documents that the config does not accept: {unknown:?}"
    );
}

/// The reference promises that a key it does not list is an error: every
/// section it documents refuses a misspelt key, naming it.
#[test]
fn every_documented_section_refuses_an_unknown_key() {
    let documented = documented_keys(&read(&root().join("docs/configuration.md")));
    let sections: BTreeSet<&str> = documented.iter().filter_map(|k| k.rsplit_once('.')).map(|(s, _)| s).collect();
    assert!(sections.len() >= 15, "{sections:?}");
    for section in sections {
        let header = match section {
            "mqtt.trigger" | "homeassistant.trigger" | "mcp.server" | "webhook" => format!("[[{section}]]"),
            _ => format!("[{}]", section.replace('*', "mqtt")),
        };
        let text = format!("{header}\nno_such_key = 1\n");
        match Config::parse(&text, Path::new("/etc/bramble/config.toml")) {
            Ok(_) => panic!("{header} accepted an unknown key"),
            Err(e) => assert!(e.to_string().contains("no_such_key"), "{header}: {e}"),
        }
    }
}

/// The top-level files stay a size a newcomer reads (KiB).
#[test]
fn documents_keep_their_size_budgets() {
    for (file, kib) in
        [("README.md", 12), ("ARCHITECTURE.md", 15), ("BENCHMARKS.md", 10), ("SECURITY.md", 12), ("CONTRIBUTING.md", 8)]
    {
        let size = read(&root().join(file)).len();
        assert!(size <= kib * 1024, "{file} is {size} bytes, over its budget of {kib} KiB: move detail into docs/");
    }
}

/// The guide describes the product: no project history in it.
#[test]
fn the_guide_says_what_bramble_is_not_how_it_was_made() {
    let mut found = Vec::new();
    for file in markdown_files().iter().filter(|f| f.starts_with(root().join("docs"))) {
        for (n, line) in read(file).lines().enumerate() {
            let lower = line.to_lowercase();
            let words: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
            let history = words.windows(2).any(|w| {
                matches!(w[0], "issue" | "session" | "wave" | "sprint") && w[1].chars().all(|c| c.is_ascii_digit())
            }) || lower.contains("red team");
            if history {
                found.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "project history in the guide:\n{}", found.join("\n"));
}

/// docs/ renders as one book: every page is in SUMMARY.md (whose links
/// the link test resolves), and book.toml points at it.
#[test]
fn every_guide_page_is_in_the_book() {
    let summary = read(&root().join("docs/SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary).iter().map(|l| root().join("docs").join(l)).collect();
    let missing: Vec<_> = markdown_files()
        .into_iter()
        .filter(|f| f.starts_with(root().join("docs")) && !f.ends_with("SUMMARY.md") && !listed.contains(f))
        .collect();
    assert!(missing.is_empty(), "pages missing from docs/SUMMARY.md: {missing:?}");
    let book = read(&root().join("book.toml"));
    assert!(book.lines().any(|l| l.replace(' ', "") == "src=\"docs\""), "book.toml must say src = \"docs\"");
}

/// README gives the test command CI runs and every Debian package CI
/// installs for it, so a fresh machine can follow it.
#[test]
fn readme_names_the_test_command_and_what_ci_installs_for_it() {
    let readme = read(&root().join("README.md"));
    let ci = read(&root().join(".ci/run"));
    assert!(ci.lines().any(|l| l.trim() == "cargo test"), ".ci/run no longer runs `cargo test`");
    assert!(readme.lines().any(|l| l.trim() == "cargo test"), "README does not give `cargo test`");
    assert!(readme.lines().any(|l| l.trim() == "cargo run --release -- run"), "README does not give the run command");
    let packages: Vec<&str> =
        ci.lines().filter_map(|l| l.split("NEED=\"$NEED ").nth(1)).filter_map(|rest| rest.split('"').next()).collect();
    assert!(packages.len() >= 5, "{packages:?}");
    let install = readme.lines().find(|l| l.trim_start().starts_with("apt-get install")).expect("an apt-get line");
    for package in packages {
        assert!(install.split_whitespace().any(|w| w == package), "README's apt-get line lacks {package}: {install}");
    }
}

/// The tables that say which test proves what (SECURITY.md, docs/sandbox.md,
/// ARCHITECTURE.md's invariants) name tests that exist: a renamed or removed
/// test leaves no claim behind that nothing checks.
#[test]
fn the_tests_the_documents_cite_exist() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut sources = Vec::new();
    rust_files(&root().join("src"), &mut sources);
    rust_files(&root().join("tests"), &mut sources);
    let functions: BTreeSet<String> = sources
        .iter()
        .flat_map(|f| {
            read(f)
                .split("fn ")
                .skip(1)
                .map(|rest| rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>())
                .collect::<Vec<_>>()
        })
        .collect();
    let is_test_name = |name: &str| {
        name.split('_').count() >= 4 && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let mut cited = 0;
    let mut missing = Vec::new();
    for doc in ["SECURITY.md", "ARCHITECTURE.md", "docs/sandbox.md"] {
        for line in read(&root().join(doc)).lines().filter(|l| l.starts_with('|') && l.ends_with('|')) {
            let cells: Vec<&str> = line.split('|').collect();
            let last = cells[cells.len() - 2];
            for (i, span) in last.split('`').enumerate() {
                let name = span.rsplit("::").next().unwrap_or(span);
                if i % 2 == 1 && is_test_name(name) {
                    cited += 1;
                    if !functions.contains(name) {
                        missing.push(format!("{doc}: {span}"));
                    }
                }
            }
        }
    }
    assert!(cited > 50, "only {cited} tests cited: did the tables move?");
    assert!(missing.is_empty(), "documents cite tests that do not exist:\n{}", missing.join("\n"));
}

/// docs/cli.md names every command and every option the real binary's
/// `--help` lists, at every level.
#[test]
fn the_command_line_reference_names_every_command_and_option() {
    fn help(path: &[String]) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .args(path)
            .arg("--help")
            .env_remove("BRAMBLE_CONFIG")
            .output()
            .expect("run bramble --help");
        assert!(out.status.success(), "bramble {path:?} --help: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    let doc = read(&root().join("docs/cli.md"));
    let mut missing = Vec::new();
    let mut seen = 0;
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let text = help(&path);
        let mut section = "";
        for line in text.lines() {
            if !line.starts_with(' ') {
                section = line.trim_end_matches(':');
                continue;
            }
            let first = line.split_whitespace().next().unwrap_or("");
            // Help is wrapped: a continued description is indented deeper than a command or option.
            let indent = line.len() - line.trim_start().len();
            if section == "Commands" && first != "help" && indent == 2 {
                let sub = [path.clone(), vec![first.to_string()]].concat();
                seen += 1;
                let named =
                    doc.contains(&format!("bramble {}", sub.join(" "))) || (path.len() == 1 && doc.contains(first)); // `bramble cron list | show ID | …`
                if !named {
                    missing.push(format!("bramble {}", sub.join(" ")));
                }
                todo.push(sub);
            }
            if section == "Options" && line.trim_start().starts_with('-') && indent <= 6 {
                let spec = line.trim_start().split("  ").next().unwrap_or("");
                for word in spec.split([' ', ',']).filter(|w| w.starts_with("--")) {
                    seen += 1;
                    if !["--help", "--version", "--config"].contains(&word) && !doc.contains(word) {
                        missing.push(format!("bramble {} {word}", path.join(" ")));
                    }
                }
            }
        }
    }
    assert!(seen > 30, "only {seen} commands and options found in --help");
    assert!(missing.is_empty(), "docs/cli.md does not mention: {missing:?}");
}
