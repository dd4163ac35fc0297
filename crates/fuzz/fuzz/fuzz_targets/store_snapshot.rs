//! libFuzzer entry for the `store_snapshot` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("store_snapshot").expect("the target exists").run)(data));
