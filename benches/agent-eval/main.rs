//! The agent eval runner: bramble's own scheduling cases (English and
//! Chinese, `cases.jsonl`) against any OpenAI-compatible endpoint, one real
//! turn per case, scored by [`harness`]. It measures a model with bramble's
//! prompt and tools; the CI test (`tests/it/agent_eval.rs`) runs the same
//! harness against a scripted provider, which tests the harness only.
//!
//! ```sh
//! AGENT_EVAL_BASE_URL=http://127.0.0.1:8080/v1 AGENT_EVAL_MODEL=qwen2.5-1.5b-instruct \
//!   cargo bench --bench agent-eval
//! ```
//!
//! `AGENT_EVAL_CASES` picks another cases file. The endpoint gets no key
//! (a local server needs none).

#[path = "../../tests/it/support/mod.rs"]
mod support;

mod harness;

fn main() -> std::process::ExitCode {
    let Ok(base_url) = std::env::var("AGENT_EVAL_BASE_URL") else {
        eprintln!("agent-eval: set AGENT_EVAL_BASE_URL to an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1); nothing run");
        return std::process::ExitCode::SUCCESS;
    };
    let model = std::env::var("AGENT_EVAL_MODEL").unwrap_or_else(|_| "default".into());
    let cases = std::env::var("AGENT_EVAL_CASES")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/benches/agent-eval/cases.jsonl").into());
    let cases = match harness::load(std::path::Path::new(&cases)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent-eval: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    bramble::install_crypto();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut scores = Vec::new();
    for case in &cases {
        let started = std::time::Instant::now();
        let score = rt.block_on(harness::run_case(case, &base_url, &model));
        eprintln!("{} ({}): {:.1}s {}", case.id, case.lang, started.elapsed().as_secs_f64(), score.note);
        scores.push(score);
    }
    println!("agent eval: {model} at {base_url}, {} cases\n", cases.len());
    print!("{}", harness::table(&scores));
    std::process::ExitCode::SUCCESS
}
