//! libFuzzer entry for the `gossip_messages` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("gossip_messages").expect("the target \
                                                                                         exists").run)(data));
