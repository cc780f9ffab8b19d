//! One process-wide counter for names and ids that must not repeat within
//! the process (temp files, tool-call ids, masking-key input). The one place
//! such a counter lives: a static outside `util/` is refused by
//! `layers::tests::no_mutable_statics_outside_util`.

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT: AtomicU64 = AtomicU64::new(1);

/// A number this process has not handed out before.
pub fn next() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_do_not_repeat() {
        let (a, b) = (super::next(), super::next());
        assert!(b > a);
    }
}
