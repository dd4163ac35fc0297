//! The shipped binary's hardening, read from its ELF headers with binutils' `readelf`: a position-
//! independent executable (type DYN, so its code and data are address-randomised like everything else),
//! full RELRO (a GNU_RELRO segment and immediate binding, so the relocated tables are read-only before
//! `main`), and a stack that is not executable. The profile does not change these link settings, so the test
//! binary's `shoal` stands for the release build.

use std::process::Command;

fn readelf(flag: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_shoal");
    let out = Command::new("readelf").args(["-W", flag, bin]).output().expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf {flag} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn shoal_is_a_position_independent_executable() {
    let header = readelf("-h");
    let kind = header.lines().find(|l| l.trim_start().starts_with("Type:")).expect("a Type line");
    assert!(kind.contains("DYN"), "not position-independent: {kind}");
    // A PIE, not a shared library: the dynamic section says so.
    let dynamic = readelf("-d");
    assert!(dynamic.lines().any(|l| l.contains("FLAGS_1") && l.contains("PIE")), "no PIE flag:\n{dynamic}");
}

#[test]
fn shoal_has_full_relro_and_a_non_executable_stack() {
    let segments = readelf("-l");
    assert!(segments.lines().any(|l| l.trim_start().starts_with("GNU_RELRO")), "no GNU_RELRO segment:\n{segments}");
    let stack = segments.lines().find(|l| l.trim_start().starts_with("GNU_STACK")).expect("a GNU_STACK segment");
    let flags = stack.split_whitespace().skip(6).collect::<String>();
    assert!(flags.contains("RW") && !flags.contains('E'), "the stack is executable: {stack}");
    let dynamic = readelf("-d");
    let now = dynamic.lines().any(|l| l.contains("BIND_NOW") || (l.contains("(FLAGS") && l.contains("NOW")));
    assert!(now, "partial RELRO only (no immediate binding):\n{dynamic}");
}
