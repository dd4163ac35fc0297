//! libFuzzer entry for the `store_proposal` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("store_proposal").expect("the target exists").run)(data));
