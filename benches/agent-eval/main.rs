//! The agent eval runner: bramble's own scheduling cases (English and
//! Chinese) and cases from BFCL against any OpenAI-compatible endpoint, one real
//! turn per case, scored by [`harness`]. It measures a model with bramble's
//! prompt and tools; the CI test (`tests/it/agent_eval.rs`) runs the same
//! harness against a scripted provider, which tests the harness only.
//!
//! ```sh
//! AGENT_EVAL_BASE_URL=http://127.0.0.1:8080/v1 AGENT_EVAL_MODEL=qwen2.5-1.5b-instruct \
//!   cargo bench --bench agent-eval
//! ```
//!
//! The cases: `cases.jsonl` (bramble's own) and `bfcl.jsonl` (from the
//! Berkeley Function-Calling Leaderboard's data); `AGENT_EVAL_CASES` picks
//! other files (comma-separated), `AGENT_EVAL_IDS` (ids,
//! comma-separated) a subset of it; `AGENT_EVAL_PROFILE` (`default`, `lean`)
//! and `AGENT_EVAL_TEXT_TOOL_CALLS` (`recover`, `off`) set bramble up;
//! `AGENT_EVAL_WORKSPACE` one workspace path for every case (emptied before
//! each), so the system prompt is the same in every turn and a server's
//! prompt cache works as on a real board. The
//! endpoint gets no key (a local server needs none). The last line printed
//! is one `summary:` line, for scripts (`local-model.sh`) to collect.

#[path = "../../tests/it/support/mod.rs"]
mod support;

mod harness;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn main() -> std::process::ExitCode {
    let Ok(base_url) = std::env::var("AGENT_EVAL_BASE_URL") else {
        eprintln!("agent-eval: set AGENT_EVAL_BASE_URL to an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1); nothing run");
        return std::process::ExitCode::SUCCESS;
    };
    let model = env_or("AGENT_EVAL_MODEL", "default");
    let setup = harness::Setup {
        profile: env_or("AGENT_EVAL_PROFILE", "default"),
        text_tool_calls: env_or("AGENT_EVAL_TEXT_TOOL_CALLS", "recover"),
        workspace: std::env::var_os("AGENT_EVAL_WORKSPACE").map(std::path::PathBuf::from),
    };
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/agent-eval");
    let files = env_or("AGENT_EVAL_CASES", &format!("{dir}/cases.jsonl,{dir}/bfcl.jsonl"));
    let mut cases = Vec::new();
    for file in files.split(',').filter(|f| !f.trim().is_empty()) {
        match harness::load(std::path::Path::new(file.trim())) {
            Ok(c) => cases.extend(c),
            Err(e) => {
                eprintln!("agent-eval: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    if let Ok(ids) = std::env::var("AGENT_EVAL_IDS") {
        let ids: Vec<&str> = ids.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
        cases.retain(|c| ids.contains(&c.id.as_str()));
    }
    bramble::install_crypto();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut scores = Vec::new();
    let mut secs = Vec::new();
    for case in &cases {
        let started = std::time::Instant::now();
        let score = rt.block_on(harness::run_case(case, &base_url, &model, &setup));
        let took = started.elapsed().as_secs_f64();
        let from = case.source.as_deref().map(|s| format!(" [{s}]")).unwrap_or_default();
        eprintln!("{} ({}): {took:.1}s {}{from}", case.id, case.lang, score.note);
        scores.push(score);
        secs.push(took);
    }
    println!(
        "agent eval: {model} at {base_url}, profile {}, text tool calls {}, {} cases\n",
        setup.profile,
        setup.text_tool_calls,
        cases.len()
    );
    print!("{}", harness::table(&scores));
    println!("{}", harness::summary(&setup, &scores, &secs));
    std::process::ExitCode::SUCCESS
}
