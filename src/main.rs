//! The `bramble` binary: parse the command line, run the command, turn errors
//! into a message and an exit code. Everything else lives in the library.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::multiple_unsafe_ops_per_block)]

use std::process::ExitCode;

fn main() -> ExitCode {
    // The hidden exec sandbox helper (`bramble sandbox-exec … -- CMD`): dispatched
    // before clap, TLS and the runtime, so that it starts in well under a millisecond.
    let args: Vec<std::ffi::OsString> = std::env::args_os().take(2).collect();
    if args.get(1).is_some_and(|a| a == "sandbox-exec") {
        let rest: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
        std::process::exit(bramble::sandbox::helper::main(&rest));
    }
    bramble::sandbox::use_current_exe();
    bramble::install_crypto();
    let cli = bramble::cli::parse();
    if cli.command.prints_and_exits() {
        // `bramble cron list | head` should end quietly like any Unix tool, not
        // panic on a closed pipe. Only for commands that just print: the daemon
        // and the agent write to pipes of child processes, where EPIPE must
        // stay an error instead of killing bramble.
        // SAFETY: called before any thread is started; SIG_DFL is a valid disposition.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // One thread runs all async work: a Pi has few cores and the daemon is I/O bound.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bramble: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bramble::cli::run(cli)) {
        Ok(code) => code,
        Err(err) => {
            // An error may quote a server's answer: its control characters are shown, not run.
            use bramble::util::text::escape_controls;
            eprintln!("bramble: error: {}", escape_controls(&err.to_string()));
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {}", escape_controls(&cause.to_string()));
            }
            ExitCode::FAILURE
        }
    }
}
