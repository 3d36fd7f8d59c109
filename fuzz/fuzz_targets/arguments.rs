//! Every argument parser: lock requests, integers, error rates.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warden::fuzzing::arguments(data));
