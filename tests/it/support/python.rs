//! A Python virtual environment with pinned packages from PyPI, made once per
//! requirements file and reused (under the target directory), for tests that
//! check bramble against an outside reference written in Python.

use std::path::{Path, PathBuf};

/// The venv's `python` for `requirements` (a path under `tests/fixtures/`),
/// made with `python3 -m venv` and `pip install -r` on first use.
pub fn venv(name: &str, requirements: &Path) -> PathBuf {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).expect("target tmp dir");
    let text = std::fs::read_to_string(requirements).expect("the requirements file");
    let tag: u32 = text.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let venv = base.join(format!("{name}-venv-{tag:08x}"));
    let lock = std::fs::File::create(base.join(format!("{name}-venv.lock"))).expect("lock file");
    lock.lock().expect("lock the venv");
    if !venv.join(".ready").exists() {
        let _ = std::fs::remove_dir_all(&venv);
        let run = |cmd: &mut std::process::Command, what: &str| {
            let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
            assert!(
                out.status.success(),
                "{what} failed ({}). This test needs python3 with venv (Debian: apt-get install python3-venv) \
                 and PyPI (or PIP_INDEX_URL) for {}:\n{}{}",
                out.status,
                requirements.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv");
        run(
            std::process::Command::new(venv.join("bin/pip"))
                .args(["install", "--disable-pip-version-check", "--quiet", "--retries", "5", "-r"])
                .arg(requirements),
            "pip install",
        );
        std::fs::write(venv.join(".ready"), "").expect("mark the venv ready");
    }
    drop(lock);
    venv.join("bin/python")
}
