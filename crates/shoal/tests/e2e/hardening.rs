//! The shipped binary's hardening, read from its ELF headers with binutils' `readelf`: a position-
//! independent executable (type DYN, so its code and data are address-randomised like everything else),
//! full RELRO (a GNU_RELRO segment and immediate binding, so the relocated tables are read-only before
//! `main`), and a stack that is not executable; for both binaries, the client `shoal` and the daemon
//! `shoald`. The profile does not change these link settings, so the test build's binaries stand for the
//! release build's.

use std::process::Command;

const BINARIES: [&str; 2] = [env!("CARGO_BIN_EXE_shoal"), env!("CARGO_BIN_EXE_shoald")];

fn readelf(bin: &str, flag: &str) -> String {
    let out = Command::new("readelf").args(["-W", flag, bin]).output().expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf {flag} {bin} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn both_binaries_are_position_independent_executables() {
    for bin in BINARIES {
        let header = readelf(bin, "-h");
        let kind = header.lines().find(|l| l.trim_start().starts_with("Type:")).expect("a Type line");
        assert!(kind.contains("DYN"), "{bin} is not position-independent: {kind}");
        // A PIE, not a shared library: the dynamic section says so.
        let dynamic = readelf(bin, "-d");
        assert!(dynamic.lines().any(|l| l.contains("FLAGS_1") && l.contains("PIE")), "{bin}: no PIE flag:\n{dynamic}");
    }
}

#[test]
fn both_binaries_have_full_relro_and_a_non_executable_stack() {
    for bin in BINARIES {
        let segments = readelf(bin, "-l");
        assert!(
            segments.lines().any(|l| l.trim_start().starts_with("GNU_RELRO")),
            "{bin}: no GNU_RELRO segment:\n{segments}"
        );
        let stack = segments.lines().find(|l| l.trim_start().starts_with("GNU_STACK")).expect("a GNU_STACK segment");
        let flags = stack.split_whitespace().skip(6).collect::<String>();
        assert!(flags.contains("RW") && !flags.contains('E'), "{bin}: the stack is executable: {stack}");
        let dynamic = readelf(bin, "-d");
        let now = dynamic.lines().any(|l| l.contains("BIND_NOW") || (l.contains("(FLAGS") && l.contains("NOW")));
        assert!(now, "{bin}: partial RELRO only (no immediate binding):\n{dynamic}");
    }
}

#[test]
fn the_client_links_no_tls_library() {
    // What it buys (start-up: BENCHMARKS.md, "Two binaries") depends on the client not pulling in the
    // daemon; the system's OpenSSL is the daemon's alone.
    let dynamic = readelf(BINARIES[0], "-d");
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(needed.iter().all(|l| !l.contains("libssl") && !l.contains("libcrypto")), "shoal links {needed:?}");
    let dynamic = readelf(BINARIES[1], "-d");
    assert!(dynamic.contains("libssl"), "shoald links the system's OpenSSL:\n{dynamic}");
}

#[test]
fn both_binaries_pack_their_relative_relocations_where_glibc_reads_them() {
    // build.rs asks for DT_RELR on a native build against glibc 2.36 or later (this machine's and CI's).
    let glibc = Command::new("getconf").arg("GNU_LIBC_VERSION").output().expect("getconf");
    let glibc = String::from_utf8_lossy(&glibc.stdout).trim().to_string();
    let minor: u32 = glibc.strip_prefix("glibc 2.").and_then(|m| m.parse().ok()).unwrap_or(0);
    for bin in BINARIES {
        let dynamic = readelf(bin, "-d");
        let packed = dynamic.lines().any(|l| l.contains("(RELR)"));
        assert_eq!(packed, minor >= 36, "{bin} on {glibc}: DT_RELR {packed}:\n{dynamic}");
    }
}
