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
