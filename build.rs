//! Build script: `bramble --version` names the git commit when built from a
//! checkout (`bramble 0.1.0 (1a2b3c4d5e6f)`), so a bug report says exactly
//! what runs; outside a checkout (a source tarball) it is the bare version.

use std::process::Command;

// The CLI's definition, to write its man page and completions (it uses only clap and std).
#[allow(dead_code)]
#[path = "src/cli/args.rs"]
mod args;

/// The binary is position-independent, so every pointer in its read-only data
/// is a "relative" relocation: 22,000 of them, 24 bytes each in `.rela.dyn`
/// (530 KB, 7 % of the file), all read at every start — the helper's too, at
/// every command. `-z pack-relative-relocs` stores them as a bitmap (`DT_RELR`,
/// 7 KB) and makes the binary require glibc 2.36 (`GLIBC_ABI_DT_RELR`, so an
/// older glibc refuses it with a clear error). GNU ld supports it on x86 only
/// (binutils 2.38+; older ones ignore it with a warning); Debian 12's ARM
/// cross binutils ignore it, so `cross/build.sh` links the ARM builds with
/// lld-16 and asks it there.
fn pack_relative_relocations() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.starts_with("x86_64-") && target.ends_with("-linux-gnu") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Release builds place the code an idle daemon runs (`cross/idle-order.ld`,
/// written by `cross/idle-order.sh` from a profile) at the start of `.text`,
/// together: an idle daemon then keeps ~1 MB of code resident instead of
/// ~3 MB spread over the binary. A linker script with `INSERT BEFORE .text`
/// only adds to the default layout; GNU ld and lld read it (checked: GNU ld
/// 2.40, lld 16, rustup's rust-lld). For a linker that does not (mold),
/// `BRAMBLE_NO_IDLE_ORDER=1` leaves it out (with `BRAMBLE_KEEP_UNWIND_TABLES=1`,
/// which leaves out the other script, `cross/no-unwind.ld`).
fn idle_order() {
    release_linker_script("idle-order.ld", "BRAMBLE_NO_IDLE_ORDER", true);
}

/// Release builds leave out the unwind tables (`cross/no-unwind.ld`): the
/// release profile's `panic = "abort"` leaves nothing to unwind, so they served
/// only a panic's backtrace, nameless in a stripped binary, and they were 8 %
/// of the file (aarch64: `.eh_frame` 326 KB + `.eh_frame_hdr` 77 KB, most of
/// it the precompiled std's, which `-C force-unwind-tables=no` cannot reach).
/// A panic still prints its message and location, then aborts. (A build
/// script cannot see the profile's `panic`: `CARGO_CFG_PANIC` is the target's
/// default. A release-profile build with unwinding, `cargo test --release`'s
/// binary, also aborts on a panic then.) A build with debug info keeps them:
/// a profiler's or debugger's stack walk needs them; so does
/// `BRAMBLE_KEEP_UNWIND_TABLES=1`.
fn no_unwind_tables() {
    let debug_info = std::env::var("DEBUG").is_ok_and(|d| d != "false");
    release_linker_script("no-unwind.ld", "BRAMBLE_KEEP_UNWIND_TABLES", !debug_info);
}

/// Give the linker `cross/NAME` (`-T`) in a release build for Linux when
/// `wanted`, unless the variable `opt_out` is set.
fn release_linker_script(name: &str, opt_out: &str, wanted: bool) {
    println!("cargo:rerun-if-env-changed={opt_out}");
    println!("cargo:rerun-if-changed=cross/{name}");
    let var = |key: &str| std::env::var(key).unwrap_or_default();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cross").join(name);
    if wanted && var("PROFILE") == "release" && var("TARGET").contains("-linux-") && !flag(opt_out) && script.exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
}

/// An opt-out variable is set: anything but empty or "0".
fn flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// `rerun-if-changed` for `path` when it exists; whether it does.
fn rerun_if_exists(path: &str) -> bool {
    let exists = std::path::Path::new(path).exists();
    if exists {
        println!("cargo:rerun-if-changed={path}");
    }
    exists
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    pack_relative_relocations();
    idle_order();
    no_unwind_tables();
    let version = env!("CARGO_PKG_VERSION");
    let version = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => format!("{version} ({commit})"),
        None => version.to_string(),
    };
    // The slim build says so (`bramble --version`, status): its integrations are left out.
    let version = if std::env::var_os("CARGO_FEATURE_SLIM").is_some() { format!("{version} slim") } else { version };
    println!("cargo:rustc-env=BRAMBLE_VERSION={version}");
    // Again when HEAD moves: HEAD itself names a branch, whose ref file moves.
    // Only paths that exist: cargo reruns the script at every build for one
    // that does not (a checkout without packed-refs, a branch only packed).
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        rerun_if_exists(&head);
    }
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(&["rev-parse", "--git-path", &reference]) {
            // A packed branch has no file yet: its directory shows when it gets one.
            if !rerun_if_exists(&path) {
                if let Some(dir) = std::path::Path::new(&path).parent() {
                    rerun_if_exists(&dir.to_string_lossy());
                }
            }
        }
    }
    if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"]) {
        rerun_if_exists(&packed);
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/cli/args.rs");
    if let Err(e) = docs(&version) {
        panic!("cannot write the man page and completions: {e}");
    }
}

/// `bramble.1` and the bash, zsh and fish completions into OUT_DIR, where the
/// .deb finds them, and each gzipped (`.gz`, no name or time in the header),
/// which the binary carries for `bramble man` and `bramble completions`
/// (80 KB of text as 12 KB). No date in the page: the same commit gives the
/// same bytes.
fn docs(version: &str) -> std::io::Result<()> {
    use clap::CommandFactory as _;
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let version: &'static str = Box::leak(version.to_string().into_boxed_str());
    let cmd = args::Cli::command().version(version);
    write_both(&out.join("bramble.1"), &man_page(&cmd)?)?;
    for (shell, file) in [
        (clap_complete::Shell::Bash, "bramble.bash"),
        (clap_complete::Shell::Zsh, "_bramble"),
        (clap_complete::Shell::Fish, "bramble.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), "bramble", &mut text);
        write_both(&out.join(file), &text)?;
    }
    Ok(())
}

/// The man page: clap's NAME, SYNOPSIS, DESCRIPTION and OPTIONS; then every
/// command here (clap's own list points at `bramble-init(1)` and such, pages
/// that do not exist), EXIT STATUS, ENVIRONMENT, FILES and EXAMPLES.
fn man_page(cmd: &clap::Command) -> std::io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    page.extend_from_slice(b".SH COMMANDS\n");
    commands(&mut page, cmd, "bramble");
    page.extend_from_slice(MAN_SECTIONS.as_bytes());
    man.render_version_section(&mut page)?;
    Ok(page)
}

/// `.TP` entries for each visible subcommand of `cmd`, nested ones by their full name.
fn commands(page: &mut Vec<u8>, cmd: &clap::Command, prefix: &str) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = format!("{prefix} {}", sub.get_name());
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        page.extend_from_slice(format!(".TP\n\\fB{}\\fR\n{}\n", roff(&name), roff(&about)).as_bytes());
        commands(page, sub, &name);
    }
}

/// Text safe in a roff line: backslashes and hyphens escaped, no leading control character.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|l| if l.starts_with(['.', '\'']) { format!("\\&{l}") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `--help` does not say: exit codes, the environment, the files, examples.
const MAN_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success.
.TP
\fB1\fR
An error: the message on standard error says what to do (a config error names FILE:LINE:COL).
\fBbramble doctor\fR exits 1 when any check is an error.
.TP
\fB2\fR
The command line was wrong (an unknown command or flag).
.TP
\fB130\fR
\fBbramble agent \-m\fR was stopped with Ctrl\-C.
.SH ENVIRONMENT
.TP
\fBBRAMBLE_CONFIG\fR
The config file, as \fB\-\-config\fR.
.TP
\fBOPENAI_API_KEY\fR, \fBANTHROPIC_API_KEY\fR
The provider's key, unless \fBapi_key_env\fR in [provider] names another variable.
.TP
\fBXDG_CONFIG_HOME\fR, \fBXDG_STATE_HOME\fR, \fBXDG_DATA_HOME\fR
Where the config, the state and the workspace are by default.
.TP
\fBRUST_LOG\fR
The log filter; it wins over [daemon] log_level.
.PP
Variables set in the environment win over the env file (see FILES).
.SH FILES
.TP
\fI~/.config/bramble/config.toml\fR
The config (\fBbramble init\fR writes a commented one; \fBbramble check\fR validates it).
.TP
\fI~/.config/bramble/env\fR
KEY=VALUE lines (API keys, bot tokens) read by the daemon and every command alike.
It must be readable by its owner only (chmod 600): otherwise it is not read.
.TP
\fI~/.local/state/bramble/\fR
The state: sessions, jobs, the outbox, the audit file, the control socket.
.TP
\fI~/.local/share/bramble/workspace/\fR
The agent's workspace: AGENTS.md, SOUL.md, HEARTBEAT.md, memory/, skills/.
.TP
\fI/etc/bramble/config.toml\fR, \fI/etc/bramble/env\fR, \fI/var/lib/bramble/\fR
The installed service's config, secrets and state (the .deb); \fBsudo bramble ...\fR acts as its user.
.SH EXAMPLES
.TP
\fBbramble init\fR
Set up: asks for the provider, model, key, Telegram and MQTT on a terminal.
.TP
\fBbramble init \-\-non\-interactive \-\-provider ollama \-\-model qwen2.5:3b\fR
The same from a script.
.TP
\fBbramble doctor\fR
Check the config, the provider, Telegram, MQTT, the clock and the disk.
.TP
\fBbramble agent \-m "what is the load average?"\fR
One turn in the terminal.
.TP
\fBbramble cron add tea \-\-every 1h \-\-remind "drink tea"\fR
A reminder every hour.
.TP
\fBbramble run\fR
The daemon in the foreground (under systemd: \fBsystemctl enable \-\-now bramble\fR).
"#;

/// `path` and `path.gz`.
fn write_both(path: &std::path::Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::write(path, text)?;
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    gz.write_all(text)?;
    let mut name = path.as_os_str().to_owned();
    name.push(".gz");
    std::fs::write(name, gz.finish()?)
}
