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

/// Unmap the code pages that start-up touched, the binary's and its shared
/// libraries', so that an idle daemon keeps resident only what it still
/// runs. Returns the KiB released.
///
/// Start-up runs code from all over the binary (argument parsing, config,
/// TLS and HTTP client set-up, the sandbox probe), and the kernel maps each
/// page it faults in with its neighbours: an idle daemon held about 4 of the
/// binary's 4.6 MB of code, and 1.5 MB of libc (all of it: its pages are in
/// the page cache for every process, so fault-around maps them at once).
/// Only read-only file mappings of executables and libraries (files mapped
/// executable somewhere) are dropped, and only those with no anonymous pages
/// (never relocated RELRO data, whose pages are private copies):
/// `MADV_DONTNEED` on a private file mapping without such copies just drops
/// the page-table entries, and the next use faults the page back from the
/// page cache. Pages smaps calls dirty there are page-cache pages not yet
/// written back (a binary copied just before it started): unmapping them
/// loses nothing either; counting them kept a freshly installed binary's
/// daemon at its start-up RSS. Under qemu-user it is a harmless no-op.
pub fn release_code_pages() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        clean_code_mappings(&smaps)
            .into_iter()
            .map(|(start, end, rss)| {
                // SAFETY: [start, end) is a whole read-only mapping of an executable
                // or library, without private copies (checked in smaps just now;
                // read-only pages cannot be dirtied in between): dropping its pages
                // loses nothing, the next access reads them from the file again.
                let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
                if r == 0 {
                    rss
                } else {
                    0
                }
            })
            .sum()
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// The read-only mappings in `smaps` of files that are mapped executable
/// somewhere (the binary, shared libraries), with resident pages and no
/// anonymous (privately copied) ones: (start, end, Rss in KiB).
fn clean_code_mappings(smaps: &str) -> Vec<(usize, usize, u64)> {
    struct Mapping<'a> {
        start: usize,
        end: usize,
        perms: &'a str,
        path: &'a str,
        rss: u64,
        anonymous: u64,
    }
    let mut maps: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|(a, _)| !a.is_empty() && !first.ends_with(':')) {
            let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
                continue;
            };
            let perms = words.next().unwrap_or("");
            let path = words.nth(3).unwrap_or("");
            maps.push(Mapping { start, end, perms, path, rss: 0, anonymous: 0 });
            continue;
        }
        let Some(m) = maps.last_mut() else { continue };
        let value = words.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match first {
            "Rss:" => m.rss = value,
            "Anonymous:" => m.anonymous += value,
            _ => {}
        }
    }
    let code: Vec<&str> =
        maps.iter().filter(|m| m.perms == "r-xp" && m.path.starts_with('/')).map(|m| m.path).collect();
    maps.iter()
        .filter(|m| matches!(m.perms, "r--p" | "r-xp") && code.contains(&m.path))
        .filter(|m| m.rss > 0 && m.anonymous == 0)
        .map(|m| (m.start, m.end, m.rss))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_mappings_of_code_without_private_copies_are_chosen() {
        // The binary's r-xp mapping's Private_Dirty: page cache not yet written back (a binary
        // copied just before it ran); chosen. Its second r--p is RELRO (private copies): not
        // chosen. libc's code and constants are chosen; a data file mapped read-only
        // (nothing of it executable) and the vDSO are not.
        let smaps = "\
5600a0000000-5600a01d0000 r--p 00000000 fd:01 123 /usr/bin/bramble
Size:               1856 kB
Rss:                1104 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
5600a01d0000-5600a0650000 r-xp 001d0000 fd:01 123 /usr/bin/bramble
Rss:                4160 kB
Private_Dirty:       512 kB
Anonymous:             0 kB
5600a0650000-5600a06bb000 r--p 00650000 fd:01 123 /usr/bin/bramble
Rss:                 428 kB
Private_Dirty:       428 kB
Anonymous:           428 kB
5600a06bb000-5600a06bf000 rw-p 006bb000 fd:01 123 /usr/bin/bramble
Rss:                  16 kB
Private_Dirty:        16 kB
7f0000000000-7f0000028000 r--p 00000000 fd:01 9 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 160 kB
Anonymous:             0 kB
7f0000028000-7f0000128000 r-xp 00028000 fd:01 9 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1080 kB
Private_Dirty:         0 kB
7f0000200000-7f0000300000 r--p 00000000 fd:01 77 /var/cache/some.db
Rss:                  64 kB
Anonymous:             0 kB
7ffc00000000-7ffc00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
";
        let chosen = clean_code_mappings(smaps);
        assert_eq!(
            chosen,
            [
                (0x5600a0000000, 0x5600a01d0000, 1104),
                (0x5600a01d0000, 0x5600a0650000, 4160),
                (0x7f0000000000, 0x7f0000028000, 160),
                (0x7f0000028000, 0x7f0000128000, 1080),
            ]
        );
    }

    #[test]
    fn releasing_code_pages_keeps_the_process_working() {
        let released = release_code_pages();
        // Code and constants are read back from the file as they are used.
        assert_eq!(hostname(), hostname());
        let text = format!("{}", 6 * 7);
        assert_eq!(text, "42");
        let _ = released;
    }
}
