//! The daemon's idle cost per chat channel (BENCHMARKS): wake-ups a minute
//! (voluntary context switches of all its threads over 60 s, from
//! `/proc/<pid>/task/*/status`) and RSS, with no channel, with Matrix (an
//! idle Synapse), email (an idle dovecot, IMAP IDLE) and webhooks, and for
//! the chat apps whose servers cannot run here (Discord, Signal, Feishu /
//! Lark, ntfy) against their fakes, which keep the real services' idle
//! rhythm: Discord's Hello says 41.25 s heartbeats, Feishu's endpoint a
//! 120 s ping, and Signal's SSE and ntfy's JSON stream stay open and quiet.
//! A measurement, not a check: `cargo test --test it idle_cost -- --ignored --nocapture`.

use std::path::Path;
use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::fake_llm::{Dialect, FakeLlm};
use crate::support::mail::{Dovecot, SmtpSink};
use crate::support::procstat::sample;
use crate::support::setup::TestHome;
use crate::support::synapse::Synapse;

async fn measure(name: &str, extra: &str, env: &[(&str, &Path)], ready: &str) -> String {
    measure_for(name, extra, env, ready, 60).await
}

/// As [`measure`], over `secs` seconds, the wake-ups scaled to a minute.
async fn measure_for(name: &str, extra: &str, env: &[(&str, &Path)], ready: &str, secs: u64) -> String {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &llm.base_url(), "", "", &format!("[heartbeat]\nenabled = false\n{extra}"));
    let log = home.path().join("idle.log");
    let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &log, env);
    assert!(daemon.wait_log(ready, 60).await, "{name}: {}", daemon.log());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = sample(daemon.pid());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let after = sample(daemon.pid());
    daemon.stop().await;
    let woke = after.woke_since(&before);
    format!("| {name} | {:.1} | {:.1} |", woke as f64 * 60.0 / secs as f64, after.rss_kib as f64 / 1024.0)
}

#[tokio::test]
#[ignore = "a 70 s measurement for BENCHMARKS, not a check"]
async fn idle_cost_per_channel() {
    let synapse = Synapse::shared().await;
    let bot = synapse.user("idle").await;
    let imap = Dovecot::start().await;
    let smtp = SmtpSink::start().await;
    let matrix = format!(
        "[matrix]\nhomeserver = \"{}\"\nuser_id = \"{}\"\naccess_token_env = \"IDLE_MX\"\nallow_from = [\"@o:x\"]\n",
        synapse.url(),
        bot.id
    );
    let email = format!(
        "[email]\naddress = \"bot@home.example\"\npassword_env = \"IDLE_MAIL\"\nimap = \"imaps://localhost:{}\"\n\
         smtp = \"smtp+plain://127.0.0.1:{}\"\nallow_from = [\"me@example.org\"]\nauthserv_id = \"mx.home.example\"\n",
        imap.tls_port, smtp.port
    );
    let webhook = "[webhooks]\nlisten = \"127.0.0.1:0\"\n[[webhook]]\nname = \"door\"\ntoken_env = \"IDLE_HOOK\"\nmessage = \"x\"\n";
    let ca = imap.ca();
    let env: [(&str, &Path); 4] = [
        ("IDLE_MX", Path::new(&bot.token)),
        ("IDLE_MAIL", Path::new(&imap.password)),
        ("SSL_CERT_FILE", &ca),
        ("IDLE_HOOK", Path::new("idle-token-0123456789")),
    ];
    let rows = tokio::join!(
        measure("none", "", &env, "scheduler"),
        measure("matrix (idle Synapse)", &matrix, &env, "Matrix syncing"),
        measure("email (dovecot, IDLE)", &email, &env, "IMAP connected"),
        measure("webhooks", webhook, &env, "webhooks listening"),
    );
    println!("| channels | wake-ups / min | RSS MiB |\n|---|---|---|");
    for row in [rows.0, rows.1, rows.2, rows.3] {
        println!("{row}");
    }
}

#[cfg(all(feature = "discord", feature = "signal", feature = "feishu", feature = "ntfy"))]
#[tokio::test]
#[ignore = "a 250 s measurement for BENCHMARKS, not a check"]
async fn idle_cost_per_chat_app() {
    use crate::support::discord::FakeDiscord;
    use crate::support::feishu::{self as fake_feishu, FakeFeishu};
    use crate::support::ntfy::FakeNtfy;
    use crate::support::signal::FakeSignal;
    let discord = FakeDiscord::start("MTAw.idle.discord-token").await;
    let signal = FakeSignal::start().await;
    let feishu = FakeFeishu::start().await;
    let ntfy = FakeNtfy::start(Some("tk_idle0123456789abcdefghijklmno")).await;
    let env: [(&str, &Path); 4] = [
        ("IDLE_DISCORD", Path::new("MTAw.idle.discord-token")),
        ("IDLE_FEISHU", Path::new(fake_feishu::APP_SECRET)),
        ("IDLE_NTFY", Path::new("tk_idle0123456789abcdefghijklmno")),
        ("IDLE_NONE", Path::new("-")),
    ];
    let discord_cfg = format!(
        "[discord]\ntoken_env = \"IDLE_DISCORD\"\napi_base = \"{}\"\nallow_from = [\"80351110224678912\"]\n",
        discord.api_base()
    );
    let signal_cfg = format!(
        "[signal]\nendpoint = \"{}\"\naccount = \"+4915100000000\"\nallow_from = [\"+4915112345678\"]\n",
        signal.url()
    );
    let feishu_cfg = format!(
        "[feishu]\napp_id = \"{}\"\napp_secret_env = \"IDLE_FEISHU\"\ndomain = \"lark\"\napi_base = \"{}\"\n\
         allow_from = [\"ou_owner00000000000000000000000001\"]\n",
        fake_feishu::APP_ID,
        feishu.url()
    );
    let ntfy_cfg =
        format!("[ntfy]\nserver = \"{}\"\ntoken_env = \"IDLE_NTFY\"\nsubscribe = [\"cmd-idle\"]\n", ntfy.url());
    // Four minutes: Feishu pings every 120 s and Discord beats every 41 s, so one
    // minute would catch a fraction of a beat.
    let rows = tokio::join!(
        measure_for("none", "", &env, "scheduler", 240),
        measure_for("discord (gateway, 41.25 s heartbeat)", &discord_cfg, &env, "Discord connected", 240),
        measure_for("signal (signal-cli SSE)", &signal_cfg, &env, "Signal listening", 240),
        measure_for("feishu / lark (long connection, 120 s ping)", &feishu_cfg, &env, "long connection up", 240),
        measure_for("ntfy (one subscribed topic)", &ntfy_cfg, &env, "ntfy: subscribed", 240),
    );
    println!("| channels | wake-ups / min | RSS MiB |\n|---|---|---|");
    for row in [rows.0, rows.1, rows.2, rows.3, rows.4] {
        println!("{row}");
    }
}
