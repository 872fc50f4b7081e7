//! Giving back the resident pages of xfn's binary that a process no longer
//! runs.
//!
//! Choice: **once a process is past its start-up, drop its page-table
//! entries of read-only file mappings that hold no private page**
//! (`madvise(MADV_DONTNEED)`). For such a mapping that is invisible: the
//! pages stay in the page cache (shared with the other processes), and the
//! next access faults them back in unchanged, so only what the process
//! runs from then on comes back. Mappings that are writable, or hold a
//! private copy of a page (`Anonymous` above 0 in `smaps`: relocated
//! read-only data, written before it was made read-only), are never
//! touched, since dropping those would lose their contents. Not
//! `MADV_PAGEOUT`, which would evict pages other processes use.
//!
//! And again whenever it has been idle for [`IDLE_AFTER`].
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/resident.rs`.

/// How long a long-lived process goes without work (a call, a connection)
/// before it gives its file pages back again: longer than the gap between
/// a busy caller's calls, short enough that a sidecar idle between
/// reconciles (Crossplane polls every minute) holds only what idling needs.
pub(crate) const IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// A release that gives back less than this finds the process settled:
/// what idling itself runs (the warm pool's clock each second, timers)
/// comes back within a second, 2–3 MB of code at 64 KiB per fault
/// (measured, release build), so releasing it again on every look would
/// only fault it back.
const SETTLED_KB: u64 = 4096;

/// Decides, looked at once per [`IDLE_AFTER`], when a process that serves
/// work is idle enough to release its file pages again.
#[derive(Debug, Default)]
pub(crate) struct IdleWatch {
    /// Work begun as of the last look.
    seen: u64,
    /// Work begun as of the release that found the process settled.
    settled_at: Option<u64>,
}

impl IdleWatch {
    /// Given how much work has begun so far and whether any is in flight:
    /// whether to release now. Yes when nothing began since the last look
    /// and nothing runs, until a release finds the process settled
    /// ([`IdleWatch::released`]): work that trails the calls (a warm
    /// container's teardown, its replacement's creation) brings code back
    /// after the first idle release, and the next looks take it.
    pub(crate) fn due(&mut self, begun: u64, busy: bool) -> bool {
        let quiet = !busy && begun == self.seen;
        self.seen = begun;
        quiet && self.settled_at != Some(begun)
    }

    /// What the release [`IdleWatch::due`] asked for gave back, in kB.
    pub(crate) fn released(&mut self, kb: u64) {
        if kb < SETTLED_KB {
            self.settled_at = Some(self.seen);
        }
    }
}

/// Releases this process's file pages whenever `activity` (work begun so
/// far, whether any is in flight) shows it idle for [`IDLE_AFTER`]; runs
/// until dropped.
pub(crate) async fn release_when_idle(activity: impl Fn() -> (u64, bool)) {
    let mut watch = IdleWatch::default();
    let mut looks = tokio::time::interval(IDLE_AFTER);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        looks.tick().await;
        let (begun, busy) = activity();
        if watch.due(begun, busy) {
            let released_kb = release_file_pages();
            trim_heap();
            watch.released(released_kb);
            tracing::debug!(released_kb, "idle daemon: file pages released");
        }
    }
}

/// Returns the allocator's free memory to the kernel: after a burst of
/// concurrent calls, glibc keeps the freed parts of each thread's arena
/// (measured: about 0.6 MB more after 1,600 calls from up to 32 callers).
pub(crate) fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only gives free heap memory back to the kernel; it
    // takes the allocator's own locks and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Drops this process's resident pages of read-only, file-backed mappings
/// without private pages (see the module doc); returns the kB released.
/// Harmless to call at any time, from any thread.
pub(crate) fn release_file_pages() -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let mut released = 0;
    for mapping in parse(&smaps) {
        if !mapping.droppable() {
            continue;
        }
        // SAFETY: the range is one whole mapping of this process as the
        // kernel listed it; it is read-only, file-backed and holds no private
        // page, so dropping its page-table entries loses nothing: the next
        // access faults the same file pages back in. If the mapping changed
        // meanwhile, madvise fails or acts on what is there now under the
        // same rules of the kernel (never on locked or special mappings).
        let rc = unsafe {
            libc::madvise(
                mapping.start as *mut libc::c_void,
                mapping.end - mapping.start,
                libc::MADV_DONTNEED,
            )
        };
        if rc == 0 {
            released += mapping.rss_kb;
        }
    }
    released
}

/// One mapping of `/proc/self/smaps`, with what decides whether its pages
/// may be dropped.
#[derive(Debug, Default, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    /// Backed by a file (an inode), not anonymous or `[vdso]`-like.
    file: bool,
    rss_kb: u64,
    anonymous_kb: u64,
    /// `VmFlags` names a locked, I/O or pfn mapping.
    special: bool,
}

impl Mapping {
    fn droppable(&self) -> bool {
        self.file && !self.writable && !self.special && self.anonymous_kb == 0 && self.rss_kb > 0
    }
}

fn parse(smaps: &str) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        if let Some((start, end)) = first.split_once('-').and_then(|(s, e)| {
            Some((
                usize::from_str_radix(s, 16).ok()?,
                usize::from_str_radix(e, 16).ok()?,
            ))
        }) {
            // A header: range, perms, offset, dev, inode, [path].
            let perms = words.next().unwrap_or("");
            let inode = words.nth(2).unwrap_or("0");
            mappings.push(Mapping {
                start,
                end,
                writable: perms.contains('w'),
                file: inode != "0",
                ..Mapping::default()
            });
            continue;
        }
        let Some(mapping) = mappings.last_mut() else {
            continue;
        };
        let kb = || words.clone().next().and_then(|v| v.parse::<u64>().ok());
        match first {
            "Rss:" => mapping.rss_kb = kb().unwrap_or(0),
            // Unknown counts as private: never dropped.
            "Anonymous:" => mapping.anonymous_kb = kb().unwrap_or(u64::MAX),
            "VmFlags:" => {
                mapping.special = words
                    .clone()
                    .any(|flag| matches!(flag, "lo" | "io" | "pf" | "dd" | "ht"))
            }
            _ => {}
        }
    }
    mappings
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0200000 r--p 00000000 fe:01 1234 /usr/bin/xfn
Rss:                 800 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
55d0c0200000-55d0c1000000 r-xp 00200000 fe:01 1234 /usr/bin/xfn
Rss:                9000 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
55d0c1000000-55d0c1100000 r--p 01000000 fe:01 1234 /usr/bin/xfn
Rss:                 600 kB
Anonymous:           600 kB
VmFlags: rd mr mw me ac sd
55d0c1100000-55d0c1200000 rw-p 01100000 fe:01 1234 /usr/bin/xfn
Rss:                 100 kB
Anonymous:           100 kB
VmFlags: rd wr mr mw me ac sd
55d0c2000000-55d0c2100000 rw-p 00000000 00:00 0 [heap]
Rss:                 500 kB
Anonymous:           500 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000100000 r-xp 00000000 fe:01 99 /usr/lib/libc.so.6
Rss:                 900 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me lo sd
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me de sd
";

    #[test]
    fn only_read_only_file_mappings_without_private_pages_are_dropped() {
        let dropped: Vec<(usize, u64)> = parse(SMAPS)
            .into_iter()
            .filter(Mapping::droppable)
            .map(|m| (m.start, m.rss_kb))
            .collect();
        // The binary's read-only data and code; not its relocated data
        // (private pages), its writable data, the heap, a locked mapping
        // or the vdso.
        assert_eq!(dropped, [(0x55d0c0000000, 800), (0x55d0c0200000, 9000)]);
    }

    #[test]
    fn an_idle_process_releases_until_settled_and_never_while_busy() {
        let mut watch = IdleWatch::default();
        // Start-up: nothing begun, quiet: releases until one gives back
        // little, then no more.
        assert!(watch.due(0, false));
        watch.released(9000);
        assert!(watch.due(0, false));
        watch.released(100);
        assert!(!watch.due(0, false));
        assert!(!watch.due(0, false));
        // A call begins and is still running at the next look, then ends.
        assert!(!watch.due(1, true));
        assert!(!watch.due(1, true));
        // Released at the first look that finds it over, nothing new begun;
        // work trailing the call brought 5 MB back, taken at the next look;
        // then only what idling runs comes back: settled.
        assert!(watch.due(1, false));
        watch.released(12000);
        assert!(watch.due(1, false));
        watch.released(5000);
        assert!(watch.due(1, false));
        watch.released(2400);
        assert!(!watch.due(1, false));
        // Calls begun between two looks keep the pages for one more spell,
        // even if none is in flight at the look.
        assert!(!watch.due(5, false));
        assert!(watch.due(5, false));
        watch.released(0);
        // A queued call counts as busy.
        assert!(!watch.due(6, true));
        assert!(!watch.due(6, true));
        assert!(watch.due(6, false));
    }

    #[test]
    fn this_process_keeps_running_after_giving_its_code_pages_back() {
        let before = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        release_file_pages();
        // Code and read-only data fault back in as they are used.
        let text = format!("{:?}", parse(SMAPS));
        assert!(text.contains("rss_kb: 9000"));
        let after = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        let rss = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("Rss:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap()
        };
        assert!(rss(&after) < rss(&before), "{before}\n{after}");
    }
}
