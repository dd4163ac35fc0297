//! The process's allocator: an arena for the one-shot client commands, mimalloc for the daemon.
//!
//! A client command (`shoal service create ...`) is a process that parses its arguments, sends one request,
//! prints the answer and exits; nothing it frees would be reused before the exit. So until [`use_general`]
//! is called, allocations are bumped off a static arena (in `.bss`: its pages cost nothing until touched),
//! frees are no-ops and the exit returns everything. That touches a few contiguous pages where a
//! general-purpose allocator touches at least one page per size class plus its own metadata, and page
//! faults are most of what a short process costs (BENCHMARKS.md, "Session 4").
//!
//! The daemon calls [`use_general`] first thing, before it builds anything long-lived: from then on every
//! allocation goes to mimalloc. Whatever was allocated in the arena before (the argument strings) stays
//! valid: frees and reallocations are routed by address, so arena memory is never handed to mimalloc.
//! An arena that runs out also falls back to mimalloc, so a client with a large answer still works.
//!
//! A global allocator cannot be written without `unsafe`; this module is the one place in the binary that
//! allows it, and each block says why it holds.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use mimalloc::MiMalloc;

/// Arena size: virtual, in `.bss`; a client touches only the pages of what it allocates.
const ARENA_BYTES: usize = 16 << 20;

#[repr(C, align(4096))]
struct Arena(UnsafeCell<[u8; ARENA_BYTES]>);

// SAFETY: the bytes are handed out in disjoint ranges (an atomic bump pointer), each to one owner.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena(UnsafeCell::new([0; ARENA_BYTES]));
/// Offset of the first free arena byte.
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Set once the process has switched to the general-purpose allocator.
static GENERAL: AtomicBool = AtomicBool::new(false);

/// Routes every new allocation to the general-purpose allocator from now on (the daemon), set up for a
/// long-running process (`mimalloc_setup`). Call on the main thread before the process starts threads or
/// allocates anything lasting.
pub fn use_general() {
    crate::mimalloc_setup::set_up();
    GENERAL.store(true, Ordering::Release);
}

/// Gives back the main thread's stack pages below the caller's frame: start-up runs deep (building the gRPC
/// server's service stack alone has a 60 KiB frame) and a thread's stack pages, once touched, stay resident
/// until the thread exits, which the main thread of the daemon never does. Call on the main thread once the
/// daemon serves; elsewhere it does nothing.
#[inline(never)]
pub fn trim_main_stack() {
    let marker = 0u8;
    let sp = std::hint::black_box(&marker) as *const u8 as usize;
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
    let Some((lo, hi)) = main_stack_range(&maps) else { return };
    if !(lo..hi).contains(&sp) {
        return; // not the main thread
    }
    let end = sp.saturating_sub(STACK_TRIM_MARGIN) & !(PAGE - 1);
    if end > lo {
        // SAFETY: [lo, end) lies below the stack pointer by more than this function and madvise use, so
        // no live frame is there; the pages come back as zeroes when the stack grows into them again.
        unsafe { libc::madvise(lo as *mut libc::c_void, end - lo, libc::MADV_DONTNEED) };
    }
}

/// The `[stack]` mapping of `/proc/self/maps`, as (start, end).
fn main_stack_range(maps: &str) -> Option<(usize, usize)> {
    let line = maps.lines().find(|l| l.ends_with("[stack]"))?;
    let (lo, hi) = line.split_whitespace().next()?.split_once('-')?;
    Some((usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?))
}

const PAGE: usize = 4096;

/// How far below the trimming function's frame the stack is kept.
const STACK_TRIM_MARGIN: usize = 16 << 10;

fn base() -> usize {
    ARENA.0.get() as usize
}

fn in_arena(p: *mut u8) -> bool {
    (p as usize).wrapping_sub(base()) < ARENA_BYTES
}

/// Bumps `layout` off the arena; `None` once the process uses the general allocator or when it does not
/// fit. Arena bytes are never reused, so they are still the zeroes `.bss` starts with.
fn bump(layout: Layout) -> Option<*mut u8> {
    if GENERAL.load(Ordering::Relaxed) {
        return None;
    }
    let base = base();
    let mut next = NEXT.load(Ordering::Relaxed);
    loop {
        let start = (base + next).checked_next_multiple_of(layout.align())? - base;
        let end = start.checked_add(layout.size())?;
        if end > ARENA_BYTES {
            return None;
        }
        match NEXT.compare_exchange_weak(next, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((base + start) as *mut u8),
            Err(now) => next = now,
        }
    }
}

/// Grows or shrinks the arena's most recent allocation `[p, p + old)` in place to `new` bytes, while the
/// process still allocates from the arena.
fn resize_last(p: *mut u8, old: usize, new: usize) -> bool {
    if GENERAL.load(Ordering::Relaxed) {
        return false;
    }
    let start = p as usize - base();
    let Some(end) = start.checked_add(new).filter(|&e| e <= ARENA_BYTES) else {
        return false;
    };
    NEXT.compare_exchange(start + old, end, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// The global allocator of the `shoal` binary (see the module documentation).
pub struct ShoalAlloc;

// SAFETY: arena blocks are disjoint, aligned as asked and never freed while the process lives; every other
// pointer comes from and goes back to mimalloc, which upholds the GlobalAlloc contract itself.
unsafe impl GlobalAlloc for ShoalAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        bump(layout).unwrap_or_else(|| unsafe { MiMalloc.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // Arena bytes are never-used zeroes. SAFETY: forwarded with the caller's guarantees.
        bump(layout).unwrap_or_else(|| unsafe { MiMalloc.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if in_arena(p) {
            return; // the process exits soon; the daemon leaves what it allocated here in place
        }
        // SAFETY: `p` is not an arena pointer, so mimalloc allocated it with `layout`.
        unsafe { MiMalloc.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !in_arena(p) {
            // SAFETY: `p` came from mimalloc with `layout`.
            return unsafe { MiMalloc.realloc(p, layout, new_size) };
        }
        if resize_last(p, layout.size(), new_size) {
            return p;
        }
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: `new_layout` is valid and non-zero-sized (GlobalAlloc::realloc's contract).
        let q = unsafe { self.alloc(new_layout) };
        if !q.is_null() {
            // SAFETY: both blocks are live, distinct and at least `min(old, new)` bytes long.
            unsafe { std::ptr::copy_nonoverlapping(p, q, layout.size().min(new_size)) };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The test binary's global allocator is this one too (in arena mode), so the harness shares the arena
    // with the tests: each test checks its own blocks, never absolute offsets.

    #[test]
    fn arena_blocks_are_aligned_disjoint_and_zeroed() {
        let a = ShoalAlloc;
        let mut blocks = Vec::new();
        for (size, align) in [(1, 1), (24, 8), (100, 16), (4096, 4096), (3, 64), (0x1_0000, 8)] {
            let l = Layout::from_size_align(size, align).unwrap();
            let p = unsafe { a.alloc_zeroed(l) };
            assert!(in_arena(p));
            assert_eq!(p as usize % align, 0);
            assert!(unsafe { std::slice::from_raw_parts(p, size) }.iter().all(|&b| b == 0));
            unsafe { std::ptr::write_bytes(p, 0xAB, size) };
            blocks.push((p as usize, size));
        }
        blocks.sort();
        for w in blocks.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlapping blocks {w:?}");
        }
    }

    #[test]
    fn realloc_keeps_the_contents_in_place_or_moved() {
        let a = ShoalAlloc;
        let l = Layout::from_size_align(16, 8).unwrap();
        let p = unsafe { a.alloc(l) };
        unsafe { std::ptr::copy_nonoverlapping(b"0123456789abcdef".as_ptr(), p, 16) };
        let q = unsafe { a.realloc(p, l, 4000) };
        assert_eq!(unsafe { std::slice::from_raw_parts(q, 16) }, b"0123456789abcdef");
        // Not the last block any more: a second block makes the first one move when it grows.
        let other = unsafe { a.alloc(l) };
        let r = unsafe { a.realloc(q, Layout::from_size_align(4000, 8).unwrap(), 9000) };
        assert_ne!(r, q);
        assert_eq!(unsafe { std::slice::from_raw_parts(r, 16) }, b"0123456789abcdef");
        unsafe { a.dealloc(other, l) };
    }

    #[test]
    fn the_main_stack_range_is_read_from_the_maps_line() {
        let maps = "00400000-00401000 r--p 00000000 fd:00 1 /bin/shoal\n\
                    7ffc9e7a4000-7ffc9e7df000 rw-p 00000000 00:00 0                          [stack]\n\
                    7ffc9e7f0000-7ffc9e7f2000 r-xp 00000000 00:00 0                          [vdso]\n";
        assert_eq!(main_stack_range(maps), Some((0x7ffc_9e7a_4000, 0x7ffc_9e7d_f000)));
        assert_eq!(main_stack_range("00400000-00401000 r--p 00000000 fd:00 1 /bin/shoal\n"), None);
    }

    #[test]
    fn trimming_off_the_main_thread_leaves_the_stack_alone() {
        // Test threads are not the main thread: the call must neither fail nor touch this thread's stack.
        let before = [7u8; 4096];
        trim_main_stack();
        assert!(std::hint::black_box(&before).iter().all(|&b| b == 7));
    }

    #[test]
    fn a_block_too_large_for_the_arena_goes_to_mimalloc_and_back() {
        let a = ShoalAlloc;
        let l = Layout::from_size_align(ARENA_BYTES + 1, 8).unwrap();
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null() && !in_arena(p));
        unsafe { std::ptr::write_bytes(p, 1, l.size()) };
        unsafe { a.dealloc(p, l) };
    }
}
