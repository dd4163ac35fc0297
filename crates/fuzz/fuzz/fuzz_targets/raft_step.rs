//! libFuzzer entry for the `raft_step` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("raft_step").expect("the target exists").run)(data));
