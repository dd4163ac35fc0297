//! libFuzzer entry for the `raft_records` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("raft_records").expect("the target exists").run)(data));
