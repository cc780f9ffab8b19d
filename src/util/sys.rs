//! Facts about the machine.

/// The machine's host name (the kernel's, as `hostname` prints it).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Give freed heap memory back to the kernel.
///
/// Reading or rewriting a large `jobs.json` (thousands of jobs: megabytes of
/// JSON, a parsed copy, a serialized copy) leaves that much freed memory in
/// glibc's heap, counted in the daemon's RSS for as long as it idles. The
/// daemon calls this after such work; it costs well under a millisecond.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and trims glibc's own arenas; it takes
    // the allocator's locks itself and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
