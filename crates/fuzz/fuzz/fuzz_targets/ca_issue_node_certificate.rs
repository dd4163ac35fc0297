//! libFuzzer entry for the `ca_issue_node_certificate` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("ca_issue_node_certificate").expect("the target \
                                                                                                   exists").run)(data));
