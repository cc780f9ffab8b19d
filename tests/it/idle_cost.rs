//! The daemon's idle cost per chat channel (BENCHMARKS): wake-ups a minute
//! (voluntary context switches of all its threads over 60 s, from
//! `/proc/<pid>/task/*/status`) and RSS, with no channel, with Matrix (an
//! idle Synapse), email (an idle dovecot, IMAP IDLE) and webhooks. A
//! measurement, not a check: `cargo test --test it idle_cost -- --ignored --nocapture`.

use std::path::Path;
use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::fake_llm::{Dialect, FakeLlm};
use crate::support::mail::{Dovecot, SmtpSink};
use crate::support::setup::TestHome;
use crate::support::synapse::Synapse;

/// (voluntary context switches per thread id, RSS in KiB).
fn sample(pid: u32) -> (std::collections::HashMap<String, u64>, u64) {
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut switches = std::collections::HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches.insert(task.file_name().to_string_lossy().into_owned(), field(&status, "voluntary_ctxt_switches:"));
    }
    let rss = field(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default(), "VmRSS:");
    (switches, rss)
}

async fn measure(name: &str, extra: &str, env: &[(&str, &Path)], ready: &str) -> String {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new("openai", &llm.base_url(), "", "", &format!("[heartbeat]\nenabled = false\n{extra}"));
    let log = home.path().join("idle.log");
    let daemon = Daemon::start_with_env(home.path(), Some(&home.config), &log, env);
    assert!(daemon.wait_log(ready, 60).await, "{name}: {}", daemon.log());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (s0, _) = sample(daemon.pid());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (s1, rss) = sample(daemon.pid());
    daemon.stop().await;
    // Threads that came meanwhile count whole; those that left are not seen (a blocking-pool thread idles out).
    let woke: u64 = s1.iter().map(|(t, n)| n.saturating_sub(s0.get(t).copied().unwrap_or(0))).sum();
    format!("| {name} | {woke} | {:.1} |", rss as f64 / 1024.0)
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
    println!("| channels | wake-ups / 60 s | RSS MiB |\n|---|---|---|");
    for row in [rows.0, rows.1, rows.2, rows.3] {
        println!("{row}");
    }
}
