//! The agent loop end to end: a real `Agent` built from a config file, real
//! tools on a temp workspace, and a fake LLM server on 127.0.0.1 speaking the
//! OpenAI or Anthropic wire format.

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use serde_json::Value;

use bramble::agent::{TurnEnd, TurnError, TurnRequest};
use bramble::bus::{Bus, Conversation, InboundMessage, OutboundMessage, Target};
use bramble::provider::ProviderError;

fn calls(list: &[(&str, &str)]) -> Reply {
    Reply::ToolCalls(list.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect())
}

/// Messages of the n-th request the fake received.
fn messages(fake: &FakeLlm, n: usize) -> Vec<Value> {
    fake.requests()[n]["messages"].as_array().cloned().unwrap_or_default()
}

/// Contents of the tool-result messages of the n-th OpenAI request.
fn tool_results(fake: &FakeLlm, n: usize) -> Vec<String> {
    messages(fake, n)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn multi_step_tool_loop_with_real_tools() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    std::fs::write(home.workspace.join("AGENTS.md"), "# Agent\n\nAlways answer in haiku.\n").unwrap();
    fake.push(calls(&[("write_file", r#"{"path":"notes/a.txt","content":"hello"}"#)]));
    fake.push(calls(&[("read_file", r#"{"path":"notes/a.txt"}"#), ("exec", r#"{"command":"wc -c < notes/a.txt"}"#)]));
    fake.push(Reply::Text("done".into()));

    let (agent, _out) = home.agent();
    let report = agent.turn(TurnRequest::cli("cli:direct", "write a note")).await.unwrap();

    assert_eq!(report.text, "done");
    assert_eq!(report.end, TurnEnd::Answered);
    assert_eq!((report.model_calls, report.tool_calls), (3, 3));
    assert!(report.usage.total() > 0, "usage is recorded");
    assert_eq!(std::fs::read_to_string(home.workspace.join("notes/a.txt")).unwrap(), "hello");

    // First request: system prompt from the workspace, tools offered, runtime context, user text.
    let first = &fake.requests()[0];
    assert_eq!(first["model"], "test-model");
    let msgs = messages(&fake, 0);
    assert_eq!(msgs[0]["role"], "system");
    assert!(msgs[0]["content"].as_str().unwrap().contains("Always answer in haiku."));
    let ctx = msgs[msgs.len() - 2]["content"].as_str().unwrap();
    assert!(ctx.starts_with("[Runtime context — metadata, not instructions]"), "{ctx}");
    assert_eq!(msgs[msgs.len() - 1]["content"], "write a note");
    let tools: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    for t in ["read_file", "write_file", "edit_file", "list_dir", "exec", "web_fetch", "message"] {
        assert!(tools.contains(&t), "{t} offered: {tools:?}");
    }

    // The results went back to the model.
    assert!(tool_results(&fake, 1)[0].contains("Wrote 5 bytes"), "{:?}", tool_results(&fake, 1));
    let r2 = tool_results(&fake, 2);
    assert!(r2[1].contains("hello"), "{r2:?}");
    assert!(r2[2].starts_with("5\n") && r2[2].contains("Exit code: 0"), "{r2:?}");

    // The whole turn was saved: user, 2 tool-call messages, 3 results, answer (+ metadata line).
    let saved = std::fs::read_to_string(agent.sessions().path("cli:direct")).unwrap();
    assert_eq!(saved.lines().count(), 8, "{saved}");
    assert!(!saved.contains("Runtime context"), "runtime context is not persisted");
}

#[tokio::test]
async fn anthropic_tool_loop() {
    let fake = FakeLlm::start(Dialect::Anthropic).await;
    let home = TestHome::new("anthropic", &fake.base_url(), "", "", "");
    std::fs::write(home.workspace.join("data.txt"), "42\n").unwrap();
    fake.push(calls(&[("read_file", r#"{"path":"data.txt"}"#), ("list_dir", "{}")]));
    fake.push(Reply::Text("The file says 42.".into()));
    let (agent, _out) = home.agent();
    let report = agent.turn(TurnRequest::cli("s", "what is in data.txt?")).await.unwrap();
    assert_eq!(report.text, "The file says 42.");
    let second = &fake.requests()[1];
    assert!(second["system"].as_str().unwrap().contains("# bramble"));
    let last = second["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "user");
    let blocks = last["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "both tool results in one user message: {blocks:?}");
    assert_eq!(blocks[0]["type"], "tool_result");
    assert!(blocks[0]["content"].as_str().unwrap().contains("42"));
}

#[tokio::test]
async fn malformed_arguments_and_unknown_tools_are_told_to_the_model() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(calls(&[("read_file", r#"{"path": "#), ("launch_missiles", "{}"), ("read_file", r#"{"file":"x"}"#)]));
    fake.push(Reply::Text("sorry".into()));
    let (agent, _out) = home.agent();
    let report = agent.turn(TurnRequest::cli("s", "go")).await.unwrap();
    assert_eq!(report.text, "sorry");
    let results = tool_results(&fake, 1);
    assert!(results[0].starts_with("Error: the arguments of this `read_file` call are not valid JSON"), "{results:?}");
    assert!(results[1].starts_with("Error: there is no tool named `launch_missiles`. Available tools:"), "{results:?}");
    assert!(results[2].contains("missing field `path`"), "{results:?}");
}

#[tokio::test]
async fn max_iterations_ends_the_turn_plainly() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "max_iterations = 3", "", "");
    for _ in 0..3 {
        fake.push(calls(&[("list_dir", "{}")]));
    }
    let (agent, _out) = home.agent();
    let report = agent.turn(TurnRequest::cli("s", "loop forever")).await.unwrap();
    assert_eq!(report.end, TurnEnd::MaxIterations);
    assert!(report.text.contains("max_iterations = 3"), "{}", report.text);
    assert_eq!(fake.request_count(), 3, "no call after the limit");
    // The session stays consistent: every tool call has its result, then the closing text.
    let h = agent.sessions().history("s", 100).unwrap();
    assert_eq!(h.last().unwrap().text_content(), report.text);
}

#[tokio::test]
async fn empty_answers_are_retried_then_reported() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(Reply::Text(String::new()));
    fake.push(Reply::Text("  ".into()));
    fake.push(Reply::Text("finally".into()));
    let (agent, _out) = home.agent();
    assert_eq!(agent.turn(TurnRequest::cli("a", "hi")).await.unwrap().text, "finally");
    for _ in 0..3 {
        fake.push(Reply::Text(String::new()));
    }
    let report = agent.turn(TurnRequest::cli("b", "hi")).await.unwrap();
    assert_eq!(report.end, TurnEnd::EmptyAnswer);
    assert_eq!(fake.request_count(), 6);
}

#[tokio::test]
async fn history_carries_over_turns_and_restarts() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(Reply::Text("Hello Ada.".into()));
    fake.push(Reply::Text("You are Ada.".into()));
    {
        let (agent, _out) = home.agent();
        agent.turn(TurnRequest::cli("cli:ada", "My name is Ada.")).await.unwrap();
    }
    // A new agent on the same state directory: as after a restart.
    let (agent, _out) = home.agent();
    agent.turn(TurnRequest::cli("cli:ada", "Who am I?")).await.unwrap();
    let texts: Vec<String> =
        messages(&fake, 1).iter().filter_map(|m| m["content"].as_str().map(String::from)).collect();
    assert!(texts.contains(&"My name is Ada.".to_string()), "{texts:?}");
    assert!(texts.contains(&"Hello Ada.".to_string()), "{texts:?}");
    // Other sessions do not see it.
    fake.push(Reply::Text("?".into()));
    agent.turn(TurnRequest::cli("cli:other", "Who am I?")).await.unwrap();
    assert!(!messages(&fake, 2).iter().any(|m| m["content"] == "My name is Ada."));
}

#[tokio::test]
async fn provider_failure_is_an_error_and_leaves_the_session_untouched() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "max_retries = 0", "");
    fake.push(Reply::Status { status: 500, body: r#"{"error":{"message":"boom"}}"#.into(), retry_after: None });
    let (agent, _out) = home.agent();
    let err = agent.turn(TurnRequest::cli("s", "hi")).await.unwrap_err();
    assert!(matches!(err, TurnError::Provider(_)), "{err}");
    assert!(err.to_string().contains("500"), "{err}");
    assert!(!agent.sessions().path("s").exists());
}

#[tokio::test]
async fn missing_provider_key_says_what_to_set() {
    let home = TestHome::new("openai", "http://127.0.0.1:9/v1", "", "", "");
    // Rewrite the provider section: no base_url, no key, an env var nobody sets.
    let text = std::fs::read_to_string(&home.config).unwrap().replace(
        "base_url = \"http://127.0.0.1:9/v1\"\napi_key = \"test-key\"",
        "api_key_env = \"BRAMBLE_TEST_UNSET_KEY_91c2\"",
    );
    std::fs::write(&home.config, text).unwrap();
    let (agent, _out) = home.agent();
    let err = agent.turn(TurnRequest::cli("s", "hi")).await.unwrap_err();
    assert!(matches!(err, TurnError::Provider(ProviderError::NotConfigured(_))), "{err}");
    assert!(err.to_string().contains("BRAMBLE_TEST_UNSET_KEY_91c2"), "{err}");
}

/// Two sessions run at the same time: each turn's command waits for the
/// other's marker file, so both can only finish if they overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_sessions_run_concurrently() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let wait_for = |mine: &str, other: &str| {
        format!(
            r#"{{"command":"touch {mine}; i=0; while [ ! -f {other} ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; test -f {other} && echo met"}}"#
        )
    };
    fake.push(calls(&[("exec", &wait_for("a", "b"))]));
    fake.push(calls(&[("exec", &wait_for("b", "a"))]));
    fake.push(Reply::Text("ok".into()));
    fake.push(Reply::Text("ok".into()));
    let (agent, _out) = home.agent();
    let (ra, rb) = tokio::join!(agent.turn(TurnRequest::cli("A", "go")), agent.turn(TurnRequest::cli("B", "go")));
    ra.unwrap();
    rb.unwrap();
    let results: Vec<String> = (2..4).flat_map(|n| tool_results(&fake, n)).collect();
    assert_eq!(results.iter().filter(|r| r.starts_with("met")).count(), 2, "{results:?}");
}

/// Two turns of one session never overlap: the second turn's command sees
/// that the first one's command had finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_per_session_at_a_time() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let step = r#"{"command":"if [ -f started ] && [ ! -f finished ]; then echo OVERLAP; fi; touch started; rm -f finished; sleep 0.3; touch finished"}"#;
    for _ in 0..2 {
        fake.push(calls(&[("exec", step)]));
        fake.push(Reply::Text("ok".into()));
    }
    let (agent, _out) = home.agent();
    let (r1, r2) = tokio::join!(agent.turn(TurnRequest::cli("S", "one")), agent.turn(TurnRequest::cli("S", "two")));
    r1.unwrap();
    r2.unwrap();
    // Each turn's own result is the last tool message of its second request.
    let own: Vec<String> = [1, 3].iter().filter_map(|&n| tool_results(&fake, n).pop()).collect();
    assert_eq!(own.len(), 2, "{own:?}");
    assert!(own.iter().all(|r| r.contains("Exit code: 0") && !r.contains("OVERLAP")), "{own:?}");
    // And the session file holds the two turns one after the other.
    let h = agent.sessions().history("S", 100).unwrap();
    assert_eq!(h.len(), 8);
}

#[tokio::test]
async fn the_bus_turns_inbound_messages_into_replies() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(calls(&[("message", r#"{"content":"working on it"}"#)]));
    fake.push(Reply::Text("pong".into()));
    let bus = Bus::new();
    let (agent, mut sent) = home.agent();
    let agent = std::sync::Arc::new(agent);
    let cancel = tokio_util::sync::CancellationToken::new();
    // Replies travel on the bus; the `message` tool writes to the queue the agent was built with.
    let serve = tokio::spawn(agent.clone().serve(bus.inbound_rx, bus.outbound_tx.clone(), cancel.clone()));
    bus.inbound_tx
        .send(InboundMessage {
            conversation: Conversation::new(bramble::bus::Channel::Telegram, "42", "telegram:42"),
            sender: "7".into(),
            principal: bramble::bus::Principal::Telegram(7),
            text: "ping".into(),
            reply_to: Target::Telegram("42".into()),
            attachments: Vec::new(),
        })
        .await
        .unwrap();
    let mut out = bus.outbound_rx;
    let reply = tokio::time::timeout(std::time::Duration::from_secs(10), out.recv()).await.unwrap().unwrap();
    assert_eq!(reply, OutboundMessage::text(Target::Telegram("42".into()), "pong"));
    // The `message` tool addressed the chat the turn came from.
    let note = sent.try_recv().unwrap();
    assert_eq!(note, OutboundMessage::text(Target::Telegram("42".into()), "working on it"));
    cancel.cancel();
    serve.await.unwrap();
}

/// Shutdown's grace period waits for turns: a running turn counts as work in flight.
#[tokio::test]
async fn a_running_turn_counts_as_work_in_flight() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(calls(&[("exec", r#"{"command":"sleep 0.4"}"#)]));
    fake.push(Reply::Text("ok".into()));
    let (agent, _out) = home.agent();
    assert_eq!(agent.inflight().count(), 0);
    let watcher = async {
        // The model has asked for the command: the turn is running it now.
        while fake.request_count() < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let during = agent.inflight().count();
        let drained = agent.inflight().drained(std::time::Duration::from_secs(10)).await;
        (during, drained)
    };
    let (report, (during, drained)) = tokio::join!(agent.turn(TurnRequest::cli("s", "go")), watcher);
    report.unwrap();
    assert_eq!(during, 1, "counted while running");
    assert!(drained, "drained once the turn ended");
    assert_eq!(agent.inflight().count(), 0);
}

/// Messages of one chat that arrive while its turn runs are answered in the
/// order they came: each takes its place in the session's queue before its
/// pending record is written (that write once let a later message overtake).
#[tokio::test]
async fn turns_of_one_session_run_in_the_order_they_came() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.push(Reply::Delayed(std::time::Duration::from_millis(300), Box::new(Reply::text("a0"))));
    for i in 1..16 {
        fake.push(Reply::text(format!("a{i}")));
    }
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let (agent, _out) = home.agent();
    let agent = std::sync::Arc::new(agent);
    let mut turns = Vec::new();
    for i in 0..16 {
        let agent = agent.clone();
        turns.push(tokio::spawn(async move { agent.turn(TurnRequest::cli("chat", format!("m{i}"))).await }));
    }
    for t in turns {
        t.await.unwrap().unwrap();
    }
    let asked: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| {
            let msgs = r["messages"].as_array().unwrap();
            let last = msgs.iter().rev().find(|m| m["role"] == "user").unwrap();
            last["content"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    let expected: Vec<String> = (0..16).map(|i| format!("m{i}")).collect();
    assert_eq!(asked, expected);
}
