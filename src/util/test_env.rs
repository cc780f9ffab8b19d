//! Tests that need variables in the process environment get them by running
//! again in a child process of the test binary, started with them set. No test
//! calls `set_var` while other tests run in its process: `getenv` beside
//! `setenv` is a data race in glibc, and a variable one test sets changes what
//! another reads (an API key, a systemd socket).
//!
//! A test that measures the whole process (its RSS) runs alone in a child the
//! same way.
//!
//! Shared by the unit tests (`crate::util::test_env`) and the integration
//! tests (`tests/it/support`, by `#[path]`), so it uses nothing of bramble.
//!
//! ```ignore
//! #[test]
//! fn reads_the_key() {
//!     if !in_child(concat!(module_path!(), "::reads_the_key"), &[("KEY", "v")], &[]) {
//!         return; // the parent: the child ran the test and passed
//!     }
//!     assert_eq!(std::env::var("KEY").unwrap(), "v");
//! }
//! ```

/// Set in the child to the test's path: that test runs its body there.
const CHILD: &str = "BRAMBLE_TEST_CHILD";

/// `bramble::config::tests::x` → `config::tests::x`: the path the test
/// harness knows a test by (`module_path!()` starts with the crate's name).
fn without_crate(path: &str) -> &str {
    path.split_once("::").map_or(path, |(_, rest)| rest)
}

/// In the child started for `test` (`concat!(module_path!(), "::name")`):
/// `true`, run the body. Elsewhere: run `test` in a child of this test binary with `set` set and `unset` removed,
/// assert that exactly that test ran there and passed, and return `false`.
pub fn in_child(test: &str, set: &[(&str, &str)], unset: &[&str]) -> bool {
    let test = without_crate(test);
    if std::env::var_os(CHILD).is_some_and(|v| v == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = std::process::Command::new(exe);
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"]).env(CHILD, test).envs(set.iter().copied());
    for name in unset {
        cmd.env_remove(name);
    }
    let out = cmd.output().expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} in a child process with {set:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}
