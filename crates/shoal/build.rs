//! Links the binaries with packed relative relocations (`DT_RELR`, `ld -z pack-relative-relocs`). A
//! position-independent executable carries one relocation per pointer in its data that is read-only after
//! relocation (vtables, panic locations, string tables); as `RELA` entries (24 bytes each) the daemon's make
//! a 496 KB table that the dynamic loader reads at every start and that stays resident; packed, the same
//! relocations take 6 KB. Hardening is unchanged (PIE, full RELRO, immediate binding: `tests/hardening.rs`).
//! Measured on the shipped build (BENCHMARKS.md, "Session 11"): the idle daemon's RSS 17.5 -> 16.6 MiB.
//!
//! Only for a native build against glibc 2.36 or later (the first whose loader reads `DT_RELR`; the linker
//! then records the need, `GLIBC_ABI_DT_RELR`): elsewhere the binaries keep `RELA` and nothing else changes.
//! Binutils older than 2.38 warn about the option and ignore it.
//!
//! Also gives the linker `hot-text/shoald.ld` for `shoald`: the functions a start, the first idle seconds and
//! the common requests run (generated from a profile by `hot-text/generate.py`), put first in `.text` (the
//! script names them in an output section `.text` inserted before `.fini`; the linker adds every other
//! `.text.*` section after them). A start then touches a few MiB of contiguous text instead of code spread
//! over all 12 MB: the kernel maps a file page's whole folio (64 KB here) on a fault, so scattered code made
//! nearly all of the text resident (BENCHMARKS.md, "Session 20"). Only the layout changes; a function missing
//! from the list (renamed, new) stays where the linker puts it, which costs resident memory, never
//! correctness. lld (rustc's default linker on x86_64 Linux) and GNU ld both read the script.

use std::process::Command;

fn glibc_reads_relr() -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else { return false };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if native && gnu_linux && glibc_reads_relr() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    // Release builds only: the list names a release build's functions (a debug build has other instances and
    // is not what ships).
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    if release && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        let script = std::path::Path::new(&dir).join("hot-text").join("shoald.ld");
        println!("cargo:rerun-if-changed={}", script.display());
        println!("cargo:rustc-link-arg-bin=shoald=-Wl,-T,{}", script.display());
    }
}
