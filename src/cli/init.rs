//! `bramble init`: a commented config.toml, the env file and the workspace
//! templates; never overwrites a file.
//!
//! On a terminal it first asks what a new owner would otherwise look up in
//! the config reference — the provider, the model, where the key comes from,
//! Telegram, MQTT — then writes the answers into the config (added as keys
//! under their sections, every comment kept; a key already set is kept, so
//! re-running only adds), puts typed secrets into the 0600 env file, and runs
//! `doctor`'s provider and Telegram checks. Scripts pass the same as flags
//! (`--non-interactive` asks nothing).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use super::args::{InitSetup, ProviderChoice};
use crate::config::{self, templates};
use crate::util;

pub(super) async fn init(
    explicit: Option<&Path>,
    workspace: Option<&Path>,
    setup: InitSetup,
) -> anyhow::Result<ExitCode> {
    let config_path = explicit.map(Path::to_path_buf).unwrap_or_else(config::default_config_path);
    let mut text = templates::CONFIG_TOML.to_string();
    if let Some(ws) = workspace {
        let ws = std::path::absolute(ws).with_context(|| format!("cannot resolve {}", ws.display()))?;
        let line = format!("workspace = {}", toml_string(&ws.to_string_lossy()));
        text = text.replacen("# workspace = \"~/.local/share/bramble/workspace\"", &line, 1);
    }
    let wrote = util::fs::write_new(&config_path, text.as_bytes())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    report_init(&config_path, wrote);
    let env_path = config::env::path();
    let wrote = util::fs::write_new(&env_path, config::env::TEMPLATE.as_bytes())
        .with_context(|| format!("cannot write {}", env_path.display()))?;
    report_init(&env_path, wrote);
    let ask = !setup.non_interactive && std::io::stdin().is_terminal();
    let answers = if ask { ask_all(setup)? } else { Answers::from_flags(setup)? };
    let asked = !answers.is_empty();
    if asked {
        write_answers(&config_path, &env_path, &answers)?;
    }
    // Read back what is now there (it may be the user's own file) to find the workspace.
    let loaded = config::load(Some(&config_path))?;
    let ws = match workspace {
        Some(ws) => ws.to_path_buf(),
        None => loaded.paths.workspace.clone(),
    };
    std::fs::create_dir_all(&ws).with_context(|| format!("cannot create the workspace {}", ws.display()))?;
    // The workspace may already hold what earlier commands left: never write through a link there.
    let confined = crate::workspace::Workspace::strict(&ws);
    for (rel, body) in templates::WORKSPACE {
        let path = ws.join(rel);
        let wrote =
            confined.write_new(rel, body.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
        report_init(&path, wrote);
    }
    if !asked {
        println!(
            "\nNext: put your API key in {} (e.g. OPENAI_API_KEY=…), then try `bramble agent -m \"hello\"`.",
            env_path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("\nChecking what was set up (as `bramble doctor` does):");
    let ok = super::doctor::first_checks(&loaded).await;
    let next = if loaded.config.telegram.token().is_some() && loaded.config.telegram.allow_from.is_empty() {
        "`bramble pair` to let your Telegram account in, then `bramble run`"
    } else {
        "`bramble agent -m \"hello\"`, then `bramble run`"
    };
    if ok {
        println!("\nNext: {next}.");
    } else {
        println!("\nNext: fix what is marked above (`bramble doctor` checks again), then {next}.");
    }
    Ok(ExitCode::SUCCESS)
}

/// What to add to the config and the env file.
#[derive(Debug, Default, PartialEq, Eq)]
struct Answers {
    /// `(section, key, TOML value)`, in order.
    keys: Vec<(&'static str, &'static str, String)>,
    /// Secrets typed in: `(variable, value)`.
    secrets: Vec<(String, String)>,
}

impl Answers {
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.secrets.is_empty()
    }

    fn from_flags(f: InitSetup) -> anyhow::Result<Answers> {
        let mut a = Answers::default();
        if let Some(p) = f.provider {
            a.provider(p, f.base_url.clone(), f.model.clone(), f.key_env.clone())?;
        } else if f.base_url.is_some() || f.model.is_some() || f.key_env.is_some() {
            anyhow::bail!(
                "--base-url, --model and --key-env go with --provider (openai, anthropic, ollama, openrouter, other)"
            );
        }
        if let Some(env) = f.telegram_token_env {
            check_var_name(&env)?;
            a.keys.push(("telegram", "token_env", toml_string(&env)));
        }
        if !f.allow_from.is_empty() {
            let ids: Vec<String> = f.allow_from.iter().map(i64::to_string).collect();
            a.keys.push(("telegram", "allow_from", format!("[{}]", ids.join(", "))));
        }
        if let Some(url) = f.mqtt {
            a.keys.push(("mqtt", "url", toml_string(&url)));
        }
        Ok(a)
    }

    /// The `[provider]` keys for a choice.
    fn provider(
        &mut self,
        p: ProviderChoice,
        base_url: Option<String>,
        model: Option<String>,
        key_env: Option<String>,
    ) -> anyhow::Result<()> {
        let d = defaults(p);
        let base_url = base_url.or(d.base_url.map(str::to_string));
        if p == ProviderChoice::Other && base_url.is_none() {
            anyhow::bail!(
                "--provider other needs --base-url (the server's OpenAI-compatible URL, e.g. http://host:8080/v1)"
            );
        }
        if let Some(url) = &base_url {
            url.parse::<config::HttpUrl>().map_err(|e| anyhow::anyhow!("--base-url `{url}`: {e}"))?;
        }
        let kind = if p == ProviderChoice::Anthropic { "anthropic" } else { "openai" };
        self.keys.push(("provider", "kind", toml_string(kind)));
        if let Some(url) = base_url {
            self.keys.push(("provider", "base_url", toml_string(&url)));
        }
        self.keys.push(("provider", "model", toml_string(&model.unwrap_or_else(|| d.model.to_string()))));
        if let Some(env) = key_env.or(d.key_env.map(str::to_string)) {
            check_var_name(&env)?;
            self.keys.push(("provider", "api_key_env", toml_string(&env)));
        }
        Ok(())
    }
}

/// What each provider choice starts from.
struct Defaults {
    base_url: Option<&'static str>,
    model: &'static str,
    /// `None`: a LAN server that usually needs no key.
    key_env: Option<&'static str>,
}

fn defaults(p: ProviderChoice) -> Defaults {
    match p {
        ProviderChoice::Openai => Defaults { base_url: None, model: "gpt-4.1-mini", key_env: Some("OPENAI_API_KEY") },
        ProviderChoice::Anthropic => {
            Defaults { base_url: None, model: "claude-sonnet-4-5", key_env: Some("ANTHROPIC_API_KEY") }
        }
        ProviderChoice::Ollama => {
            Defaults { base_url: Some("http://127.0.0.1:11434/v1"), model: "qwen2.5:3b", key_env: None }
        }
        ProviderChoice::Openrouter => Defaults {
            base_url: Some("https://openrouter.ai/api/v1"),
            model: "openai/gpt-4.1-mini",
            key_env: Some("OPENROUTER_API_KEY"),
        },
        ProviderChoice::Other => Defaults { base_url: None, model: "", key_env: None },
    }
}

fn check_var_name(name: &str) -> anyhow::Result<()> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    anyhow::ensure!(ok, "`{name}` is not a variable name (letters, digits and _, e.g. OPENAI_API_KEY)");
    Ok(())
}

/// The questions, on the terminal; a flag given answers its question.
fn ask_all(flags: InitSetup) -> anyhow::Result<Answers> {
    let mut t = Terminal::new();
    println!("\nA few questions (Enter takes the [default]; Ctrl-D stops and writes nothing more).");
    let mut a = Answers::default();
    let choice = match flags.provider {
        Some(p) => p,
        None => {
            let pick = t.ask(
                "Where is the model? 1) OpenAI  2) Anthropic  3) Ollama/LAN  4) OpenRouter  5) another server",
                "1",
            )?;
            match pick.as_str() {
                "2" | "anthropic" => ProviderChoice::Anthropic,
                "3" | "ollama" => ProviderChoice::Ollama,
                "4" | "openrouter" => ProviderChoice::Openrouter,
                "5" | "other" => ProviderChoice::Other,
                _ => ProviderChoice::Openai,
            }
        }
    };
    let d = defaults(choice);
    let base_url = match (flags.base_url, choice) {
        (Some(u), _) => Some(u),
        (None, ProviderChoice::Ollama | ProviderChoice::Other) => {
            Some(t.ask("The server's URL", d.base_url.unwrap_or("http://127.0.0.1:8080/v1"))?)
        }
        (None, _) => None,
    };
    let model = match flags.model {
        Some(m) => m,
        None => t.ask("Model", d.model)?,
    };
    let key_env = match (flags.key_env, d.key_env) {
        (Some(k), _) => Some(k),
        (None, Some(default)) => Some(t.ask("The variable that holds the API key", default)?),
        (None, None) => {
            Some(t.ask("The variable that holds the API key (empty: no key)", "")?).filter(|k| !k.is_empty())
        }
    };
    if let Some(env) = &key_env {
        check_var_name(env)?;
        if std::env::var_os(env).is_none() {
            let key =
                t.secret(&format!("Paste the key to keep it in the env file (hidden; empty: set {env} yourself)"))?;
            if !key.is_empty() {
                a.secrets.push((env.clone(), key));
            }
        }
    }
    a.provider(choice, base_url, Some(model), key_env)?;
    ask_telegram(&mut t, &mut a, flags.telegram_token_env, flags.allow_from)?;
    let mqtt = match flags.mqtt {
        Some(u) => Some(u),
        None if t.yes("Use an MQTT broker?", false)? => Some(t.ask("Its URL", "mqtt://127.0.0.1:1883")?),
        None => None,
    };
    if let Some(url) = mqtt {
        a.keys.push(("mqtt", "url", toml_string(&url)));
    }
    Ok(a)
}

/// Telegram's token variable (and the token, hidden), and who may use the bot.
fn ask_telegram(t: &mut Terminal, a: &mut Answers, token_env: Option<String>, ids: Vec<i64>) -> anyhow::Result<()> {
    let env = match token_env {
        Some(e) => e,
        None if t.yes("Use a Telegram bot?", false)? => {
            t.ask("The variable that holds its token", "TELEGRAM_BOT_TOKEN")?
        }
        None => return Ok(()),
    };
    check_var_name(&env)?;
    a.keys.push(("telegram", "token_env", toml_string(&env)));
    if std::env::var_os(&env).is_none() {
        let token = t.secret("Paste the bot's token from @BotFather (hidden; empty: set it yourself)")?;
        if !token.is_empty() {
            a.secrets.push((env, token));
        }
    }
    let ids = if ids.is_empty() {
        let typed = t.ask("Your Telegram user id (empty: `bramble pair` later)", "")?;
        typed
            .split([',', ' '])
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<i64>().map_err(|_| anyhow::anyhow!("`{s}` is not a Telegram user id (a number)")))
            .collect::<anyhow::Result<Vec<_>>>()?
    } else {
        ids
    };
    if !ids.is_empty() {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        a.keys.push(("telegram", "allow_from", format!("[{}]", ids.join(", "))));
    }
    Ok(())
}

/// Questions on stdin's terminal, prompts on stdout.
struct Terminal {
    input: std::io::StdinLock<'static>,
}

impl Terminal {
    fn new() -> Terminal {
        Terminal { input: std::io::stdin().lock() }
    }

    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.input.read_line(&mut line)? == 0 {
            anyhow::bail!("stopped (end of input): nothing more was written");
        }
        Ok(line.trim().to_string())
    }

    fn ask(&mut self, question: &str, default: &str) -> anyhow::Result<String> {
        if default.is_empty() {
            print!("{question}: ");
        } else {
            print!("{question} [{default}]: ");
        }
        std::io::stdout().flush()?;
        let line = self.line()?;
        Ok(if line.is_empty() { default.to_string() } else { line })
    }

    fn yes(&mut self, question: &str, default: bool) -> anyhow::Result<bool> {
        let answer = self.ask(&format!("{question} (y/n)"), if default { "y" } else { "n" })?;
        Ok(matches!(answer.to_ascii_lowercase().as_str(), "y" | "yes"))
    }

    /// A line typed without echo.
    fn secret(&mut self, question: &str) -> anyhow::Result<String> {
        use nix::sys::termios;
        print!("{question}: ");
        std::io::stdout().flush()?;
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).ok();
        if let Some(saved) = &saved {
            let mut quiet = saved.clone();
            quiet.local_flags.remove(termios::LocalFlags::ECHO);
            let _ = termios::tcsetattr(&stdin, termios::SetArg::TCSANOW, &quiet);
        }
        let line = self.line();
        if let Some(saved) = &saved {
            let _ = termios::tcsetattr(&stdin, termios::SetArg::TCSANOW, saved);
        }
        println!();
        line
    }
}

/// Add the answers: config keys under their sections (a key already set is
/// kept and said so), secrets into the env file (one already there is kept).
fn write_answers(config_path: &Path, env_path: &Path, a: &Answers) -> anyhow::Result<()> {
    let mut text =
        std::fs::read_to_string(config_path).with_context(|| format!("cannot read {}", config_path.display()))?;
    for (section, key, value) in &a.keys {
        match add_key(&text, section, key, value) {
            Edit::Added(new) => {
                text = new;
                println!("set     [{section}] {key} = {value}");
            }
            Edit::Kept => println!("kept    [{section}] {key} (already set)"),
            Edit::Skipped(why) => println!("skipped [{section}] {key}: {why}"),
        }
    }
    util::fs::write_atomic(config_path, text.as_bytes())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    if a.secrets.is_empty() {
        return Ok(());
    }
    let mut env = std::fs::read_to_string(env_path).with_context(|| format!("cannot read {}", env_path.display()))?;
    let have = config::env::read(env_path)?.map(|f| f.vars).unwrap_or_default();
    for (name, value) in &a.secrets {
        if have.iter().any(|(k, _)| k == name) {
            println!("kept    {name} in {} (already there)", env_path.display());
            continue;
        }
        anyhow::ensure!(!value.contains(['\n', '\r', '\0']), "the value for {name} has a line break");
        if !env.is_empty() && !env.ends_with('\n') {
            env.push('\n');
        }
        env.push_str(&format!("{name}={value}\n"));
        // For the checks below (this process has no other thread yet).
        std::env::set_var(name, value);
        println!("set     {name} in {}", env_path.display());
    }
    util::fs::write_atomic(env_path, env.as_bytes()).with_context(|| format!("cannot write {}", env_path.display()))
}

/// What [`add_key`] did.
#[derive(Debug, PartialEq, Eq)]
enum Edit {
    Added(String),
    Kept,
    Skipped(String),
}

/// `key = value` added under `[section]` (made at the end if missing), every
/// other line kept as it was; nothing when the key is set already.
fn add_key(text: &str, section: &str, key: &str, value: &str) -> Edit {
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(_) => return Edit::Skipped("the config does not parse: `bramble check` says where".into()),
    };
    match table.get(section) {
        Some(toml::Value::Table(t)) if t.contains_key(key) => return Edit::Kept,
        Some(toml::Value::Table(_)) | None => {}
        Some(_) => return Edit::Skipped(format!("[[{section}]] lists several: edit the config")),
    }
    let header = format!("[{section}]");
    let mut lines: Vec<&str> = text.lines().collect();
    let line = format!("{key} = {value}");
    match lines.iter().position(|l| l.trim() == header || l.trim_start().starts_with(&format!("{header} "))) {
        Some(i) => lines.insert(i + 1, &line),
        None => {
            let mut out = text.to_string();
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("\n{header}\n{line}\n"));
            return Edit::Added(out);
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Edit::Added(out)
}

fn report_init(path: &Path, wrote: bool) {
    if wrote {
        println!("wrote   {}", path.display());
    } else {
        println!("kept    {} (exists)", path.display());
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }

    #[test]
    fn keys_are_added_under_their_section_and_kept_when_set() {
        let text = "# top\n[agent]\n# model = \"x\"   # a comment\n\n[provider]\nkind = \"openai\"\n";
        let Edit::Added(out) = add_key(text, "provider", "model", "\"m\"") else { panic!() };
        assert_eq!(
            out,
            "# top\n[agent]\n# model = \"x\"   # a comment\n\n[provider]\nmodel = \"m\"\nkind = \"openai\"\n"
        );
        assert_eq!(add_key(&out, "provider", "kind", "\"anthropic\""), Edit::Kept);
        let Edit::Added(out) = add_key(&out, "mqtt", "url", "\"mqtt://h\"") else { panic!() };
        assert!(out.ends_with("kind = \"openai\"\n\n[mqtt]\nurl = \"mqtt://h\"\n"), "{out}");
        assert!(toml::from_str::<toml::Table>(&out).is_ok());
        let several = "[[provider]]\nname = \"a\"\n";
        assert!(matches!(add_key(several, "provider", "model", "\"m\""), Edit::Skipped(_)));
    }
}
