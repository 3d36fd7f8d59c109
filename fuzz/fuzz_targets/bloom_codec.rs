//! The Bloom byte codec: a header (as BF.LOADCHUNK and RDB receive it), a
//! chunk written into the filter it describes, then the filter used.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warden::fuzzing::bloom_codec(data));
