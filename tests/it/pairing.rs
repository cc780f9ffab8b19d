//! `bramble pair` across channels, from the terminal: the code printed per
//! channel, the typed ids of `--revoke`, and the Telegram default kept. The
//! end-to-end pairings against real servers are in `matrix.rs` and `email.rs`.

use crate::support::setup::TestHome;

/// `bramble pair <args>` (the real binary) as the owner would run it: success, and stdout + stderr.
pub fn pair_cli(home: &TestHome, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .arg("--config")
        .arg(&home.config)
        .arg("pair")
        .args(args)
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .output()
        .expect("run bramble pair");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The code a successful `bramble pair` printed.
#[cfg_attr(not(any(feature = "matrix", feature = "email")), allow(dead_code))]
pub fn code_of(out: &str) -> String {
    out.lines().find_map(|l| l.trim().strip_prefix("/pair ")).unwrap_or_else(|| panic!("no code in {out}")).to_string()
}

fn home(extra: &str) -> TestHome {
    TestHome::new("openai", "http://127.0.0.1:9", "", "", &format!("[heartbeat]\nenabled = false\n{extra}"))
}

#[test]
#[cfg(all(feature = "matrix", feature = "email"))]
fn each_channel_gets_its_own_code_and_its_own_ids_are_checked() {
    let h = home(
        "[matrix]\nhomeserver = \"http://127.0.0.1:9\"\nuser_id = \"@bot:x\"\naccess_token_env = \"NO_SUCH_VAR\"\n\
         [email]\naddress = \"bot@home.example\"\nimap = \"imaps://127.0.0.1:9\"\npassword_env = \"NO_SUCH_VAR\"\n",
    );
    let (ok, out) = pair_cli(&h, &["--channel", "matrix"]);
    assert!(ok && out.contains("invite @bot:x"), "{out}");
    let matrix = code_of(&out);
    assert!(h.state.join("matrix-pair-code.json").exists() && !h.state.join("telegram-pair-code.json").exists());
    let (ok, out) = pair_cli(&h, &["--channel", "email"]);
    assert!(ok && out.contains("mail bot@home.example"), "{out}");
    assert_ne!(code_of(&out), matrix, "a code per channel");
    // Without --channel it is Telegram, as before: not configured here, so refused with the reason.
    let (ok, out) = pair_cli(&h, &[]);
    assert!(!ok && out.contains("Telegram is not configured"), "{out}");
    let (ok, out) = pair_cli(&h, &["--channel", "slack"]);
    assert!(!ok && out.contains("invalid value 'slack'"), "{out}");
    // Ids are typed per channel.
    let (ok, out) = pair_cli(&h, &["--channel", "matrix", "--revoke", "bob"]);
    assert!(!ok && out.contains("not a matrix user: give a Matrix user id"), "{out}");
    let (ok, out) = pair_cli(&h, &["--revoke", "@bob:x"]);
    assert!(!ok && out.contains("give a numeric user id"), "{out}");
    let (ok, out) = pair_cli(&h, &["--channel", "email", "--revoke", "bob@example.org"]);
    assert!(!ok && out.contains("not a paired user of email (`bramble pair --channel email --list`"), "{out}");
    let (ok, out) = pair_cli(&h, &["--channel", "email", "--list"]);
    assert!(ok && out.contains("no paired email users ([email] allow_from"), "{out}");
}

#[test]
fn a_channel_that_is_not_configured_has_nobody_to_pair_with() {
    let h = home("");
    let (ok, out) = pair_cli(&h, &["--channel", "matrix"]);
    assert!(!ok && out.contains("Matrix is not configured ([matrix] homeserver)"), "{out}");
    let (ok, out) = pair_cli(&h, &["--channel", "email"]);
    assert!(!ok && out.contains("email is not configured"), "{out}");
    assert!(!h.state.join("matrix-pair-code.json").exists() && !h.state.join("email-pair-code.json").exists());
}
