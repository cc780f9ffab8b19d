//! `bramble agent`: one turn with `-m`, else a chat in the terminal.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::agent::{Agent, TurnError, TurnRequest};
use crate::bus::{OutboundMessage, Target};
use crate::config::Loaded;
use crate::daemon::assemble;
use crate::delivery::outbox::Outbox;

/// The session of `bramble agent -m` when `-s` is not given: its own, not the chat's.
const MESSAGE_SESSION: &str = "cli:message";
/// The chat's.
const CHAT_SESSION: &str = "cli:direct";

pub(super) async fn agent(
    loaded: &Loaded,
    message: Option<String>,
    session: Option<String>,
) -> anyhow::Result<ExitCode> {
    let session = session.unwrap_or_else(|| if message.is_some() { MESSAGE_SESSION } else { CHAT_SESSION }.to_string());
    let assemble::Terminal { agent, outbound_tx, outbound_rx: mut outbound, outbox, sandbox } =
        assemble::terminal(loaded);
    // Messages the agent sends mid-turn (the `message` tool).
    let printer = tokio::spawn(async move {
        while let Some(OutboundMessage { target, text, attach }) = outbound.recv().await {
            let text = if attach.is_empty() { text } else { format!("{text}\n(attached: {})", attach.join(", ")) };
            match target {
                Target::Cli => println!("[message] {}", crate::util::text::escape_controls(&text)),
                other => tracing::warn!(
                    target = %other,
                    "`bramble agent` cannot deliver to {other}: only the daemon (`bramble run`) runs channels"
                ),
            }
        }
    });
    let background = tokio_util::sync::CancellationToken::new();
    let announcements = tokio::spawn(agent.clone().run_announcements(outbound_tx, background.clone()));
    report_unanswered(&outbox, &agent).await;
    let result = match message {
        Some(text) => one_turn(&agent, &session, text).await,
        None => {
            sandbox.warm_ahead(); // More commands follow in a chat.
            repl(&agent, &session, &loaded.paths.state_dir).await
        }
    };
    if result.as_ref().is_ok_and(|code| *code == ExitCode::SUCCESS) {
        // `-m` or the end of a chat: let sub-agents report before the process ends (Ctrl-C stops them).
        if agent.subagents_running() > 0 {
            eprintln!("(waiting for {} sub-agent(s) to report; Ctrl-C stops them)", agent.subagents_running());
        }
        tokio::select! {
            _ = agent.wait_subagents() => {}
            _ = tokio::signal::ctrl_c() => agent.inflight().begin_shutdown(),
        }
    }
    background.cancel();
    let _ = announcements.await;
    drop(agent);
    printer.abort();
    result
}

/// Messages typed in a terminal that a crash left unanswered: told on stderr,
/// or run again (`[agent] unanswered`); the answer is printed.
async fn report_unanswered(outbox: &Outbox, agent: &Agent) {
    let cancel = tokio_util::sync::CancellationToken::new();
    agent
        .resolve_unanswered(true, &cancel, |target, text| match target {
            Target::Cli => eprintln!("bramble: {}", crate::util::text::escape_controls(&text)),
            other => {
                if let Err(e) = outbox.enqueue(other, &text, "agent") {
                    eprintln!("bramble: {text} (could not queue it: {e})");
                }
            }
        })
        .await;
}

async fn one_turn(agent: &Agent, session: &str, text: String) -> anyhow::Result<ExitCode> {
    // A slash command is a command here too, as in the chat: never a model call.
    if let Some(inv) = crate::agent::commands::parse(&text) {
        let answer = crate::agent::commands::execute(agent, &crate::bus::Conversation::cli(session), &inv).await;
        if crate::agent::commands::is_known(inv.name) {
            println!("{}", crate::util::text::escape_controls(&answer));
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("bramble: {}", crate::util::text::escape_controls(&answer));
        return Ok(ExitCode::from(1));
    }
    let req = TurnRequest::cli(session, text);
    let cancel = req.cancel.clone();
    let stop = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let result = agent.turn(req).await;
    stop.abort();
    match result {
        Ok(report) => {
            println!("{}", crate::util::text::escape_controls(&report.text));
            Ok(ExitCode::SUCCESS)
        }
        Err(TurnError::Cancelled) => Ok(ExitCode::from(130)),
        Err(e) => Err(e.into()),
    }
}

async fn repl(agent: &Agent, session: &str, state_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    if let Some(why) = agent.provider_problem() {
        eprintln!("warning: {why}");
    }
    eprintln!(
        "bramble {} — session `{session}`. Type a message; /help for commands; `exit` or Ctrl-D to quit.",
        env!("CARGO_PKG_VERSION")
    );
    let mut prompt = Prompt::new(state_dir);
    // Ctrl-C at the prompt gives a fresh one; a second in a row quits.
    let mut interrupted = false;
    let mut told = false;
    loop {
        let text = match prompt.read().await? {
            Input::End => {
                println!();
                return Ok(ExitCode::SUCCESS);
            }
            Input::Interrupted if interrupted => return Ok(ExitCode::SUCCESS),
            Input::Interrupted => {
                interrupted = true;
                if !std::mem::replace(&mut told, true) {
                    eprintln!("(Ctrl-C again, Ctrl-D or `exit` quits)");
                }
                continue;
            }
            Input::Line(text) => text,
        };
        interrupted = false;
        let text = text.trim();
        if matches!(text, "exit" | "quit" | "/exit" | "/quit") {
            println!();
            return Ok(ExitCode::SUCCESS);
        }
        if text.is_empty() {
            continue;
        }
        if let Some(inv) = crate::agent::commands::parse(text) {
            let answer = crate::agent::commands::execute(agent, &crate::bus::Conversation::cli(session), &inv).await;
            println!("bramble> {}\n", crate::util::text::escape_controls(&answer));
            continue;
        }
        let req = TurnRequest::cli(session, text);
        let cancel = req.cancel.clone();
        let stop = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.cancel();
            }
        });
        match agent.turn(req).await {
            Ok(report) => println!("bramble> {}\n", crate::util::text::escape_controls(&report.text)),
            Err(TurnError::Cancelled) => println!("(stopped)\n"),
            Err(e) => eprintln!("error: {}\n", crate::util::text::escape_controls(&e.to_string())),
        }
        stop.abort();
    }
}

/// What one read at the chat's prompt gave.
enum Input {
    Line(String),
    /// Ctrl-C at the prompt (line editor only).
    #[cfg_attr(not(feature = "line-editor"), allow(dead_code))]
    Interrupted,
    /// Ctrl-D on an empty line, or the end of the input.
    End,
}

/// How many lines `<state>/chat_history` keeps.
#[cfg(feature = "line-editor")]
const HISTORY_LINES: usize = 1000;

/// The chat's prompt: a line editor with history when stdin and stdout are a
/// terminal (arrow keys edit the line instead of reaching the model as
/// `\x1b[D`), else plain line reading, as scripts that pipe into the chat expect.
struct Prompt {
    #[cfg(feature = "line-editor")]
    editor: Option<rustyline::DefaultEditor>,
    /// `<state>/chat_history` (0600), when the editor has one.
    #[cfg(feature = "line-editor")]
    history: Option<std::path::PathBuf>,
}

impl Prompt {
    #[cfg(not(feature = "line-editor"))]
    fn new(_state_dir: &std::path::Path) -> Prompt {
        Prompt {}
    }

    #[cfg(feature = "line-editor")]
    fn new(state_dir: &std::path::Path) -> Prompt {
        use std::io::IsTerminal as _;
        let plain = Prompt { editor: None, history: None };
        if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
            return plain;
        }
        let config = rustyline::Config::builder()
            .max_history_size(HISTORY_LINES)
            .map(|b| b.history_ignore_space(true).auto_add_history(false).build());
        let Ok(mut editor) = config.and_then(rustyline::DefaultEditor::with_config) else {
            return plain;
        };
        let history = match open_history(state_dir, &mut editor) {
            Ok(path) => Some(path),
            Err(e) => {
                eprintln!("warning: no chat history this time: {e}");
                None
            }
        };
        Prompt { editor: Some(editor), history }
    }

    async fn read(&mut self) -> anyhow::Result<Input> {
        #[cfg(feature = "line-editor")]
        if let Some(editor) = self.editor.take() {
            return self.edit(editor).await;
        }
        print!("you> ");
        std::io::stdout().flush().ok();
        let (n, text) = tokio::task::spawn_blocking(|| {
            let mut s = String::new();
            std::io::stdin().read_line(&mut s).map(|n| (n, s))
        })
        .await
        .context("the terminal reader stopped")?
        .context("cannot read from the terminal")?;
        Ok(if n == 0 { Input::End } else { Input::Line(text) })
    }

    #[cfg(feature = "line-editor")]
    async fn edit(&mut self, mut editor: rustyline::DefaultEditor) -> anyhow::Result<Input> {
        use rustyline::error::ReadlineError;
        let (mut editor, read) = tokio::task::spawn_blocking(move || {
            let read = editor.readline("you> ");
            (editor, read)
        })
        .await
        .context("the terminal reader stopped")?;
        let input = match read {
            Ok(line) => {
                if let Some(path) = &self.history {
                    // A line that starts with a space is not kept, as in shells.
                    let kept = editor.add_history_entry(line.as_str()).unwrap_or(false);
                    if let Err(e) = kept.then(|| editor.append_history(path)).transpose() {
                        eprintln!("warning: cannot write {}: {e}; history is off", path.display());
                        self.history = None;
                    }
                }
                Input::Line(line)
            }
            Err(ReadlineError::Interrupted) => Input::Interrupted,
            Err(ReadlineError::Eof) => Input::End,
            Err(e) => return Err(e).context("cannot read from the terminal"),
        };
        self.editor = Some(editor);
        Ok(input)
    }
}

/// `<state>/chat_history`, created 0600 if new, loaded into `editor`.
#[cfg(feature = "line-editor")]
fn open_history(
    state_dir: &std::path::Path,
    editor: &mut rustyline::DefaultEditor,
) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    // The state dir's own mode, as the daemon makes it.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .with_context(|| format!("cannot create {}", state_dir.display()))?;
    let path = state_dir.join("chat_history");
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    editor.load_history(&path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(path)
}
