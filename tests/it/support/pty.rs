//! A `bramble` process on a pseudo-terminal, as a user at a terminal runs it:
//! what it prints is collected by a reader thread; keys are written to
//! `input` as a terminal sends them.

use std::io::Read as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub struct Terminal {
    pub child: std::process::Child,
    pub input: std::fs::File,
    output: Arc<Mutex<Vec<u8>>>,
    /// How far the test has read (its own wait helpers move it).
    pub seen: usize,
}

impl Terminal {
    /// Start `bramble ARGS` with `HOME=home` on a new pseudo-terminal;
    /// `term`: the `TERM` it sees (none: unset).
    pub fn spawn(home: &Path, args: &[&str], term: Option<&str>) -> Terminal {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let stdio = || std::process::Stdio::from(pty.slave.try_clone().expect("dup"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_bramble"));
        cmd.args(args)
            .env_clear()
            .env("HOME", home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LANG", "C.UTF-8")
            .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio());
        if let Some(term) = term {
            cmd.env("TERM", term);
        }
        let child = cmd.spawn().expect("spawn bramble");
        drop(pty.slave);
        let master = std::fs::File::from(pty.master);
        let input = master.try_clone().expect("dup");
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut master = master;
            let mut buf = [0u8; 4096];
            // EIO once the child and its copies of the terminal are gone.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Terminal { child, input, output, seen: 0 }
    }

    /// Everything it printed so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }
}
