//! Benchmarks of long-term memory (figures go to BENCHMARKS.md).
//!
//! 1. Prompt size over a long conversation: 200 turns in one session, each
//!    with one `exec` tool call, against a fake OpenAI server on 127.0.0.1
//!    that answers `save_memory` when consolidation forces it. After every
//!    turn the next prompt's estimated size is read from `Agent::session_status`,
//!    and the largest request the server received is measured too.
//! 2. Loading a session file of 10,000 lines (cold: a new `SessionStore` each
//!    time, file in the page cache), the tail kept in memory and all of it.
//!
//! Run: `cargo bench --bench memory` (uses the release profile).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::fake_llm::{Dialect, FakeLlm, Reply};
use support::setup::TestHome;

const TURNS: usize = 200;
const SESSION_LINES: usize = 10_000;
const LOAD_RUNS: usize = 20;

fn main() {
    bramble::install_crypto();
    prompt_over_200_turns();
    session_load();
}

fn prompt_over_200_turns() {
    let server_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let fake = server_rt.block_on(FakeLlm::start(Dialect::OpenAi));
    let answer = "Here is what I found. ".repeat(20);
    fake.route(move |req: &Value| {
        if req.get("tool_choice").is_some() {
            let args = json!({
                "history_entry": "[2026-05-01 10:00] The user asked about the board's state several times; all was fine.",
                "memory_update": "# Long-term memory\n\n- The user checks the board's state often.\n",
            });
            return Some(Reply::tool_call("save_memory", args.to_string()));
        }
        let last = req["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or(Value::Null);
        Some(if last["role"] == "tool" {
            Reply::text(answer.clone())
        } else {
            Reply::tool_call("exec", json!({"command": "uptime; df -h / | tail -1; free -m | head -2"}).to_string())
        })
    });
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let (agent, _out) = home.agent();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let question = "How is the board doing right now? Check the load, the disk and the memory, please. ".repeat(2);
    let mut max_estimate = 0;
    let mut estimates = Vec::new();
    let t0 = Instant::now();
    rt.block_on(async {
        for _ in 0..TURNS {
            agent.turn(bramble::agent::TurnRequest::cli("bench", question.clone())).await.expect("turn");
            let st = agent.session_status("bench").await.expect("status");
            max_estimate = max_estimate.max(st.estimated_tokens);
            estimates.push(st.estimated_tokens);
        }
    });
    let wall = t0.elapsed();
    let st = rt.block_on(agent.session_status("bench")).expect("status");
    let largest_request = fake
        .requests()
        .iter()
        .filter(|r| r.get("tool_choice").is_none())
        .map(|r| r.to_string().len())
        .max()
        .unwrap_or(0);
    let consolidations = fake.requests().iter().filter(|r| r.get("tool_choice").is_some()).count();
    println!("{TURNS} turns in one session (one exec call each), [agent] context_tokens = {}:", st.context_tokens);
    println!(
        "  estimated prompt tokens: max {max_estimate}, last {}, at turn 50/100/150: {}/{}/{}",
        st.estimated_tokens, estimates[49], estimates[99], estimates[149]
    );
    println!("  largest request body {largest_request} bytes (≈ {} tokens at 4 bytes/token)", largest_request / 4);
    println!("  consolidations {consolidations}, session messages now {}", st.messages);
    println!("  wall time {wall:?} ({:?} per turn)", wall / TURNS as u32);
    assert!(max_estimate <= st.context_tokens, "the prompt stayed under the budget");
}

fn session_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sessions = dir.path().join("sessions");
    std::fs::create_dir_all(&sessions).expect("mkdir");
    let path = sessions.join("big.jsonl");
    let mut text = String::from("{\"_type\":\"metadata\",\"key\":\"big\",\"created_at\":\"2026-05-01T10:00:00Z\"}\n");
    let user = "How is the board doing? ".repeat(8);
    let tool = "load average: 0.12 0.10 0.09\n".repeat(30);
    let answer = "All fine: load is low, disk 40% used, 1.2 GB free. ".repeat(6);
    let mut i = 0;
    while i < SESSION_LINES {
        let ts = "2026-05-01T10:00:00Z";
        let lines = [
            json!({"role": "user", "content": user, "timestamp": ts}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "exec", "arguments": "{\"command\":\"uptime\"}"}}], "timestamp": ts}),
            json!({"role": "tool", "content": tool, "tool_call_id": format!("c{i}"), "name": "exec", "timestamp": ts}),
            json!({"role": "assistant", "content": answer, "timestamp": ts, "usage": {"input_tokens": 900, "output_tokens": 80}}),
        ];
        for l in lines {
            text.push_str(&l.to_string());
            text.push('\n');
        }
        i += 4;
    }
    std::fs::write(&path, &text).expect("write");
    let mut tail = Vec::new();
    let mut all = Vec::new();
    for _ in 0..LOAD_RUNS {
        let store = bramble::agent::session::SessionStore::new(dir.path());
        let t = Instant::now();
        let s = store.load("big").expect("load");
        tail.push(t.elapsed());
        assert_eq!(s.messages.len() + s.skipped, SESSION_LINES);
        let t = Instant::now();
        let s = store.load_all("big").expect("load");
        all.push(t.elapsed());
        assert_eq!(s.messages.len(), SESSION_LINES);
    }
    tail.sort();
    all.sort();
    let p50 = |v: &[Duration]| v[v.len() / 2];
    println!("session file of {SESSION_LINES} lines ({} KiB):", text.len() / 1024);
    println!("  load (tail kept in memory)  p50 {:?}  max {:?}", p50(&tail), tail[LOAD_RUNS - 1]);
    println!("  load_all (consolidation)    p50 {:?}  max {:?}", p50(&all), all[LOAD_RUNS - 1]);
}
