//! libFuzzer entry for the `grpc_requests` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| (shoal_fuzz::target("grpc_requests").expect("the target exists").run)(data));
