//! Running commands: process handling now, kernel-enforced layers later.

pub mod process;
