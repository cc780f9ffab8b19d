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
            repl(&agent, &session).await
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

async fn repl(agent: &Agent, session: &str) -> anyhow::Result<ExitCode> {
    if let Some(why) = agent.provider_problem() {
        eprintln!("warning: {why}");
    }
    eprintln!(
        "bramble {} — session `{session}`. Type a message; /help for commands; `exit` or Ctrl-D to quit.",
        env!("CARGO_PKG_VERSION")
    );
    loop {
        print!("you> ");
        std::io::stdout().flush().ok();
        let line = tokio::task::spawn_blocking(|| {
            let mut s = String::new();
            std::io::stdin().read_line(&mut s).map(|n| (n, s))
        })
        .await
        .context("the terminal reader stopped")?
        .context("cannot read from the terminal")?;
        let (n, text) = line;
        let text = text.trim();
        if n == 0 || matches!(text, "exit" | "quit" | "/exit" | "/quit") {
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
