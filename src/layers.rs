//! The crate's layers, checked: a module may use only modules of its own
//! layer or a lower one (see `ARCHITECTURE.md`, "Layers").
//!
//! rust-analyzer keeps its architecture invariants as tests ("tidy"); so does
//! this file. It reads every source file, collects the `crate::<module>` paths
//! in `use` lines and in code (not in comments, not in a file's
//! `#[cfg(test)] mod tests` tail) and fails on a path that goes up.

/// From the bottom up. A module may use its own layer and everything below.
pub const LAYERS: &[(&str, &[&str])] = &[
    // Helpers that could have been in std; the path confinement; logging setup.
    ("leaf", &["util", "workspace", "logging"]),
    // The vocabulary every layer speaks: targets, messages, the queues between channels and the agent.
    ("vocabulary", &["bus"]),
    ("configuration", &["config"]),
    // Independent services: the LLM backends, the command sandbox, the scheduler's core.
    ("services", &["provider", "sandbox", "scheduler"]),
    // How reports reach channels (outbox, dispatcher, the Channel trait); who may do what.
    ("delivery", &["delivery", "policy"]),
    // Protocol clients (Home Assistant, Telegram, the MQTT link): tools and channels both hold them.
    ("clients", &["clients"]),
    ("tools", &["tools"]),
    ("agent", &["agent"]),
    // What runs without a chat waiting: jobs, the heartbeat, triggers.
    ("work", &["work"]),
    // Telegram and MQTT: they feed the bus and implement delivery's Channel.
    ("channels", &["channels"]),
    // Several boards, one chat: on the MQTT channel's link, in front of the agent's queue.
    ("fleet", &["fleet"]),
    // The daemon: the only place that builds and runs everything together.
    ("application", &["daemon"]),
    ("interface", &["cli"]),
];

/// The layer index of a top-level module, if it is one.
pub fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

/// Every `crate::<module>` a source text refers to, with its line number.
pub fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = Vec::new();
    let mut in_group = false; // inside `use crate::{ … }` spanning lines
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                in_group = !group.contains('}');
                out.extend(group_heads(group).map(|m| (n + 1, m)));
            } else {
                let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push((n + 1, name));
            }
            rest = after;
        }
        if in_group && !code.contains("crate::") {
            out.extend(group_heads(code).map(|m| (n + 1, m)));
            in_group = !code.contains('}');
        }
    }
    out
}

/// The first segment of each path in a `{a::b, c, d::{e}}` group (one line of it).
fn group_heads(group: &str) -> impl Iterator<Item = String> + '_ {
    let mut depth = 0usize;
    let mut heads = Vec::new();
    let mut at_start = true;
    let mut word = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_start = true,
            c if (c.is_alphanumeric() || c == '_') && at_start && depth == 0 => word.push(c),
            _ if !word.is_empty() => {
                heads.push(std::mem::take(&mut word));
                at_start = false;
            }
            _ => {}
        }
    }
    if !word.is_empty() {
        heads.push(word);
    }
    heads.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn no_module_uses_a_layer_above_its_own() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let mut wrong = Vec::new();
        let mut seen_modules = std::collections::BTreeSet::new();
        for file in files {
            let rel = file.strip_prefix(&src).unwrap();
            let top = rel.components().next().unwrap().as_os_str().to_string_lossy();
            let top = top.trim_end_matches(".rs");
            if matches!(top, "lib" | "main" | "layers") {
                continue;
            }
            seen_modules.insert(top.to_string());
            let own = layer_of(top).unwrap_or_else(|| panic!("src/{top} is in no layer: add it to LAYERS"));
            for (line, used) in crate_paths(&std::fs::read_to_string(&file).unwrap()) {
                if let Some(theirs) = layer_of(&used) {
                    if theirs > own {
                        wrong.push(format!(
                            "src/{}:{line}: `{top}` ({}) uses `{used}` ({})",
                            rel.display(),
                            LAYERS[own].0,
                            LAYERS[theirs].0
                        ));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "imports against the layers:\n{}", wrong.join("\n"));
        // Every layer's modules exist (a renamed module must be renamed here too).
        for (_, modules) in LAYERS {
            for m in *modules {
                assert!(seen_modules.contains(*m), "LAYERS names `{m}`, which is not in src/");
            }
        }
    }

    /// Channels talk to the agent through the bus; besides it they may know
    /// only the command table (parse, menu), `SessionActivity` and
    /// `ProgressSink` (what a chat's turn is doing), never the `Agent`.
    #[test]
    fn channels_never_hold_the_agent() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/channels");
        let mut files = Vec::new();
        sources(&dir, &mut files);
        let allowed = ["crate::agent::SessionActivity", "crate::agent::ProgressSink", "crate::agent::commands::"];
        let mut wrong = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let text = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]);
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let mut rest = code;
                while let Some(i) = rest.find("crate::agent") {
                    if !allowed.iter().any(|a| rest[i..].starts_with(a)) {
                        wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                    }
                    rest = &rest[i + 1..];
                }
            }
        }
        assert!(wrong.is_empty(), "channels reaching into the agent:\n{}", wrong.join("\n"));
    }

    /// The composition root is one file: nothing else makes the agent, the
    /// bus, the scheduler or the channel registry (tests excepted).
    #[test]
    fn only_the_composition_root_assembles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let makers = ["Agent::new(", "Bus::new(", "Scheduler::new(", "Channels::with_log("];
        let mut wrong = Vec::new();
        for file in files.iter().filter(|f| !f.ends_with("daemon/assemble.rs")) {
            let text = std::fs::read_to_string(file).unwrap();
            let text = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]);
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if makers
                    .iter()
                    .any(|m| code.contains(m) && !code.contains(&format!("fn {}", &m[m.find("::").unwrap() + 2..])))
                {
                    wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(files.len() > 50, "the sources were found");
        assert!(wrong.is_empty(), "assembled outside daemon/assemble.rs:\n{}", wrong.join("\n"));
    }

    /// Who is speaking is decided once: a channel's name becomes a `bus::Channel`
    /// in the vocabulary layer, and everything else matches the enum. A
    /// `match` or comparison on a channel's name anywhere else is how a job made
    /// in the terminal once ran under `[policy.terminal]`.
    #[test]
    fn identity_is_decoded_only_in_the_vocabulary() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let names = ["cli", "telegram", "feishu", "matrix", "mqtt", "system", "homeassistant"];
        let mut wrong = Vec::new();
        for file in files.iter().filter(|f| !f.ends_with("bus.rs") && !f.ends_with("layers.rs")) {
            let text = std::fs::read_to_string(file).unwrap();
            let text = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]);
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let decodes = names.iter().any(|name| {
                    let quoted = format!("\"{name}\"");
                    [format!("{quoted} =>"), format!("{quoted} |"), format!("== {quoted}"), format!("!= {quoted}")]
                        .iter()
                        .any(|p| code.contains(p.as_str()))
                });
                if decodes {
                    wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(wrong.is_empty(), "channel names decoded outside src/bus.rs:\n{}", wrong.join("\n"));
    }

    /// No process-wide mutable state outside `util/`, but for the listed
    /// places still waiting for their owner (issue 38 removes them one by one).
    #[test]
    fn no_mutable_statics_outside_util() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let mutable = ["Mutex<", "RwLock<", "AtomicU", "AtomicI", "AtomicBool", "OnceLock<", "Cell<"];
        // Each entry: a file that holds one, and why it may.
        let waiting: &[&str] = &[
            // tracing's subscriber is process-wide by nature; this is its reload handle.
            "logging.rs",
            // Whether this kernel has openat2: a fact about the machine, probed once.
            "workspace.rs",
            // One HTTP client (its connection pool and CA store) for every Telegram call of the process.
            "clients/telegram.rs",
            // The helper binary's path (`/proc/self/exe`), written once at start before anything runs.
            "sandbox/mod.rs",
        ];
        let mut wrong = Vec::new();
        for file in files.iter().filter(|f| !f.starts_with(root.join("util"))) {
            let rel = file.strip_prefix(&root).unwrap().display().to_string();
            if waiting.contains(&rel.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            let text = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]);
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default().trim_start();
                if code.starts_with("static ") && mutable.iter().any(|m| code.contains(m)) {
                    wrong.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
        assert!(wrong.is_empty(), "process-wide mutable statics outside util/:\n{}", wrong.join("\n"));
    }

    /// The middle layers return typed errors: a caller matches on what went
    /// wrong instead of on a sentence. `FromStr` (what clap and config read
    /// through) may say why in words; the listed files are still waiting.
    #[test]
    fn the_middle_layers_return_typed_errors() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let middle = ["bus.rs", "agent/", "work/", "provider/", "delivery/", "policy/", "scheduler/", "tools/"];
        // Each entry: a file or folder left out, and why.
        let outside: &[&str] = &[
            // Text formats read from users and files: the error is the sentence shown at FILE:LINE:COL.
            "scheduler/cron.rs",
            "scheduler/schedule.rs",
            "scheduler/store.rs",
            // The MCP client's errors are JSON-RPC errors and their messages, shown to the model as they come.
            "tools/mcp/",
            // Waiting: the search engines' errors are redacted as text before the model sees them.
            "tools/search.rs",
        ];
        let mut files = Vec::new();
        sources(&root, &mut files);
        let mut wrong = Vec::new();
        for file in &files {
            let rel = file.strip_prefix(&root).unwrap().display().to_string();
            if !middle.iter().any(|m| rel.starts_with(m)) || outside.iter().any(|o| rel.starts_with(o)) {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            let text = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]);
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let parse_boundary = code.contains("fn from_str(") || code.contains("fn parse(text: &str");
                if code.contains(", String>") && code.contains("Result<") && !parse_boundary {
                    wrong.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "`Result<_, String>` in the middle layers (give it a thiserror type):\n{}",
            wrong.join("\n")
        );
    }

    /// Only the composition root (`src/daemon/`) and `util/tasks.rs` start
    /// tasks: a long-running loop elsewhere is a struct with `run(self,
    /// Shutdown)` that the daemon spawns as a named, supervised service. The
    /// listed files start short-lived tasks bounded by what they serve, or are
    /// waiting for their owner (issue 38), or are a command's own root.
    #[test]
    fn only_the_composition_root_spawns() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        // Each entry: a file that spawns, and why it may.
        let allowed: &[&str] = &[
            // Job runs, in the scheduler's own JoinSet: at most one per job, reaped and cancelled by the loop.
            "scheduler/actor.rs",
            // Sub-agent runs: at most `[agent] max_subagents` (permits), cancelled with their session.
            "agent/subagent.rs",
            // The usage ledger's delayed flush: one at a time, holding only a weak reference.
            "agent/usage.rs",
            // The typing indicator: at most one per chat, ending with the chat's turn or the stop.
            "channels/telegram/mod.rs",
            // The same in a Matrix room.
            "channels/matrix/inbound.rs",
            // The same in a Signal chat.
            "channels/signal/inbound.rs",
            // The same in a Discord channel, and its status message: one worker per channel while its turn runs.
            "channels/discord/inbound.rs",
            "channels/discord/progress.rs",
            // A chat's status message: one worker per chat while its turn runs.
            "channels/telegram/progress.rs",
            // The same in a Matrix room or a Feishu / Lark chat (the engine both share).
            "channels/status_edits.rs",
            // One task per webhook connection: at most `[webhooks] max_connections` (permits), each bounded in time.
            "channels/webhook/server.rs",
            // One alert write per scheduler pass (missed runs, removed jobs).
            "work/jobs.rs",
            // Forgetting the one warm jail after it idled: one at a time (the slot).
            "sandbox/warm.rs",
            // Waiting for their owner: each MCP server's supervisor, and its
            // transport's reader tasks, for the life of one connection; started
            // by the daemon's `mcp servers` service and stopped at its abort.
            "tools/mcp/server.rs",
            "tools/mcp/transport/stdio.rs",
            "tools/mcp/transport/http.rs",
            // `bramble agent` and `bramble cron run` are their own roots: their
            // tasks (printer, announcements, Ctrl-C watch) live as long as the command.
            "cli/chat.rs",
            "cli/cron.rs",
        ];
        let mut wrong = Vec::new();
        let mut spawning = std::collections::BTreeSet::new();
        for file in &files {
            let rel = file.strip_prefix(&root).unwrap().display().to_string();
            let text = std::fs::read_to_string(file).unwrap();
            let text = text.find("#[cfg(test)]\nmod ").map_or(text.as_str(), |i| &text[..i]);
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if !starts_a_task(code) {
                    continue;
                }
                spawning.insert(rel.clone());
                if !(rel.starts_with("daemon/") || rel == "util/tasks.rs" || allowed.contains(&rel.as_str())) {
                    wrong.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
        assert!(files.len() > 50, "the sources were found");
        assert!(spawning.contains("daemon/mod.rs"), "the daemon's own spawns are seen");
        assert!(
            wrong.is_empty(),
            "tasks started outside the composition root (make the loop a service the daemon spawns):\n{}",
            wrong.join("\n")
        );
        let stale: Vec<_> = allowed.iter().filter(|f| !spawning.contains(**f)).collect();
        assert!(stale.is_empty(), "allowed to spawn but no longer does (take it off the list): {stale:?}");
    }

    /// Whether a line of code starts an async task: `tokio::spawn(…)` or
    /// `<set>.spawn(<future>)`, not a process (`.spawn()`) nor a thread (`spawn(move || …)`).
    fn starts_a_task(code: &str) -> bool {
        code.match_indices("spawn(").any(|(i, _)| {
            let before = &code[..i];
            let arg = code[i + "spawn(".len()..].trim_start();
            let method = before.ends_with('.') || before.ends_with("::");
            let thread = arg.starts_with("move |") || arg.starts_with('|') || before.ends_with("thread::");
            method && !arg.starts_with(')') && !thread
        })
    }

    #[test]
    fn task_starts_are_told_from_processes_and_threads() {
        assert!(starts_a_task("    tokio::spawn(async move {"));
        assert!(starts_a_task("let h = set.spawn(run(x));"));
        assert!(starts_a_task("tokio::task::spawn(f)"));
        assert!(!starts_a_task("let child = command(&spec).spawn()?;"));
        assert!(!starts_a_task("std::thread::spawn(move || {"));
        assert!(!starts_a_task("Builder::new().stack_size(64).spawn(move || {"));
        assert!(!starts_a_task("s.spawn(|| work())"));
        assert!(!starts_a_task("tokio::task::spawn_blocking(f)"));
        assert!(!starts_a_task("pub fn spawn(x: u8) {"));
    }

    /// Rooms a reader can walk through: no file over 900 lines of non-test
    /// code, no function over 100 lines (from `fn` to its closing brace).
    #[test]
    fn files_and_functions_stay_readable() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let mut wrong = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]);
            let lines: Vec<&str> = code.lines().collect();
            if lines.len() > 900 {
                wrong.push(format!("{}: {} lines of non-test code", file.display(), lines.len()));
            }
            for (start, line) in lines.iter().enumerate() {
                let Some(name) = fn_name(line) else { continue };
                let (mut depth, mut opened) = (0i64, false);
                for (end, body) in lines.iter().enumerate().skip(start) {
                    let code = body.split("//").next().unwrap_or_default();
                    depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
                    opened |= code.contains('{');
                    if opened && depth <= 0 {
                        if end - start + 1 > 100 {
                            wrong.push(format!(
                                "{}:{}: fn {name} is {} lines",
                                file.display(),
                                start + 1,
                                end - start + 1
                            ));
                        }
                        break;
                    }
                    if !opened && code.trim_end().ends_with(';') {
                        break; // a declaration without a body
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "too long to read in one go:\n{}", wrong.join("\n"));
    }

    /// The name of the function a line starts, if it starts one.
    fn fn_name(line: &str) -> Option<&str> {
        let mut rest = line.trim_start();
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let rest = rest.strip_prefix("fn ")?;
        Some(rest.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or(rest))
    }

    #[test]
    fn paths_are_found_in_uses_groups_and_code() {
        let text = "use crate::bus::Target;\nuse crate::{agent::Agent, config,\n    channels::{a, b}};\n\
                    // crate::cli in a comment\nlet x = crate::daemon::run();\n#[cfg(test)]\nmod tests { crate::cli }";
        let got: Vec<String> = crate_paths(text).into_iter().map(|(_, m)| m).collect();
        assert_eq!(got, ["bus", "agent", "config", "channels", "daemon"]);
        assert!(layer_of("util") < layer_of("cli"));
    }
}
