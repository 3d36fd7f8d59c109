//! The `warden-bf` type and its `extern "C"` callbacks: RDB, AOF, copy,
//! memory, free (and how much work freeing is); and `MBbloom--`, the type
//! that holds filters imported from RedisBloom (same values, RedisBloom's
//! RDB and `SCANDUMP` formats).
//!
//! RDB encodings (`rdb_load` reads both):
//! 1. the `codec` header, then each sub-filter's bits as one string;
//! 2. the header, then per sub-filter the count of non-zero pieces and each
//!    as (piece index, `codec::PIECE` bytes or fewer for the last). Loading
//!    copies one piece at a time, and zero pieces cost nothing.

use std::os::raw::{c_char, c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::bloom::chain::{Chain, Scheme};
use crate::bloom::codec::{self, Header};
use crate::bloom::redisbloom::{self, ChainFields, LinkFields};
use crate::datatypes::{boxed, release_value, Tracked};
use crate::guard;
use crate::stats;

impl Tracked for Chain {
    fn track(&self, sign: i64) {
        stats::BLOOM_FILTERS.add(sign);
        stats::BLOOM_BYTES.add(sign * self.bytes() as i64);
        stats::BLOOM_SUBFILTERS.add(sign * self.filters.len() as i64);
    }
}

/// Encoding version of `warden-bf` values.
const BLOOM_ENCVER: c_int = 2;

pub static BLOOM_TYPE: RedisType = RedisType::new(
    "warden-bf",
    BLOOM_ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(bloom_rdb_load),
        rdb_save: Some(bloom_rdb_save),
        aof_rewrite: Some(bloom_aof_rewrite),
        mem_usage: Some(bloom_mem_usage),
        digest: None,
        free: Some(bloom_free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: Some(bloom_free_effort),
        unlink: None,
        copy: Some(bloom_copy),
        // No active defragmentation: jemalloc only moves small blocks, never
        // the large bit arrays that make up a filter's memory, and neither
        // server measured here (Debian's 7.0 on the system jemalloc, the
        // Valkey 9.1 wheel on libc malloc) can enable `activedefrag` to test it.
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// Reads one encoded filter; `None` on any error or inconsistency.
/// How large a filter `rdb_load` may build: any size while the server loads
/// its own files or a master's; for `RESTORE`, at most `warden.bf-max-memory`
/// and what `maxmemory` leaves (a small payload may describe a huge empty
/// filter: it is refused before anything is allocated).
fn restore_limit(rdb: *mut raw::RedisModuleIO) -> u64 {
    let ctx = unsafe { raw::RedisModule_GetContextFromIO.unwrap()(rdb) };
    if ctx.is_null() {
        return u64::MAX;
    }
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    let applied = raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_REPLICATED;
    if flags & applied != 0 {
        return u64::MAX;
    }
    let filter = crate::config::BF_MAX_MEMORY.load(std::sync::atomic::Ordering::Relaxed) as u64;
    filter.min(crate::memory::room())
}

fn load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Chain> {
    if !(1..=BLOOM_ENCVER).contains(&encver) {
        return None;
    }
    let header = raw::load_string_buffer(rdb).ok()?;
    // Zeroed pages cost no RAM until written (v2 saves only the pieces that
    // are not zero), but `used_memory` counts them at once: `RESTORE` is held
    // to the limits (see `restore_limit`), loading is not.
    let header: Header = codec::decode_header(header.as_ref(), restore_limit(rdb)).ok()?;
    let mut chain = header.empty_chain();
    for f in &mut chain.filters {
        let words = f.words_mut();
        if encver == 1 {
            let bytes = raw::load_string_buffer(rdb).ok()?;
            codec::load_whole(words, bytes.as_ref()).ok()?;
            continue;
        }
        let count = raw::load_unsigned(rdb).ok()?;
        let pieces = codec::pieces(words.len());
        if count > pieces as u64 {
            return None;
        }
        let mut next = 0;
        for _ in 0..count {
            let index = raw::load_unsigned(rdb).ok()?;
            if index < next || index >= pieces as u64 {
                return None;
            }
            let bytes = raw::load_string_buffer(rdb).ok()?;
            codec::load_piece(words, index as usize, bytes.as_ref()).ok()?;
            next = index + 1;
        }
    }
    Some(chain)
}

unsafe extern "C" fn bloom_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || match load(rdb, encver) {
        Some(chain) => boxed(chain),
        None => std::ptr::null_mut(),
    })
}

unsafe extern "C" fn bloom_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback((), || {
        let chain = &*value.cast::<Chain>();
        raw::save_slice(rdb, &codec::encode_header(chain));
        for f in &chain.filters {
            let words = f.words();
            let filled: Vec<(usize, Vec<u8>)> = (0..codec::pieces(words.len()))
                .filter_map(|i| codec::piece(words, i).map(|bytes| (i, bytes)))
                .collect();
            raw::save_unsigned(rdb, filled.len() as u64);
            for (index, bytes) in &filled {
                raw::save_unsigned(rdb, *index as u64);
                raw::save_slice(rdb, bytes);
            }
        }
    })
}

unsafe extern "C" fn bloom_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    rewrite_as_chunks(aof, key, value, codec::encode_header);
}

/// `BF.LOADCHUNK` commands that rebuild the filter: its header (from
/// `header`), then every chunk that is not all zeros.
unsafe fn rewrite_as_chunks(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
    header: fn(&Chain) -> Vec<u8>,
) {
    guard::callback((), || {
        let chain = &*value.cast::<Chain>();
        let emit = |iter: i64, data: &[u8]| {
            raw::RedisModule_EmitAOF.unwrap()(
                aof,
                c"BF.LOADCHUNK".as_ptr(),
                c"slb".as_ptr(),
                key,
                iter,
                data.as_ptr().cast::<c_char>(),
                data.len(),
            );
        };
        emit(1, &header(chain));
        let mut offset = 0u64;
        while let Some(chunk) = codec::chunk_at(chain, offset) {
            offset += chunk.len() as u64;
            // The header made every bit zero: zero chunks need no command.
            if chunk.iter().any(|b| *b != 0) {
                emit(1 + offset as i64, &chunk);
            }
        }
    })
}

unsafe extern "C" fn bloom_mem_usage(value: *const c_void) -> usize {
    (*value.cast::<Chain>()).bytes()
}

unsafe extern "C" fn bloom_free(value: *mut c_void) {
    release_value::<Chain>(value, |_, _| false);
}

/// Bytes of bits that count as one allocation of free effort: Redis frees a
/// value on its background thread (`UNLINK`, `FLUSHALL ASYNC`, `lazyfree-*`)
/// when the effort passes 64, so filters above 4 MiB go there.
const EFFORT_UNIT: usize = 64 << 10;

unsafe extern "C" fn bloom_free_effort(
    _key: *mut raw::RedisModuleString,
    value: *const c_void,
) -> usize {
    let chain = &*value.cast::<Chain>();
    chain.filters.len() + chain.bytes() / EFFORT_UNIT
}

unsafe extern "C" fn bloom_copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || {
        // `COPY` of a filter that does not fit in what `maxmemory` leaves fails.
        let chain = &*value.cast::<Chain>();
        if chain.bytes() as u64 > crate::memory::room() {
            return std::ptr::null_mut();
        }
        boxed(chain.clone())
    })
}

/// The type of filters imported from RedisBloom: its name, so that its RDB
/// files and `DUMP` payloads load, and its encoding version, so that what
/// warden saves loads back into RedisBloom too. Registered only when warden
/// serves `BF.*` (`lib.rs`).
pub static REDISBLOOM_TYPE: RedisType = RedisType::new(
    "MBbloom--",
    redisbloom::ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(redisbloom_rdb_load),
        rdb_save: Some(redisbloom_rdb_save),
        aof_rewrite: Some(redisbloom_aof_rewrite),
        mem_usage: Some(bloom_mem_usage),
        digest: None,
        free: Some(bloom_free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: Some(bloom_free_effort),
        unlink: None,
        copy: Some(bloom_copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// The type a chain is stored as: imported filters stay `MBbloom--`.
pub fn type_of(chain: &Chain) -> &'static RedisType {
    match chain.scheme {
        Scheme::Warden => &BLOOM_TYPE,
        Scheme::RedisBloom { .. } => &REDISBLOOM_TYPE,
    }
}

/// Reads a filter in RedisBloom's RDB encoding (layout in `redisbloom`);
/// `None` on any error or inconsistency. Each link's bits must be in the
/// payload before anything is allocated for them.
fn load_redisbloom(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Chain> {
    if !(redisbloom::OLDEST_ENCVER..=redisbloom::ENCVER).contains(&encver) {
        return None;
    }
    let fields = ChainFields {
        items: raw::load_unsigned(rdb).ok()?,
        links: raw::load_unsigned(rdb).ok()?,
        options: if encver >= 2 {
            raw::load_unsigned(rdb).ok()?
        } else {
            0
        },
        growth: if encver >= 4 {
            raw::load_unsigned(rdb).ok()?
        } else {
            2
        },
    };
    redisbloom::check_chain(&fields).ok()?;
    let limit = restore_limit(rdb);
    let mut total = std::mem::size_of::<Chain>() as u64;
    let mut filters = Vec::new();
    for _ in 0..fields.links {
        let capacity = raw::load_unsigned(rdb).ok()?;
        let error = raw::load_double(rdb).ok()?;
        let hashes = raw::load_unsigned(rdb).ok()?;
        let _bits_per_entry = raw::load_double(rdb).ok()?;
        let link = LinkFields {
            capacity,
            error,
            hashes,
            bits: raw::load_unsigned(rdb).ok()?,
            n2: raw::load_unsigned(rdb).ok()?,
        };
        let words = redisbloom::check_link(&link).ok()?;
        total = total.saturating_add(words as u64 * 8);
        if total > limit {
            return None;
        }
        let bytes = raw::load_string_buffer(rdb).ok()?;
        if bytes.as_ref().len() != words * 8 {
            return None;
        }
        let mut bits = vec![0u64; words];
        codec::load_whole(&mut bits, bytes.as_ref()).ok()?;
        drop(bytes);
        let items = raw::load_unsigned(rdb).ok()?;
        filters.push(redisbloom::link(&link, bits, items).ok()?);
    }
    redisbloom::chain(&fields, filters).ok()
}

unsafe extern "C" fn redisbloom_rdb_load(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || {
        match load_redisbloom(rdb, encver) {
            Some(chain) => boxed(chain),
            None => std::ptr::null_mut(),
        }
    })
}

unsafe extern "C" fn redisbloom_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback((), || {
        let chain = &*value.cast::<Chain>();
        raw::save_unsigned(rdb, chain.items());
        raw::save_unsigned(rdb, chain.filters.len() as u64);
        raw::save_unsigned(rdb, u64::from(redisbloom::options(chain)));
        raw::save_unsigned(rdb, u64::from(redisbloom::growth(chain)));
        for f in &chain.filters {
            let link = redisbloom::fields(f);
            raw::save_unsigned(rdb, link.capacity);
            raw::save_double(rdb, link.error);
            raw::save_unsigned(rdb, link.hashes);
            raw::save_double(rdb, redisbloom::bits_per_entry(link.error));
            raw::save_unsigned(rdb, link.bits);
            raw::save_unsigned(rdb, link.n2);
            let words = f.words();
            raw::save_slice(rdb, &codec::read_bytes(words, 0, words.len() * 8));
            raw::save_unsigned(rdb, f.items);
        }
    })
}

unsafe extern "C" fn redisbloom_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    rewrite_as_chunks(aof, key, value, redisbloom::encode_header);
}
