//! What a new owner meets (issue 37): the per-user env file the daemon and
//! the CLI both read, `status`/`pair` asking the running daemon, a key
//! variable that is named and unset, and `doctor`'s model check. Through the
//! real binary, each with its own HOME.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::http::{Response, TestServer};
use crate::support::setup::TestHome;
use crate::support::telegram::FakeTelegram;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `bramble ARGS` with HOME at `home` and only `env` besides.
async fn run(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LANG", "C.UTF-8")
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run bramble")
}

/// A home whose provider's key is named by `api_key_env` (a variable of its own), not given.
fn home_with_named_key(base_url: &str, extra: &str) -> TestHome {
    let home = TestHome::new("openai", base_url, "", "", extra);
    let cfg = std::fs::read_to_string(&home.config).unwrap();
    std::fs::write(&home.config, cfg.replace("api_key = \"test-key\"", "api_key_env = \"BRAMBLE_IT_KEY\"")).unwrap();
    home
}

/// `~/.config/bramble/env` under `home`, with `mode`.
fn env_file(home: &Path, body: &str, mode: u32) -> PathBuf {
    let dir = home.join(".config/bramble");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("env");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn line<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no `{key}` line: {stdout}"))
}

#[tokio::test]
async fn a_named_key_variable_that_is_unset_is_an_error_of_the_turn_and_a_warning_elsewhere() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home_with_named_key(&fake.base_url(), "");
    let cfg = home.config.to_str().unwrap();
    // Not "not needed (custom base_url)": a key was named.
    let status = text(&run(home.path(), &["--config", cfg, "status"], &[]).await.stdout);
    assert_eq!(line(&status, "api key:"), "api key:    MISSING: set BRAMBLE_IT_KEY (read in this shell)");
    let check = run(home.path(), &["--config", cfg, "check"], &[]).await;
    let out = text(&check.stdout);
    assert!(check.status.success(), "a warning, not an error: {out}");
    assert!(out.contains("warning: the openai provider's api_key_env names BRAMBLE_IT_KEY, which is not set"), "{out}");
    // The turn fails with the reason, before anything is sent (not a 401 per turn).
    let turn = run(home.path(), &["--config", cfg, "agent", "-m", "hello"], &[]).await;
    assert!(!turn.status.success());
    let err = text(&turn.stderr);
    assert!(err.contains("BRAMBLE_IT_KEY is not set"), "{err}");
    assert_eq!(fake.request_count(), 0);
    // No key configured at all, for an own server: not needed, and said so.
    let cfg_text = std::fs::read_to_string(&home.config).unwrap().replace("api_key_env = \"BRAMBLE_IT_KEY\"\n", "");
    std::fs::write(&home.config, cfg_text).unwrap();
    let status = text(&run(home.path(), &["--config", cfg, "status"], &[]).await.stdout);
    assert!(line(&status, "api key:").contains("not needed (own base_url, no api_key_env)"), "{status}");
}

#[tokio::test]
async fn the_env_file_is_read_by_every_command_and_the_shell_wins() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = home_with_named_key(&fake.base_url(), "[telegram]\ntoken_env = \"BRAMBLE_IT_TG\"\nallow_from = [7]\n");
    let cfg = home.config.to_str().unwrap();
    let path = env_file(
        home.path(),
        "# secrets\nBRAMBLE_IT_KEY=from-the-file-secret\nexport BRAMBLE_IT_TG=\"123:tg-secret\"\n",
        0o600,
    );
    let out = run(home.path(), &["--config", cfg, "status"], &[]).await;
    let status = text(&out.stdout);
    assert_eq!(line(&status, "api key:"), "api key:    set (read in this shell)");
    assert_eq!(line(&status, "telegram:"), "telegram:   configured, 1 allowed user (read in this shell)");
    assert_eq!(
        line(&status, "env file:"),
        format!("env file:   {}: BRAMBLE_IT_KEY, BRAMBLE_IT_TG (read in this shell)", path.display())
    );
    let all = status + &text(&out.stderr);
    assert!(!all.contains("from-the-file-secret") && !all.contains("tg-secret"), "values are never shown: {all}");
    // A turn sends the file's key.
    fake.push(Reply::text("hi"));
    let turn = run(home.path(), &["--config", cfg, "agent", "-m", "hello"], &[]).await;
    assert!(turn.status.success(), "{}", text(&turn.stderr));
    let auth = |fake: &FakeLlm| {
        let headers = fake.headers();
        let last = headers.last().unwrap();
        last.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone())
    };
    assert_eq!(auth(&fake).as_deref(), Some("Bearer from-the-file-secret"));
    // A variable set in the shell wins, and status says so.
    let shell = [("BRAMBLE_IT_KEY", "from-the-shell")];
    let status = text(&run(home.path(), &["--config", cfg, "status"], &shell).await.stdout);
    assert!(
        line(&status, "env file:").ends_with(
            "BRAMBLE_IT_TG; BRAMBLE_IT_KEY set in this shell, which wins over the file (read in this shell)"
        ),
        "{status}"
    );
    fake.push(Reply::text("hi"));
    assert!(run(home.path(), &["--config", cfg, "agent", "-m", "hello"], &shell).await.status.success());
    assert_eq!(auth(&fake).as_deref(), Some("Bearer from-the-shell"));
    // Readable by others: refused, loudly, without its values; nothing from it is used.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(home.path(), &["--config", cfg, "status"], &[]).await;
    let (status, err) = (text(&out.stdout), text(&out.stderr));
    assert!(err.contains("bramble: warning:") && err.contains("mode 0644") && err.contains("chmod 600"), "{err}");
    assert!(!err.contains("from-the-file-secret") && !status.contains("from-the-file-secret"));
    assert!(line(&status, "api key:").starts_with("api key:    MISSING: set BRAMBLE_IT_KEY"), "{status}");
    assert!(line(&status, "env file:").contains("NOT READ"), "{status}");
    // A malformed line names the file and line, and not what was on it.
    env_file(home.path(), "BRAMBLE_IT_KEY=x\nthis is sk-not-a-line\n", 0o600);
    let err = text(&run(home.path(), &["--config", cfg, "check"], &[]).await.stderr);
    assert!(err.contains(&format!("{}:2: expected KEY=VALUE", path.display())), "{err}");
    assert!(!err.contains("sk-not-a-line"), "{err}");
}

#[tokio::test]
async fn status_and_pair_ask_the_running_daemon_and_say_where_they_read() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let tg = FakeTelegram::start("123:daemon").await;
    let extra = format!("[telegram]\ntoken_env = \"BRAMBLE_IT_TG\"\nallow_from = [7]\napi_base = \"{}\"\n", tg.url());
    let home = home_with_named_key(&fake.base_url(), &extra);
    let cfg = home.config.to_str().unwrap().to_string();
    // The secrets are in the daemon's shell only.
    let env = [("BRAMBLE_IT_KEY", Path::new("daemon-key")), ("BRAMBLE_IT_TG", Path::new("123:daemon"))];
    let log = home.path().join("daemon.log");
    let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &log, &env);
    let socket = home.state.join("control.sock");
    assert!(wait_until(30, || socket.exists()).await, "the control socket: {}", daemon.log());
    let status = text(&run(home.path(), &["--config", &cfg, "status"], &[]).await.stdout);
    assert_eq!(line(&status, "api key:"), "api key:    set (from the running daemon)");
    assert_eq!(line(&status, "telegram:"), "telegram:   configured, 1 allowed user (from the running daemon)");
    assert!(line(&status, "control:").contains(&format!("pid {} answers on its control socket", daemon.pid())));
    let pair = run(home.path(), &["--config", &cfg, "pair"], &[]).await;
    assert!(pair.status.success(), "{}", text(&pair.stderr));
    assert!(text(&pair.stdout).contains("Telegram is configured in the running daemon"), "{}", text(&pair.stdout));
    assert!(text(&pair.stdout).contains("/pair "), "{}", text(&pair.stdout));
    daemon.stop().await;

    // No daemon: this shell's reading, said as such.
    let status = text(&run(home.path(), &["--config", &cfg, "status"], &[]).await.stdout);
    assert_eq!(
        line(&status, "telegram:"),
        "telegram:   not configured: token_env names BRAMBLE_IT_TG, which is not set (read in this shell)"
    );
    let pair = run(home.path(), &["--config", &cfg, "pair"], &[]).await;
    assert!(!pair.status.success());
    assert!(text(&pair.stderr).contains("read in this shell, no daemon answered"), "{}", text(&pair.stderr));

    // Something else on the socket that answers nonsense (or nothing) is not believed.
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            use std::io::Write as _;
            let mut stream = stream;
            let _ = stream.write_all(b"{\"out\": \"{\\\"telegram_token\\\": true}\", \"code\": 0}\n");
        }
    });
    let out = run(home.path(), &["--config", &cfg, "status"], &[]).await;
    let status = text(&out.stdout);
    assert!(line(&status, "telegram:").ends_with("(read in this shell)"), "{status}");
    assert!(!run(home.path(), &["--config", &cfg, "pair"], &[]).await.status.success());
}

#[tokio::test]
async fn doctor_warns_of_an_unset_key_and_a_model_the_server_does_not_list() {
    // An OpenAI-compatible model list (GET /v1/models, OpenAI's "List models" answer).
    let models = TestServer::start(|req| match req.path_only() {
        "/v1/models" => Response::json(
            200,
            &serde_json::json!({"object": "list", "data": [{"id": "gpt-x", "object": "model"}, {"id": "test-model:latest", "object": "model"}]}),
        ),
        _ => Response::new(404),
    })
    .await;
    let home = TestHome::new("openai", &format!("{}/v1", models.url()), "", "", "");
    let cfg = home.config.to_str().unwrap().to_string();
    // Ollama's `name:latest` is the model named without a tag.
    let out = text(&run(home.path(), &["--config", &cfg, "doctor"], &[]).await.stdout);
    assert!(out.contains("ok       model openai     test-model is in the server's model list"), "{out}");
    let typo = std::fs::read_to_string(&home.config).unwrap().replace("\"test-model\"", "\"test-modle\"");
    std::fs::write(&home.config, typo).unwrap();
    let out = run(home.path(), &["--config", &cfg, "doctor"], &[]).await;
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("warning  model openai     test-modle is not in the server's list of 2 models (e.g. gpt-x, test-model:latest)"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(0), "a warning: {stdout}");
    // A named, unset key variable: a warning that names it, and no request made without it.
    let named = std::fs::read_to_string(&home.config)
        .unwrap()
        .replace("api_key = \"test-key\"", "api_key_env = \"BRAMBLE_IT_KEY\"");
    std::fs::write(&home.config, named).unwrap();
    let stdout = text(&run(home.path(), &["--config", &cfg, "doctor"], &[]).await.stdout);
    assert!(
        stdout.contains("warning  provider openai  api_key_env names BRAMBLE_IT_KEY, which is not set"),
        "{stdout}"
    );
}

/// A `bramble` process on a pseudo-terminal, as a user at a terminal runs it.
type OnTerminal = crate::support::pty::Terminal;

impl OnTerminal {
    /// Wait for `prompt` (after what was answered so far), then type `line`.
    async fn answer(&mut self, prompt: &str, line: &str) {
        use std::io::Write as _;
        let found = wait_until(30, || self.text()[self.seen..].contains(prompt)).await;
        let all = self.text();
        assert!(found, "no prompt `{prompt}`: {all}");
        self.seen = all[self.seen..].find(prompt).map(|i| self.seen + i + prompt.len()).unwrap();
        self.input.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    async fn finish(mut self) -> (i32, String) {
        assert!(wait_until(60, || self.child.try_wait().unwrap().is_some()).await, "init ended: {}", self.text());
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        // The rest of the output, until the reader has all of it.
        wait_until(5, || self.text().contains("Next:")).await;
        (code, self.text())
    }
}

#[tokio::test]
async fn init_asks_on_a_terminal_writes_the_answers_and_checks_them() {
    use crate::support::telegram::BOT_USERNAME;
    // The model list of an OpenAI-compatible server that wants the key typed in.
    let models = TestServer::start(|req| match (req.path_only(), req.header("authorization")) {
        ("/v1/models", Some("Bearer typed-secret-key")) => {
            Response::json(200, &serde_json::json!({"object": "list", "data": [{"id": "my-model", "object": "model"}]}))
        }
        ("/v1/models", _) => Response::json(401, &serde_json::json!({"error": {"message": "no key"}})),
        _ => Response::new(404),
    })
    .await;
    let tg = FakeTelegram::start("555:tok").await;
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join(".config/bramble/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    // The owner's own file: its comment, its values and its order stay.
    let own = format!(
        "# my own notes\n[agent]\nworkspace = \"{}\"\n\n[telegram]\napi_base = \"{}\"\n[daemon]\nstate_dir = \"{}\"\n",
        home.path().join("ws").display(),
        tg.url(),
        home.path().join("state").display()
    );
    std::fs::write(&config, &own).unwrap();
    let mut t = OnTerminal::spawn(home.path(), &["init"], None);
    t.answer("Where is the model?", "5").await;
    t.answer("The server's URL", &format!("{}/v1", models.url())).await;
    t.answer("Model", "my-model").await;
    t.answer("The variable that holds the API key (empty: no key)", "BRAMBLE_IT_KEY").await;
    t.answer("Paste the key", "typed-secret-key").await;
    t.answer("Use a Telegram bot?", "y").await;
    t.answer("The variable that holds its token [TELEGRAM_BOT_TOKEN]", "").await;
    t.answer("Paste the bot's token", "555:tok").await;
    t.answer("Your Telegram user id", "42").await;
    t.answer("Use an MQTT broker?", "n").await;
    let (code, out) = t.finish().await;
    assert_eq!(code, 0, "{out}");
    // Typed without echo: the secrets never reach the screen.
    assert!(!out.contains("typed-secret-key") && !out.contains("555:tok"), "{out}");
    assert!(out.contains("my-model is in the server's model list"), "{out}");
    assert!(out.contains(&format!("the bot is @{BOT_USERNAME}")), "{out}");
    assert!(out.contains("Next: `bramble agent -m \"hello\"`, then `bramble run`."), "{out}");
    let written = std::fs::read_to_string(&config).unwrap();
    assert!(written.starts_with("# my own notes\n[agent]\n"), "{written}");
    assert!(written.contains(&format!("api_base = \"{}\"", tg.url())), "{written}");
    for key in ["kind = \"openai\"", "model = \"my-model\"", "api_key_env = \"BRAMBLE_IT_KEY\"", "allow_from = [42]"] {
        assert!(written.contains(key), "{key}: {written}");
    }
    let env = home.path().join(".config/bramble/env");
    let mode = std::fs::metadata(&env).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let env_text = std::fs::read_to_string(&env).unwrap();
    assert!(
        env_text.contains("\nBRAMBLE_IT_KEY=typed-secret-key\n") && env_text.contains("\nTELEGRAM_BOT_TOKEN=555:tok\n")
    );
    // The config and env file work for the next command as they are.
    let check = run(home.path(), &["check"], &[]).await;
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&check.stdout).contains("telegram: configured, 1 allowed user"), "{}", text(&check.stdout));

    // Re-running (a script's flags) keeps every value and adds what is new.
    let again = run(home.path(), &["init", "--provider", "anthropic", "--mqtt", "mqtt://127.0.0.1:1883"], &[]).await;
    let out = text(&again.stdout);
    assert!(again.status.success(), "{out}{}", text(&again.stderr));
    assert!(out.contains("kept    [provider] kind (already set)"), "{out}");
    assert!(out.contains("set     [mqtt] url = \"mqtt://127.0.0.1:1883\""), "{out}");
    let after = std::fs::read_to_string(&config).unwrap();
    assert!(after.contains("kind = \"openai\"") && after.contains("url = \"mqtt://127.0.0.1:1883\""), "{after}");
    assert!(after.starts_with(&written.trim_end().to_string()), "only added to: {after}");
}

#[tokio::test]
async fn init_flags_are_checked_and_nothing_is_asked_without_a_terminal() {
    let home = tempfile::tempdir().unwrap();
    let bad = run(home.path(), &["init", "--provider", "other"], &[]).await;
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("--provider other needs --base-url"), "{}", text(&bad.stderr));
    let bad = run(home.path(), &["init", "--telegram-token-env", "NOT A NAME"], &[]).await;
    assert!(text(&bad.stderr).contains("is not a variable name"), "{}", text(&bad.stderr));
    let ok = run(home.path(), &["init", "--provider", "ollama", "--model", "qwen2.5:0.5b"], &[]).await;
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let written = std::fs::read_to_string(home.path().join(".config/bramble/config.toml")).unwrap();
    assert!(
        written.contains("base_url = \"http://127.0.0.1:11434/v1\"") && written.contains("model = \"qwen2.5:0.5b\"")
    );
    assert!(!written.lines().any(|l| l.starts_with("api_key_env")), "a LAN server needs no key: {written}");
}

/// The build script names only files that exist: cargo reruns it (and
/// rebuilds bramble) at every build for one that does not.
#[test]
fn the_build_script_watches_only_files_that_exist() {
    let output = Path::new(env!("OUT_DIR")).parent().unwrap().join("output");
    let text = std::fs::read_to_string(&output).unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let watched: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("cargo:rerun-if-changed=")).collect();
    assert!(watched.contains(&"build.rs"), "{text}");
    for path in watched {
        assert!(manifest.join(path).exists(), "rerun-if-changed on a missing {path}: {text}");
    }
}

#[tokio::test]
async fn agent_m_has_its_own_session_unless_s_is_given() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &fake.base_url(), "", "", "");
    let cfg = home.config.to_str().unwrap();
    fake.push(Reply::text("ok one"));
    assert!(run(home.path(), &["--config", cfg, "agent", "-m", "one-off question"], &[]).await.status.success());
    // The chat does not see the one-off message.
    fake.push(Reply::text("ok two"));
    let chat =
        crate::support::setup::bramble(home.path(), &["--config", cfg, "agent"], Some("chat message\nexit\n")).await;
    assert!(chat.status.success(), "{}", text(&chat.stderr));
    let sent = fake.last_request().unwrap().to_string();
    assert!(sent.contains("chat message") && !sent.contains("one-off question"), "{sent}");
    // `-s cli:direct` joins the chat's session on purpose.
    fake.push(Reply::text("ok three"));
    let joined = run(home.path(), &["--config", cfg, "agent", "-s", "cli:direct", "-m", "follow-up"], &[]).await;
    assert!(joined.status.success());
    let sent = fake.last_request().unwrap().to_string();
    assert!(sent.contains("chat message") && sent.contains("follow-up"), "{sent}");
    // The next `-m` remembers only the earlier `-m`.
    fake.push(Reply::text("ok four"));
    assert!(run(home.path(), &["--config", cfg, "agent", "-m", "second one-off"], &[]).await.status.success());
    let sent = fake.last_request().unwrap().to_string();
    assert!(sent.contains("one-off question") && !sent.contains("chat message"), "{sent}");
}

#[tokio::test]
async fn the_man_page_has_files_environment_exit_status_and_examples_and_no_missing_pages() {
    let dir = tempfile::tempdir().unwrap();
    let man = text(&run(dir.path(), &["man"], &[]).await.stdout);
    for section in [".SH FILES", ".SH ENVIRONMENT", ".SH \"EXIT STATUS\"", ".SH EXAMPLES", ".SH COMMANDS"] {
        assert!(man.contains(section), "{section}: {man}");
    }
    assert!(man.contains("~/.config/bramble/env") && man.contains("BRAMBLE_CONFIG"), "{man}");
    // Every command, nested ones by their full name, and no `bramble-init(1)`: there is one page.
    assert!(man.contains("\\fBbramble cron add\\fR") && man.contains("\\fBbramble init\\fR"), "{man}");
    let refs: Vec<&str> = man.split_whitespace().filter(|w| w.contains("(1)") || w.contains("(5)")).collect();
    assert!(refs.is_empty(), "references to other pages: {refs:?}");
}

/// A directory shaped like `cross/release.sh`'s output for `arch`: a small
/// real .deb (dpkg-deb), a tarball and SHA256SUMS (`sha256sum`'s format).
fn release_dir(arch: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/bin")).unwrap();
    std::fs::write(pkg.join("usr/bin/bramble"), "#!/bin/sh\necho fake bramble\n").unwrap();
    std::fs::write(
        pkg.join("DEBIAN/control"),
        format!("Package: bramble\nVersion: 9.9.9\nArchitecture: {arch}\nMaintainer: t <t@t>\nDescription: test\n"),
    )
    .unwrap();
    let deb = dir.path().join(format!("bramble_9.9.9_{arch}.deb"));
    let built = std::process::Command::new("dpkg-deb").arg("--build").arg(&pkg).arg(&deb).output().unwrap();
    assert!(built.status.success(), "{}", text(&built.stderr));
    std::fs::remove_dir_all(&pkg).unwrap();
    std::fs::write(dir.path().join("bramble-9.9.9-x86_64-linux-gnu.tar.gz"), "not used").unwrap();
    let sums = std::process::Command::new("sh")
        .arg("-c")
        .arg("sha256sum -- *.deb *.tar.gz > SHA256SUMS")
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(sums.success());
    dir
}

/// Serve `dir`'s files by name (GET /NAME), as a release page does.
async fn serve(dir: &Path) -> TestServer {
    let dir = dir.to_path_buf();
    TestServer::start(move |req| {
        let name = req.path_only().trim_start_matches('/');
        match std::fs::read(dir.join(name)) {
            Ok(body) if !name.contains('/') && !name.is_empty() => Response::new(200).body(body),
            _ => Response::new(404),
        }
    })
    .await
}

async fn install_sh(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install.sh");
    tokio::process::Command::new("sh").arg(script).args(args).output().await.expect("sh install.sh")
}

#[tokio::test]
async fn install_sh_picks_this_machines_deb_checks_its_sum_and_refuses_a_mismatch() {
    let arch = text(&std::process::Command::new("dpkg").arg("--print-architecture").output().unwrap().stdout);
    let arch = arch.trim();
    let release = release_dir(arch);
    // The other boards' packages are there too: the right one is picked.
    let other = if arch == "arm64" { "armhf" } else { "arm64" };
    let other_dir = release_dir(other);
    std::fs::copy(
        other_dir.path().join(format!("bramble_9.9.9_{other}.deb")),
        release.path().join(format!("bramble_9.9.9_{other}.deb")),
    )
    .unwrap();
    let sums = std::process::Command::new("sh")
        .arg("-c")
        .arg("sha256sum -- *.deb *.tar.gz > SHA256SUMS")
        .current_dir(release.path())
        .status()
        .unwrap();
    assert!(sums.success());
    let server = serve(release.path()).await;
    let into = tempfile::tempdir().unwrap();
    let dest = into.path().join("dl");
    let out = install_sh(&["--base-url", &server.url(), "--download-only", dest.to_str().unwrap()]).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let deb = format!("bramble_9.9.9_{arch}.deb");
    assert!(stdout.contains(&format!("== checksum ok: {deb}")), "{stdout}");
    assert!(dest.join(&deb).is_file() && !dest.join(format!("bramble_9.9.9_{other}.deb")).exists());
    // A dry run says what it would install, with apt.
    let out = install_sh(&["--base-url", &server.url(), "--dry-run"]).await;
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("would run: apt-get install -y ") && stdout.contains(&deb),
        "{stdout}"
    );

    // An altered package: refused, deleted, nothing installed.
    std::fs::write(release.path().join(&deb), b"a different file").unwrap();
    let dest2 = into.path().join("dl2");
    let out = install_sh(&["--base-url", &server.url(), "--download-only", dest2.to_str().unwrap()]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("checksum mismatch for {deb}: not installed")), "{err}");
    assert!(!dest2.join(&deb).exists(), "the altered file is deleted");
    // No package for the board, no address, a plain-http address elsewhere: clear refusals.
    let out = install_sh(&["--base-url", &server.url(), "--arch", "armel", "--dry-run"]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no armel package (soft float)"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("armv6-linux-musleabihf.tar.gz"), "{}", text(&out.stderr));
    let out = install_sh(&["--dry-run"]).await;
    assert!(text(&out.stderr).contains("no release address: pass --base-url"), "{}", text(&out.stderr));
    let out = install_sh(&["--base-url", "http://example.org/r", "--dry-run"]).await;
    assert!(text(&out.stderr).contains("must be https://"), "{}", text(&out.stderr));
}

/// A release with every board's package (`cross/release.sh`'s four .debs).
fn every_boards_release() -> tempfile::TempDir {
    let release = release_dir("amd64");
    for arch in ["arm64", "armhf", "riscv64"] {
        let other = release_dir(arch);
        let deb = format!("bramble_9.9.9_{arch}.deb");
        std::fs::copy(other.path().join(&deb), release.path().join(&deb)).unwrap();
    }
    let sums = std::process::Command::new("sh")
        .arg("-c")
        .arg("sha256sum -- *.deb *.tar.gz > SHA256SUMS")
        .current_dir(release.path())
        .status()
        .unwrap();
    assert!(sums.success());
    release
}

/// install.sh on a machine without dpkg whose `uname -m` says `machine`: a
/// PATH of only the tools it uses, and a `uname` that answers for the board.
async fn install_sh_on(machine: &str, base_url: &str, dest: &Path) -> Output {
    let bin = tempfile::tempdir().unwrap();
    for tool in ["curl", "sha256sum", "grep", "head", "mkdir", "mktemp", "rm", "id"] {
        let found = ["/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(tool)).find(|p| p.exists());
        std::os::unix::fs::symlink(found.expect(tool), bin.path().join(tool)).unwrap();
    }
    let uname = bin.path().join("uname");
    std::fs::write(&uname, format!("#!/bin/sh\necho {machine}\n")).unwrap();
    std::fs::set_permissions(&uname, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install.sh");
    tokio::process::Command::new("/bin/sh")
        .arg(script)
        .args(["--base-url", base_url, "--download-only", dest.to_str().unwrap()])
        .env_clear()
        .env("PATH", bin.path())
        .output()
        .await
        .expect("sh install.sh")
}

#[tokio::test]
async fn install_sh_gives_a_pi_zero_the_armv6_armhf_package_and_a_riscv_board_its_own() {
    let release = every_boards_release();
    let server = serve(release.path()).await;
    let into = tempfile::tempdir().unwrap();
    // `uname -m` without dpkg: a Pi Zero W / Pi 1 (armv6l) and a Pi 2 (armv7l)
    // on 32-bit Raspberry Pi OS get the armhf package (the ARMv6 build), a
    // RISC-V board the riscv64 one; each only its own.
    for (machine, arch) in [("armv6l", "armhf"), ("armv7l", "armhf"), ("riscv64", "riscv64"), ("aarch64", "arm64")] {
        let dest = into.path().join(machine);
        let out = install_sh_on(machine, &server.url(), &dest).await;
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{machine}: {stdout}{}", text(&out.stderr));
        let deb = format!("bramble_9.9.9_{arch}.deb");
        assert!(stdout.contains(&format!("== checksum ok: {deb}")), "{machine}: {stdout}");
        let got: Vec<String> = std::fs::read_dir(&dest)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".deb"))
            .collect();
        assert_eq!(got, vec![deb], "{machine}");
    }
    // `--arch` (what dpkg says on Raspberry Pi OS, on every 32-bit Pi: armhf).
    let dest = into.path().join("flag");
    let out =
        install_sh(&["--base-url", &server.url(), "--arch", "riscv64", "--download-only", dest.to_str().unwrap()])
            .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dest.join("bramble_9.9.9_riscv64.deb").is_file());
    // A board there is no build for: a clear refusal that lists what there is.
    let out = install_sh_on("mips", &server.url(), &into.path().join("mips")).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("no build for the architecture mips") && err.contains("riscv64"), "{err}");
    assert!(!into.path().join("mips").exists(), "nothing downloaded for mips");
}
