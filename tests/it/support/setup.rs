//! A throwaway bramble installation for a test: a temp dir with a config file,
//! a workspace made by the templates, and a state directory, pointed at a fake LLM.

use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

use bramble::agent::Agent;
use bramble::bus::OutboundMessage;

pub struct TestHome {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub workspace: PathBuf,
    pub state: PathBuf,
}

impl TestHome {
    /// `kind` is `openai` or `anthropic`; `extra` is appended to the config (more sections).
    /// `[agent]` and `[provider]` keys can be added through `agent_extra` / `provider_extra`.
    pub fn new(kind: &str, base_url: &str, agent_extra: &str, provider_extra: &str, extra: &str) -> TestHome {
        real_sandbox();
        let dir = tempfile::tempdir().expect("tempdir");
        let workspace = dir.path().join("workspace");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&workspace).expect("workspace");
        for (rel, body) in bramble::config::templates::WORKSPACE {
            let p = workspace.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, body).expect("template");
        }
        let config = dir.path().join("config.toml");
        let text = format!(
            "[agent]\nmodel = \"test-model\"\nworkspace = \"{ws}\"\ntimezone = \"UTC\"\n{agent_extra}\n\
             [provider]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\napi_key = \"test-key\"\n{provider_extra}\n\
             [daemon]\nstate_dir = \"{st}\"\n{extra}\n",
            ws = workspace.display(),
            st = state.display(),
        );
        std::fs::write(&config, text).expect("config");
        TestHome { dir, config, workspace, state }
    }

    pub fn loaded(&self) -> bramble::config::Loaded {
        bramble::config::load(Some(&self.config)).expect("test config loads")
    }

    /// An agent built exactly as the binary builds it, and the receiving end of its outbound queue.
    pub fn agent(&self) -> (Agent, mpsc::Receiver<OutboundMessage>) {
        bramble::install_crypto();
        let (tx, rx) = mpsc::channel(16);
        let links = bramble::daemon::assemble::AgentLinks::outside_daemon(tx);
        let loaded = self.loaded();
        let sandbox = bramble::daemon::assemble::sandbox(&loaded);
        (bramble::daemon::assemble::agent(&loaded, links, &sandbox), rx)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// In-process agents run commands through the real `bramble sandbox-exec`
/// helper (the test binary itself cannot be it): every `Sandbox` made after this uses it.
pub fn real_sandbox() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| bramble::sandbox::set_helper(env!("CARGO_BIN_EXE_bramble")));
}

/// Run the binary with a clean environment rooted at `home`.
pub async fn bramble(home: &Path, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
    cmd.args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LANG", "C.UTF-8")
        // Hermetic: the installed service's /etc/bramble of this machine (if any) is not looked at.
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn bramble");
    let mut pipe = child.stdin.take().expect("stdin");
    if let Some(input) = stdin {
        pipe.write_all(input.as_bytes()).await.expect("write stdin");
    }
    drop(pipe);
    tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("bramble finished in time")
        .expect("bramble output")
}
