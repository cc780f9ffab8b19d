//! Running commands on behalf of a model.
//!
//! Everything a model asks to run goes through [`process::run`]: its own
//! process group, a cleared environment, bounded output, a timeout, and no
//! survivors. Kernel-enforced layers (namespaces, rlimits, Landlock) come later
//! by re-executing bramble as a `sandbox-exec` helper around the same
//! [`process::CommandSpec`], so callers do not change when they arrive.

pub mod process;
