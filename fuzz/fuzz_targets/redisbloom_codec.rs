//! RedisBloom's formats: a `SCANDUMP` header with a chunk, and the same
//! bytes read as the fields of its RDB encoding; each filter that loads is used.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warden::fuzzing::redisbloom_codec(data));
