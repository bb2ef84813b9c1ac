#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stateplane_fuzz::store_reply(data));
