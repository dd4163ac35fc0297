//! libFuzzer entry for the `ca_join_token` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("ca_join_token").expect("the target exists").run)(data));
