//! [`LargePages`]: a global allocator that asks Linux for transparent huge pages on large
//! blocks (weights, packed panels, activation arenas, large outputs).
//!
//! Where the kernel's transparent huge pages are set to `madvise` (Ubuntu's default, and this
//! project's benchmark machines), memory is mapped in 4 KiB pages unless a program asks for
//! more. A kernel that streams through tens of megabytes (a decode step's weights, a large
//! element-wise op) then misses the TLB every 4 KiB, and under a hypervisor each miss walks two
//! page tables. Asked for 2 MiB pages, the same stream misses 512 times less often: a decode
//! step of the corpus's tiny_llama (45 MB of f32 weights) ran in 0.78 of the time, a 4M-element
//! `Add` in about 0.75 (docs/benchmarks.md).
//!
//! Only blocks of at least [`LARGE`] bytes are advised, and only the whole 2 MiB pages inside
//! them, so small allocations (and their neighbours) keep the allocator's usual behaviour. The
//! advice (`madvise(MADV_HUGEPAGE)`) is given before the block's memory is first written, which
//! is when Linux decides the page size; memory the allocator reuses keeps the pages it has.
//! Elsewhere than Linux, or where transparent huge pages are off, it only forwards to
//! [`System`].
//!
//! The `nxrt` command-line tool uses it. A program embedding nxrt opts in with
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: nxrt::LargePages = nxrt::LargePages;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes are advised to use huge pages.
pub const LARGE: usize = 2 << 20;

/// The huge page size the advice is aligned to (x86-64 and aarch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;

/// The global allocator described in the [module docs](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct LargePages;

/// The whole huge pages inside `[p, p + size)`, as (start, length); `None` if there are none.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn huge_range(p: usize, size: usize) -> Option<(usize, usize)> {
    let lo = p.checked_next_multiple_of(HUGE)?;
    let hi = p.checked_add(size)? / HUGE * HUGE;
    (hi > lo).then(|| (lo, hi - lo))
}

/// Advises the huge pages inside a fresh block of `size` bytes at `p`.
#[inline]
fn advise(p: *mut u8, size: usize) {
    if p.is_null() || size < LARGE {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Some((lo, len)) = huge_range(p as usize, size) {
        // SAFETY: [lo, lo + len) lies inside the block the allocator just returned to us;
        // MADV_HUGEPAGE changes no contents and only sets how future faults are served. A
        // failure (THP disabled, an old kernel) leaves the memory as it was.
        unsafe {
            libc::madvise(lo as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
}

// SAFETY: every call forwards to `System` with the same layout and pointer; the only addition is
// a madvise over memory inside the returned block, which does not change its contents.
unsafe impl GlobalAlloc for LargePages {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() < LARGE {
            // SAFETY: forwarded as given
            return unsafe { System.alloc_zeroed(layout) };
        }
        // (16: the alignment glibc's calloc gives on 64-bit targets, up to which `System` uses it)
        if layout.align() <= 16 {
            // calloc leaves memory it knows is zero (fresh from the kernel) untouched, so the
            // advice still comes before the first write there, and a large zeroed block that
            // is used sparsely stays uncommitted
            // SAFETY: forwarded as given
            let p = unsafe { System.alloc_zeroed(layout) };
            advise(p, layout.size());
            return p;
        }
        // over-aligned: `System` would allocate and zero it itself, before the advice; advise
        // first, so the zeroing faults huge pages in
        // SAFETY: forwarded as given; the block has `layout.size()` writable bytes
        unsafe {
            let p = System.alloc(layout);
            advise(p, layout.size());
            if !p.is_null() {
                core::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as given
        unsafe { System.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as given
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if new_size > layout.size() {
            advise(p, new_size);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_range_is_the_whole_pages_inside() {
        // a block from 1 MiB to 7 MiB holds the huge pages at 2 and 4 MiB
        assert_eq!(huge_range(1 << 20, 6 << 20), Some((2 << 20, 4 << 20)));
        // aligned at both ends: all of it
        assert_eq!(huge_range(4 << 20, 4 << 20), Some((4 << 20, 4 << 20)));
        // no whole page inside
        assert_eq!(huge_range((2 << 20) + 1, 3 << 20), None);
        assert_eq!(huge_range(usize::MAX - 10, 5), None);
    }

    #[test]
    fn blocks_round_trip_with_their_contents() {
        let a = LargePages;
        for size in [64usize, LARGE - 1, LARGE, 5 << 20] {
            let layout = Layout::from_size_align(size, 64).unwrap();
            // SAFETY: a non-zero layout; the block is written within its size and freed once
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % 64, 0);
                let s = core::slice::from_raw_parts_mut(p, size);
                assert!(s.iter().all(|&b| b == 0), "alloc_zeroed of {size} bytes");
                s[0] = 7;
                s[size - 1] = 9;
                let q = a.realloc(p, layout, size * 2);
                assert!(!q.is_null());
                let s = core::slice::from_raw_parts_mut(q, size * 2);
                assert_eq!((s[0], s[size - 1]), (7, 9));
                s[size * 2 - 1] = 1;
                a.dealloc(q, Layout::from_size_align(size * 2, 64).unwrap());
            }
        }
    }

    /// The kB of huge pages (`AnonHugePages`) of the mapping that holds `addr`, from
    /// /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn huge_kb_at(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    return v.trim().trim_end_matches("kB").trim().parse().ok();
                }
            }
        }
        None
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_blocks_get_huge_pages_where_linux_offers_them() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !mode.contains("[madvise]") && !mode.contains("[always]") {
            println!(
                "skipped: transparent huge pages are off here ({})",
                mode.trim()
            );
            return;
        }
        let size = 16 << 20;
        for (zeroed, align) in [(false, 64), (true, 4), (true, 64)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero layout, written within its size, freed once
            unsafe {
                let p = if zeroed {
                    LargePages.alloc_zeroed(layout)
                } else {
                    LargePages.alloc(layout)
                };
                assert!(!p.is_null());
                core::ptr::write_bytes(p, 1, size);
                let (lo, _) = huge_range(p as usize, size).unwrap();
                let kb = huge_kb_at(lo).expect("the block's mapping in /proc/self/smaps");
                LargePages.dealloc(p, layout);
                // at least one of the (at least seven) whole huge pages inside: the kernel may
                // fail to find free 2 MiB frames for some of them
                assert!(
                    kb >= 2048,
                    "no huge pages in a 16 MiB block ({kb} kB, zeroed {zeroed}, align {align})"
                );
            }
        }
    }
}
