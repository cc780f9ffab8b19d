//! Smoke test of a built binary: `--version`, `check` on the shipped example
//! config, and one `agent -m` turn with an exec tool call against the fake LLM.
//!
//! By default the binary under test is this build's own. To smoke-test a
//! cross-built one under qemu (issue 6's CI step):
//!
//! ```sh
//! BRAMBLE_SMOKE_BIN=target-cross/aarch64-unknown-linux-gnu/release/bramble \
//! BRAMBLE_SMOKE_RUNNER="qemu-aarch64-static" \
//! cargo test --test smoke
//! ```

use std::process::Output;

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;

/// The binary (and the emulator to run it with, if any).
fn command() -> tokio::process::Command {
    let bin = std::env::var("BRAMBLE_SMOKE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_bramble").to_string());
    let runner = std::env::var("BRAMBLE_SMOKE_RUNNER").unwrap_or_default();
    let mut parts = runner.split_whitespace();
    let mut cmd = match parts.next() {
        Some(emulator) => {
            let mut c = tokio::process::Command::new(emulator);
            c.args(parts).arg(&bin);
            c
        }
        None => tokio::process::Command::new(&bin),
    };
    cmd.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).kill_on_drop(true);
    cmd
}

async fn run(home: &std::path::Path, args: &[&str]) -> Output {
    let out = command().args(args).env("HOME", home).output();
    tokio::time::timeout(std::time::Duration::from_secs(120), out).await.expect("in time").expect("runs")
}

#[tokio::test]
async fn version_check_and_one_turn_with_an_exec_call() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["--version"]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("bramble {}\n", env!("BRAMBLE_VERSION")));

    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/bramble.toml");
    let out = run(dir.path(), &["--config", example, "check"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"), "{out:?}");

    let fake = FakeLlm::start(Dialect::OpenAi).await;
    // Under qemu-user the sandbox helper (a foreign binary, no binfmt here) cannot
    // start, and as root bramble then refuses to run commands unconfined; this
    // test is about the emulated binary, the sandbox has tests/security.rs.
    let emulated = std::env::var("BRAMBLE_SMOKE_RUNNER").is_ok_and(|r| !r.trim().is_empty());
    let exec = if emulated { "[exec]\nisolation = \"off\"\n" } else { "" };
    let home = TestHome::new("openai", &fake.base_url(), "", "", exec);
    fake.push(Reply::ToolCalls(vec![("exec".into(), r#"{"command":"uname -m; echo $((40+2))"}"#.into())]));
    fake.push(Reply::Text("done".into()));
    let out = run(home.path(), &["--config", home.config.to_str().unwrap(), "agent", "-m", "hi"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    let second = &fake.requests()[1];
    let result = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    let text = result["content"].as_str().unwrap();
    assert!(text.contains("42\n") && text.contains("Exit code: 0"), "{text}");
}
