//! Landlock on top of the namespace jail, where the kernel has it.
//!
//! Stock Raspberry Pi OS kernels usually do not (`CONFIG_SECURITY_LANDLOCK` is
//! off in their configs), so this is a
//! second wall, never the only one — except when user namespaces are
//! unavailable, where it is the filesystem layer that remains. Best effort:
//! the crate downgrades to what the running ABI supports.
//!
//! Rules, applied by the worker right before `exec`:
//! - read and execute everywhere **except** the hidden paths (state, config,
//!   credentials): Landlock only grants, so "everything but X" is built by
//!   granting each sibling on the way down to X ([`read_roots`]);
//! - full access beneath the workspace, `/tmp` and `/dev` (for `/dev/null`);
//! - with `network = false` and ABI ≥ 4: no TCP bind or connect at all;
//! - with ABI ≥ 6: no signals to, and no abstract UNIX sockets of, processes
//!   outside the sandbox.
//!
//! Landlock also stops ptrace-style access (`/proc/<pid>/environ`, `mem`) to
//! processes outside the domain, such as bramble itself.

use std::path::{Path, PathBuf};

use landlock::{path_beneath_rules, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI};

use super::helper::Options;

/// The newest ABI this code knows how to ask for; older kernels get a subset.
const ABI_WANTED: ABI = ABI::V6;

/// The kernel's Landlock ABI version, or `None` when Landlock is unavailable.
pub fn abi_version() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as i32)
}

/// Restrict the calling process (and what it execs) as described above.
pub fn restrict(o: &Options) -> Result<(), String> {
    let err = |e: landlock::RulesetError| format!("Landlock: {e}");
    let abi = ABI_WANTED;
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi)).map_err(err)?;
    if o.no_network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(err)?;
    }
    let ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    let mut created = ruleset.create().map_err(err)?;
    let readable = read_roots(&o.hide);
    created = created.add_rules(path_beneath_rules(&readable, AccessFs::from_read(abi))).map_err(err)?;
    let exposed: Vec<&PathBuf> = o.expose.iter().filter(|p| p.exists()).collect();
    created = created.add_rules(path_beneath_rules(&exposed, AccessFs::from_read(abi))).map_err(err)?;
    let mut writable: Vec<PathBuf> = vec!["/tmp".into(), "/dev".into()];
    writable.extend(o.workspace.clone());
    writable.retain(|p| p.exists());
    created = created.add_rules(path_beneath_rules(&writable, AccessFs::from_all(abi))).map_err(err)?;
    created.restrict_self().map_err(err)?;
    Ok(())
}

/// Directories (and files) that together cover everything under `/` except `hidden`.
pub fn read_roots(hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/")];
    for h in hidden {
        if !h.is_absolute() || h == Path::new("/") {
            continue;
        }
        let mut next = Vec::with_capacity(roots.len());
        for root in roots {
            if h.starts_with(&root) {
                split_around(&root, h, &mut next);
            } else if !root.starts_with(h) {
                next.push(root);
            }
        }
        roots = next;
    }
    roots.retain(|p| p.symlink_metadata().is_ok());
    roots
}

/// Push the entries of `root` that lead around `hidden` (which lies beneath `root`).
fn split_around(root: &Path, hidden: &Path, out: &mut Vec<PathBuf>) {
    if root == hidden {
        return;
    }
    let Ok(rest) = hidden.strip_prefix(root) else { return out.push(root.to_path_buf()) };
    let Some(first) = rest.components().next() else { return };
    let step = root.join(first);
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let p = entry.path();
        if p == step {
            split_around(&step, hidden, out);
        } else {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_roots_cover_everything_but_the_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["a/b/c", "a/x", "y"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("a/b/secret"), "k").unwrap();
        std::fs::write(root.join("a/b/ok"), "k").unwrap();
        let hidden = [root.join("a/b/secret"), root.join("y")];
        let mut got = read_roots(&hidden);
        got.retain(|p| p.starts_with(root));
        got.sort();
        assert_eq!(got, [root.join("a/b/c"), root.join("a/b/ok"), root.join("a/x")]);
        // Something outside our temp dir is still readable.
        assert!(read_roots(&hidden).iter().any(|p| Path::new("/etc/hostname").starts_with(p)));
        assert_eq!(read_roots(&[]), [PathBuf::from("/")]);
    }
}
