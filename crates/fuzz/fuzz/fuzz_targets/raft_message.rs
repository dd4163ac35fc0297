//! libFuzzer entry for the `raft_message` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("raft_message").expect("the target exists").run)(data));
