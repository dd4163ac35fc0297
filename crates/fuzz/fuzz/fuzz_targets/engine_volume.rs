//! libFuzzer entry for the `engine_volume` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("engine_volume").expect("the target \
                                                                                            exists").run)(data));
