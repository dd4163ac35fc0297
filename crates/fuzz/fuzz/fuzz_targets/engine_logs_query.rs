//! libFuzzer entry for the `engine_logs_query` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("engine_logs_query").expect("the target \
                                                                                           exists").run)(data));
