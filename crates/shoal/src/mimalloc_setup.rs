//! mimalloc set up for a long-running process: `shoald` (`shoal daemon`), and `shoal-bench` (which includes
//! this file, so that its in-process scenarios measure the daemon's allocator as the daemon configures it).
//!
//! [`set_up`] runs before `main` (an `.init_array` entry, [`SET_UP_BEFORE_MAIN`]), before any thread exists and
//! before the first allocation: the Rust runtime allocates before `main` (the main thread's stack-guard record,
//! in `std::rt::init`), and that allocation reserves mimalloc's first arena with the size the option has then.
//! Set in `main`, as it was until session 20, the reservation option came too late: the first arena was
//! 1 GiB, not `ARENA_RESERVE_KIB` (`strace -k -e trace=mmap` shows the reservation under `set_current_info`).
//! The purge delay is read at each purge; both binaries still call [`set_up`] in `main` (harmless, and in
//! time for a platform without `.init_array`).

#![allow(unsafe_code)]

/// mimalloc's arena reservation, in KiB (mimalloc's default: 1 GiB). The arena's bitmaps are sized by it
/// and an idle daemon had 170 KiB of them resident with 1 GiB; later arenas grow (mimalloc doubles their
/// size every eight), so a large store still gets few.
const ARENA_RESERVE_KIB: std::ffi::c_long = 64 << 10;

/// How long mimalloc keeps freed pages before it gives them back, in ms (its default: 1,000). A daemon
/// that had just created 2,000 tasks held 47 MiB with 1,000 ms, 24 MiB with 10 ms and 21 MiB with 0, which
/// made the in-process scheduler benchmark 30% slower (BENCHMARKS.md, "Session 5").
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Indexes of two options in mimalloc 3's `mi_option_e`, which libmimalloc-sys does not name; a test checks
/// them against their defaults.
const OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const OPTION_ARENA_RESERVE: libmimalloc_sys::mi_option_t = 23;

/// Sets mimalloc's options. Call on the main thread before any other thread exists.
pub(crate) fn set_up() {
    // SAFETY: option setters, on the main thread before any other thread exists.
    unsafe {
        libmimalloc_sys::mi_option_set(OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        libmimalloc_sys::mi_option_set(OPTION_ARENA_RESERVE, ARENA_RESERVE_KIB);
    }
}

/// [`set_up`], run by the C runtime before `main` (see the module doc).
#[cfg(all(target_os = "linux", not(test)))]
#[used]
#[link_section = ".init_array"]
pub(crate) static SET_UP_BEFORE_MAIN: extern "C" fn() = set_up_before_main;

#[cfg(all(target_os = "linux", not(test)))]
extern "C" fn set_up_before_main() {
    set_up();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_indexes_name_the_options_set() {
        // Nothing in a test binary sets them, so they hold mimalloc 3's defaults: a purge delay of 1,000 ms
        // and a 1 GiB arena reservation (in KiB).
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(OPTION_PURGE_DELAY) }, 1000);
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(OPTION_ARENA_RESERVE) }, 1 << 20);
    }
}
