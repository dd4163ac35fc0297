//! libFuzzer entry for the `dispatcher_update_task_status` target of `shoal-fuzz` (see crates/fuzz/README.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let target = shoal_fuzz::target("dispatcher_update_task_status").expect("the target exists");
    (target.run)(data)
});
