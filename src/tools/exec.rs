//! `exec`: run a shell command in the workspace.
//!
//! The command runs through [`crate::sandbox::process::run`], so it gets its
//! own process group, a time limit, capped output, and nothing it starts
//! survives it; [`Sandbox::wrap`] (the sandbox the composition root built) puts it inside the kernel sandbox
//! (namespaces, read-only system, hidden state and config, rlimits, an
//! unprivileged user, Landlock — whatever this kernel offers, see SECURITY.md).
//! A short deny list ([`crate::sandbox::deny`]) answers the obvious
//! destructive commands early; it is a courtesy, not the boundary. Its environment is built from scratch — `PATH`, `HOME` (the
//! workspace), `LANG`, `TERM=dumb` and the names listed in `[exec] env_allow` —
//! so the provider keys and bot tokens in bramble's own environment never
//! reach a command a model wrote.
//!
//! A command that fails is not a tool error: the model reads the exit code
//! and the output like a person at a terminal would. Only a command that
//! cannot be started at all — or a sandbox layer that could not be set up —
//! is an error.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::fs::Workspace;
use super::{parse_args, truncate_middle, BoxFuture, Tool, ToolContext, ToolError};
use crate::config::{ExecConfig, Network};
use crate::sandbox::process::{self, CommandSpec, ExitState, Outcome};
use crate::sandbox::Sandbox;

/// Longest time a single command may run, whatever the model asks for.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// `PATH` for commands: the usual system directories, nothing from bramble's own.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Names always set by bramble, which `env_allow` cannot override.
const FIXED: [&str; 4] = ["PATH", "HOME", "LANG", "TERM"];

/// The `exec` tool.
pub struct ExecTool {
    cfg: ExecConfig,
    workspace: Workspace,
    /// Where commands run: the kernel sandbox, its probe and its jail built ahead.
    sandbox: Arc<Sandbox>,
    /// The tool's description: what the network setting lets commands reach.
    description: String,
}

#[derive(Deserialize)]
struct ExecArgs {
    command: String,
    timeout: Option<u64>,
    working_dir: Option<String>,
}

impl ExecTool {
    pub fn new(cfg: ExecConfig, workspace: PathBuf, sandbox: Arc<Sandbox>) -> Self {
        let description = describe(cfg.network);
        ExecTool { cfg, workspace: Workspace::new(workspace), sandbox, description }
    }

    /// Whether `[exec] enabled` is on; a disabled tool is not registered.
    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// The complete environment of a command.
    fn environment(&self) -> Vec<(OsString, OsString)> {
        let lang = std::env::var_os("LANG").filter(|v| !v.is_empty()).unwrap_or_else(|| "C.UTF-8".into());
        let mut env: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), PATH.into()),
            ("HOME".into(), self.workspace.root().into()),
            ("LANG".into(), lang),
            ("TERM".into(), "dumb".into()),
        ];
        for name in &self.cfg.env_allow {
            let usable = !name.is_empty() && !name.contains(['=', '\0']) && !FIXED.contains(&name.as_str());
            if !usable || env.iter().any(|(k, _)| k == name.as_str()) {
                continue;
            }
            if let Some(value) = std::env::var_os(name) {
                env.push((name.into(), value));
            }
        }
        env
    }

    /// How a command runs: `/bin/sh -c`, the minimal environment, output capped while read.
    /// [`ExecTool::start`] wraps it in the kernel sandbox as `[exec]` says.
    fn spec(&self, command: String, cwd: PathBuf, timeout: Duration, stdin: Option<Vec<u8>>) -> CommandSpec {
        CommandSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), command.into()],
            cwd,
            env: self.environment(),
            stdin,
            timeout,
            // Bytes per stream; characters are cut again below. Four bytes cover any UTF-8 character.
            max_output: self.cfg.max_output.saturating_mul(4).max(1024),
        }
    }

    /// Start the command in the sandbox and wait for it; `Err` is a message for the model.
    ///
    /// If the helper could not start or a layer failed *and* the sandbox probe then finds
    /// less than was assumed (see [`Sandbox::recheck`]), the command is wrapped
    /// again with what this system really offers and run once more. Setup fails before
    /// the command itself starts, so it never runs twice.
    /// `ahead`: a model's command, after which the next jail is built ahead ([`Sandbox::run`]).
    async fn start(
        &self,
        plain: CommandSpec,
        cancel: &tokio_util::sync::CancellationToken,
        ahead: bool,
    ) -> Result<Outcome, StartError> {
        let wrapped =
            self.sandbox.wrap(plain.clone(), &self.cfg, self.workspace.root()).map_err(StartError::Sandbox)?;
        let mut outcome = self.sandbox.run(wrapped, cancel, ahead).await;
        let failed = outcome.as_ref().map_or(true, |o| crate::sandbox::setup_error(o).is_some());
        if failed && self.sandbox.recheck() {
            let wrapped = self.sandbox.wrap(plain, &self.cfg, self.workspace.root()).map_err(StartError::Sandbox)?;
            outcome = process::run(wrapped, cancel).await;
        }
        let outcome = outcome.map_err(StartError::Spawn)?;
        match crate::sandbox::setup_error(&outcome) {
            Some(err) => Err(StartError::Sandbox(err)),
            None => Ok(outcome),
        }
    }

    async fn run(&self, args: ExecArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        if args.command.trim().is_empty() {
            return Err(ToolError::new("command is empty"));
        }
        let cwd = match args.working_dir.as_deref() {
            None | Some("") => self.workspace.root().to_path_buf(),
            Some(dir) => self.workspace.dir_path(dir).map_err(|e| ToolError::new(format!("working_dir: {e}")))?,
        };
        let timeout = args.timeout.map_or(self.cfg.timeout.get(), Duration::from_secs);
        let timeout = timeout.clamp(Duration::from_secs(1), MAX_TIMEOUT);
        crate::sandbox::deny::check(&args.command).map_err(ToolError::new)?;
        let spec = self.spec(args.command, cwd, timeout, None);
        let outcome = self.start(spec, &ctx.cancel, true).await.map_err(|e| ToolError::new(e.to_string()))?;
        Ok(render(&outcome, timeout, self.cfg.max_output))
    }
}

/// Why a command did not start. The sandbox's own errors stay its sentences:
/// they come from the helper across the exec boundary.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The sandbox cannot be set up as configured, or one of its layers failed.
    #[error("{0}")]
    Sandbox(String),
    #[error("could not start the command: {0}")]
    Spawn(std::io::Error),
}

/// Run `command` as the `exec` tool would (workspace as cwd, minimal
/// environment, `[exec] timeout`, capped output), for exec jobs and triggers.
/// Returns whether it exited with status 0, and its report: what it printed when it worked
/// (the reader needs no "Exit code: 0"), the output as the tool renders it when it did not.
pub async fn run_shell(
    sandbox: &Arc<Sandbox>,
    cfg: &ExecConfig,
    workspace: &std::path::Path,
    command: &str,
    stdin: Option<Vec<u8>>,
    cancel: &tokio_util::sync::CancellationToken,
) -> std::io::Result<(bool, String)> {
    let r = run_shell_output(sandbox, cfg, workspace, command, stdin, cancel).await?;
    Ok(match (r.ok, r.printed.is_empty()) {
        (true, true) => (true, "Done (the command printed nothing).".to_string()),
        (true, false) => (true, r.printed),
        (false, _) => (false, r.rendered),
    })
}

/// What a command run by [`run_shell_output`] left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellOutput {
    /// It exited with status 0.
    pub ok: bool,
    /// Its standard output alone (capped like the rest), for watchers.
    pub stdout: String,
    /// All of it as the tool renders it (stdout, stderr, how it ended).
    pub rendered: String,
    /// What it printed (stdout, stderr), without how it ended: a job's report when it worked.
    pub printed: String,
}

/// [`run_shell`], keeping the standard output apart.
pub async fn run_shell_output(
    sandbox: &Arc<Sandbox>,
    cfg: &ExecConfig,
    workspace: &std::path::Path,
    command: &str,
    stdin: Option<Vec<u8>>,
    cancel: &tokio_util::sync::CancellationToken,
) -> std::io::Result<ShellOutput> {
    let tool = ExecTool::new(cfg.clone(), workspace.to_path_buf(), Arc::clone(sandbox));
    let timeout = cfg.timeout.get().clamp(Duration::from_secs(1), MAX_TIMEOUT);
    let spec = tool.spec(command.to_string(), workspace.to_path_buf(), timeout, stdin);
    let outcome = tool.start(spec, cancel, false).await.map_err(std::io::Error::other)?;
    Ok(ShellOutput {
        ok: matches!(outcome.state, ExitState::Exited(0)),
        stdout: truncate_middle(outcome.stdout.text.trim_end_matches('\n'), cfg.max_output),
        rendered: render(&outcome, timeout, cfg.max_output),
        printed: body(&outcome, cfg.max_output),
    })
}

/// The text the model reads: stdout, `STDERR:` and stderr, then how it ended.
fn render(outcome: &Outcome, timeout: Duration, max_chars: usize) -> String {
    let body = body(outcome, max_chars);
    let status = ending(outcome, timeout);
    if body.is_empty() {
        status
    } else {
        format!("{body}\n{status}")
    }
}

/// What the command printed: stdout, then `STDERR:` and stderr, capped.
fn body(outcome: &Outcome, max_chars: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    let stdout = outcome.stdout.text.trim_end_matches('\n');
    if !stdout.is_empty() {
        parts.push(stdout.to_string());
    }
    let stderr = outcome.stderr.text.trim_end_matches('\n');
    if !stderr.trim().is_empty() {
        parts.push(format!("STDERR:\n{stderr}"));
    }
    truncate_middle(&parts.join("\n"), max_chars)
}

/// How the command ended, in words.
fn ending(outcome: &Outcome, timeout: Duration) -> String {
    match outcome.state {
        ExitState::Exited(code) => format!("Exit code: {code}"),
        ExitState::Signaled(sig) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(name) => format!("Killed by signal {sig} ({})", name.as_str()),
            Err(_) => format!("Killed by signal {sig}"),
        },
        ExitState::TimedOut => {
            format!("Timed out after {}s (the command and everything it started were killed)", timeout.as_secs())
        }
        ExitState::Cancelled => "Cancelled (the command and everything it started were killed)".to_string(),
    }
}

/// The model is told what the network setting means for its commands, so that
/// it picks tools that work (curl, not ping) and reads a refusal right.
fn describe(network: Network) -> String {
    let base = "Run a shell command (/bin/sh -c) in the workspace and return its output and exit code. \
                HOME is the workspace. Background processes are stopped when the command ends; \
                the command is killed when the timeout passes.";
    let (reach, unreachable) = match network {
        Network::All => return base.to_string(),
        Network::None => return format!("{base} Commands have no network."),
        Network::Filtered { internet: false, lan: true } => {
            ("the local network only", "The internet and this machine's own services are")
        }
        Network::Filtered { internet: true, lan: true } => {
            ("the internet and the local network", "This machine's own services are")
        }
        // "auto" is "internet" wherever the proxy can be set up.
        Network::Auto | Network::Filtered { .. } => {
            ("public internet only", "The local network and this machine's own services are")
        }
    };
    format!(
        "{base} Network: {reach}, through an HTTP proxy (http_proxy and https_proxy are set: curl, wget, git, \
         pip and Python follow them; tools that ignore them, such as ping or ssh, get no network). \
         {unreachable} not reachable."
    )
}

impl Tool for ExecTool {
    fn name(&self) -> &str {
        "exec"
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command"},
                "timeout": {"type": "integer", "minimum": 1, "maximum": 600,
                            "description": "Seconds before the command is killed"},
                "working_dir": {"type": "string", "description": "Directory to run in, relative to the workspace"}
            },
            "required": ["command"]
        })
    }
    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: ExecArgs = parse_args("exec", args)?;
            self.run(args, ctx).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::types::Dur;

    #[test]
    fn the_model_is_told_what_its_commands_can_reach() {
        let d = describe(Network::Auto);
        assert!(d.contains("Network: public internet only, through an HTTP proxy"), "{d}");
        assert!(d.contains("The local network and this machine's own services are not reachable."), "{d}");
        let d = describe(Network::Filtered { internet: false, lan: true });
        assert!(d.contains("the local network only") && d.contains("The internet and"), "{d}");
        assert!(describe(Network::None).ends_with("Commands have no network."));
        assert!(!describe(Network::All).contains("Network"), "all: nothing to warn about");
    }

    /// The tool without the kernel layers: this unit-test binary cannot serve as
    /// the `sandbox-exec` helper. tests/it/security.rs covers the layers through the
    /// real binary; these tests cover the process layer and the output.
    fn tool(dir: &std::path::Path, mut cfg: ExecConfig) -> ExecTool {
        cfg.isolation = crate::config::Isolation::Off;
        ExecTool::new(cfg, dir.to_path_buf(), Arc::new(Sandbox::new()))
    }

    async fn exec(t: &ExecTool, args: Value) -> Result<String, ToolError> {
        t.execute(args, &ToolContext::detached("test")).await
    }

    #[tokio::test]
    async fn output_format_like_a_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path(), ExecConfig::default());
        let out = exec(&t, json!({"command": "echo hello; echo oops >&2; exit 2"})).await.unwrap();
        assert_eq!(out, "hello\nSTDERR:\noops\nExit code: 2");
        assert_eq!(exec(&t, json!({"command": "true"})).await.unwrap(), "Exit code: 0");
        let out = exec(&t, json!({"command": "kill -TERM $$"})).await.unwrap();
        assert_eq!(out, "Killed by signal 15 (SIGTERM)");
    }

    #[tokio::test]
    async fn runs_in_the_workspace_with_home_there() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let t = tool(dir.path(), ExecConfig::default());
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let out = exec(&t, json!({"command": "pwd -P; echo $HOME; echo $TERM"})).await.unwrap();
        assert_eq!(out, format!("{}\n{}\ndumb\nExit code: 0", real.display(), dir.path().display()));
        let out = exec(&t, json!({"command": "pwd -P", "working_dir": "sub"})).await.unwrap();
        assert_eq!(out, format!("{}\nExit code: 0", real.join("sub").display()));
    }

    #[tokio::test]
    async fn working_dir_cannot_leave_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        let t = tool(dir.path(), ExecConfig::default());
        for wd in ["..", "/etc", "etc", "a/../../x"] {
            let err = exec(&t, json!({"command": "pwd", "working_dir": wd})).await.unwrap_err();
            assert_eq!(err.0, format!("working_dir: path escapes the workspace: {wd}"));
        }
        let err = exec(&t, json!({"command": "pwd", "working_dir": "missing"})).await.unwrap_err();
        assert!(err.0.contains("no such file or directory"), "{}", err.0);
    }

    #[tokio::test]
    async fn timeout_message_and_cap() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path(), ExecConfig { timeout: Dur::secs(1), ..ExecConfig::default() });
        let started = std::time::Instant::now();
        let out = exec(&t, json!({"command": "echo before; sleep 30"})).await.unwrap();
        assert_eq!(out, "before\nTimed out after 1s (the command and everything it started were killed)");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn cancellation_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path(), ExecConfig::default());
        let ctx = ToolContext::detached("test");
        let cancel = ctx.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            cancel.cancel();
        });
        let out = t.execute(json!({"command": "sleep 30"}), &ctx).await.unwrap();
        assert_eq!(out, "Cancelled (the command and everything it started were killed)");
    }

    #[tokio::test]
    async fn long_output_keeps_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path(), ExecConfig { max_output: 500, ..ExecConfig::default() });
        let out = exec(&t, json!({"command": "seq 1 100000"})).await.unwrap();
        assert!(out.starts_with("1\n2\n3\n"), "{out}");
        assert!(out.ends_with("99999\n100000\nExit code: 0"), "{out}");
        assert!(out.contains("characters truncated"));
        assert!(out.chars().count() <= 500 + "\nExit code: 0".len());
    }

    #[tokio::test]
    async fn secrets_stay_out_of_the_environment() {
        let name = "BRAMBLE_TEST_SECRET";
        let test = concat!(module_path!(), "::secrets_stay_out_of_the_environment");
        if !crate::util::test_env::in_child(test, &[(name, "sk-test-0123456789")], &[]) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path(), ExecConfig::default());
        let out = exec(&t, json!({"command": "env"})).await.unwrap();
        assert!(!out.contains("sk-test-0123456789"), "{out}");
        assert!(!out.contains(name));
        let mut names: Vec<&str> = out.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
        names.sort();
        // sh itself may add PWD (and SHLVL); nothing from bramble's environment.
        names.retain(|n| !["PWD", "SHLVL", "OLDPWD", "_"].contains(n));
        assert_eq!(names, ["HOME", "LANG", "PATH", "TERM"]);

        let cfg =
            ExecConfig { env_allow: vec![name.into(), "PATH".into(), "BAD=NAME".into()], ..ExecConfig::default() };
        let out = exec(&tool(dir.path(), cfg), json!({"command": "env"})).await.unwrap();
        assert!(out.contains(&format!("{name}=sk-test-0123456789")), "{out}");
        assert!(out.contains(&format!("PATH={PATH}\n")), "{out}");
    }

    #[tokio::test]
    async fn bad_arguments_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path(), ExecConfig::default());
        assert!(exec(&t, json!({"command": "  "})).await.is_err());
        assert!(exec(&t, json!({"cmd": "ls"})).await.unwrap_err().0.contains("missing field `command`"));
        assert!(exec(&t, json!({"command": "ls", "timeout": -1})).await.is_err());
        let t = tool(&dir.path().join("missing"), ExecConfig::default());
        let err = exec(&t, json!({"command": "true"})).await.unwrap_err();
        assert!(err.0.starts_with("could not start the command"), "{}", err.0);
        assert!(!ExecTool::new(ExecConfig { enabled: false, ..ExecConfig::default() }, "/".into(), Arc::default())
            .enabled());
    }
}
