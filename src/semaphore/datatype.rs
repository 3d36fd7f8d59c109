//! The semaphore type `warden-sm` and its `extern "C"` callbacks (RDB, AOF,
//! copy, memory, free, unlink). Decoding validates every field: `RESTORE`
//! hands hostile bytes to `rdb_load`, which must answer with an error, never
//! a crash or a huge allocation.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::args::MAX_OWNER;
use crate::datatypes::{boxed, emit_aof, note_unlink, release_value, system_ms, Tracked};
use crate::fence::{self, FENCES};
use crate::grace;
use crate::guard;
use crate::restored;
use crate::semaphore::state::{Hold, Semaphore, MAX_LIMIT};
use crate::stats;

impl Tracked for Semaphore {
    fn track(&self, sign: i64) {
        stats::SEM_KEYS.add(sign);
    }

    fn freed(&self, now_ms: i64) {
        let holds = self.holds().filter_map(|(_, h)| h.held_for(now_ms));
        for held_ms in self.ended.iter().copied().chain(holds) {
            stats::SEM_HOLD.observe(held_ms);
        }
    }
}

/// Encoding version of `warden-sm` values; `rdb_load` reads every version up
/// to it. Both: limit, fence, number of holds, then the holds. 1: each hold
/// as four fields (owner, permits, fence, deadline). 2: the holds packed in
/// strings of at most `CHUNK` holds, each hold as owner length, owner,
/// permits, fence and deadline in LEB128: one field per chunk instead of four
/// per hold, so `DUMP`, `RESTORE` and `MIGRATE` of a big semaphore cost about
/// what copying its bytes does.
const SEM_ENCVER: c_int = 2;

/// Holds per packed string (about 150 KB with 28-byte owners).
const CHUNK: usize = 4096;

/// The name of the command that carries a semaphore's changes to replicas
/// and the AOF.
pub const SEM_EFFECT: &str = "WARDEN.SEMSET";

pub static SEM_TYPE: RedisType = RedisType::new(
    "warden-sm",
    SEM_ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(sem_rdb_load),
        rdb_save: Some(sem_rdb_save),
        aof_rewrite: Some(sem_aof_rewrite),
        mem_usage: Some(sem_mem_usage),
        digest: None,
        free: Some(sem_free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: Some(sem_free_effort),
        unlink: None,
        copy: None,
        defrag: None,
        copy2: Some(sem_copy),
        free_effort2: None,
        mem_usage2: None,
        unlink2: Some(sem_unlink),
    },
);

/// Checks one hold read from outside (RDB, `RESTORE`, a replicated effect).
/// Permits may exceed a limit lowered after they were granted.
pub fn valid_hold(owner: &[u8], hold: &Hold, key_fence: u64) -> bool {
    valid_hold_at(owner, hold, key_fence, system_ms())
}

/// [`valid_hold`] with the clock read once for a whole load.
fn valid_hold_at(owner: &[u8], hold: &Hold, key_fence: u64, now_ms: i64) -> bool {
    (1..=MAX_OWNER).contains(&owner.len())
        && (1..=MAX_LIMIT).contains(&hold.permits)
        && fence::acceptable_at(hold.fence, now_ms.max(0) as u64)
        && hold.fence <= key_fence
        && hold.deadline_ms >= 0
        && hold.deadline_ms <= now_ms.saturating_add(crate::args::MAX_MS)
}

/// Checks the key-wide fields read from outside.
pub fn valid_header(limit: u64, fence: u64) -> bool {
    (1..=MAX_LIMIT).contains(&limit) && fence::acceptable(fence)
}

/// Under `warden.max-lease`, no hold of a loaded or copied semaphore ends
/// later than the cap from now (nothing to look at without a cap).
fn cap_holds(sem: &mut Semaphore) {
    if grace::capping() {
        let now = system_ms();
        sem.map_deadlines(|d| grace::cap_deadline(d, now));
    }
}

/// Appends `n` in LEB128.
fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Takes a LEB128 number off the front of `bytes` (at most 10 bytes, no
/// overflow).
fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for i in 0..10 {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        let part = u64::from(b & 0x7f);
        if i == 9 && part > 1 {
            return None;
        }
        n |= part << (7 * i);
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// Takes one packed hold (encoding 2) off the front of `bytes`.
fn take_hold<'a>(bytes: &mut &'a [u8]) -> Option<(&'a [u8], Hold)> {
    let len = usize::try_from(take_varint(bytes)?).ok()?;
    if len > bytes.len() {
        return None;
    }
    let (owner, rest) = bytes.split_at(len);
    *bytes = rest;
    let hold = Hold {
        permits: take_varint(bytes)?,
        fence: take_varint(bytes)?,
        deadline_ms: i64::try_from(take_varint(bytes)?).ok()?,
        granted_ms: 0,
    };
    Some((owner, hold))
}

/// Reads a semaphore of encoding `encver`; `None` for anything invalid.
/// Nothing is allocated from a count: each hold must be in the payload.
fn load_semaphore(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Semaphore> {
    let limit = raw::load_unsigned(rdb).ok()?;
    let fence = raw::load_unsigned(rdb).ok()?;
    if !valid_header(limit, fence) {
        return None;
    }
    let mut sem = Semaphore::new(limit);
    sem.fence = fence;
    let count = raw::load_unsigned(rdb).ok()?;
    // Tokens are unique per key: a payload repeating one is refused.
    let mut fences = rustc_hash::FxHashSet::default();
    let now = system_ms();
    let accept =
        |sem: &mut Semaphore, fences: &mut rustc_hash::FxHashSet<u64>, owner: &[u8], hold: Hold| {
            if !valid_hold_at(owner, &hold, fence, now) || !fences.insert(hold.fence) {
                return None;
            }
            sem.push_loaded(owner, hold);
            Some(())
        };
    match encver {
        1 => {
            for _ in 0..count {
                let owner = raw::load_string_buffer(rdb).ok()?;
                let hold = Hold {
                    permits: raw::load_unsigned(rdb).ok()?,
                    fence: raw::load_unsigned(rdb).ok()?,
                    deadline_ms: raw::load_signed(rdb).ok()?,
                    granted_ms: 0,
                };
                accept(&mut sem, &mut fences, owner.as_ref(), hold)?;
            }
        }
        2 => {
            let mut loaded = 0u64;
            while loaded < count {
                let chunk = raw::load_string_buffer(rdb).ok()?;
                let mut bytes = chunk.as_ref();
                if bytes.is_empty() {
                    return None;
                }
                // A packed hold takes 5 bytes at least.
                let bound = (count - loaded).min(bytes.len() as u64 / 5) as usize;
                fences.reserve(bound);
                sem.reserve_loaded(bound);
                while !bytes.is_empty() && loaded < count {
                    let (owner, hold) = take_hold(&mut bytes)?;
                    accept(&mut sem, &mut fences, owner, hold)?;
                    loaded += 1;
                }
                if !bytes.is_empty() {
                    return None;
                }
            }
        }
        _ => return None,
    }
    if sem.is_free() || !sem.loaded() {
        return None;
    }
    Some(sem)
}

unsafe extern "C" fn sem_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || {
        let Some(mut sem) = load_semaphore(rdb, encver) else {
            return std::ptr::null_mut();
        };
        let saved = sem.deadline();
        cap_holds(&mut sem);
        // The key's expiry, a `RESTORE` ttl or a capped load's saved one,
        // is put back to the last lease when it lies beyond it.
        if sem.deadline() != saved || !restored::loading() {
            restored::note_loaded(rdb);
        }
        FENCES.observe(sem.fence);
        boxed(sem)
    })
}

unsafe extern "C" fn sem_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let sem = &*value.cast::<Semaphore>();
    raw::save_unsigned(rdb, sem.limit);
    raw::save_unsigned(rdb, sem.fence);
    raw::save_unsigned(rdb, sem.holders() as u64);
    let mut packed = Vec::with_capacity(sem.holders().min(CHUNK) * 48);
    for (i, (owner, hold)) in sem.holds().enumerate() {
        put_varint(&mut packed, owner.len() as u64);
        packed.extend_from_slice(owner);
        put_varint(&mut packed, hold.permits);
        put_varint(&mut packed, hold.fence);
        put_varint(&mut packed, hold.deadline_ms.max(0) as u64);
        if (i + 1) % CHUNK == 0 {
            raw::save_slice(rdb, &packed);
            packed.clear();
        }
    }
    if !packed.is_empty() {
        raw::save_slice(rdb, &packed);
    }
}

/// The words of `WARDEN.SEMSET` after the key: `limit fence now mode`, then
/// `owner permits fence deadline` per hold named.
pub fn effect_words<'a>(
    sem: &'a Semaphore,
    mode: &'static [u8],
    owners: &'a [Vec<u8>],
) -> Vec<Vec<u8>> {
    let mut words = Vec::with_capacity(4 + 4 * owners.len());
    words.push(sem.limit.to_string().into_bytes());
    words.push(sem.fence.to_string().into_bytes());
    words.push(sem.pruned_at.to_string().into_bytes());
    words.push(mode.to_vec());
    for owner in owners {
        let (permits, fence, deadline) = sem
            .hold(owner)
            .map_or((0, 0, 0), |h| (h.permits, h.fence, h.deadline_ms));
        words.push(owner.clone());
        words.push(permits.to_string().into_bytes());
        words.push(fence.to_string().into_bytes());
        words.push(deadline.to_string().into_bytes());
    }
    words
}

unsafe extern "C" fn sem_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let sem = &*value.cast::<Semaphore>();
    let owners: Vec<Vec<u8>> = sem.holds().map(|(o, _)| o.to_vec()).collect();
    let words = effect_words(sem, b"SET", &owners);
    emit_aof(aof, c"WARDEN.SEMSET", key, &words);
}

unsafe extern "C" fn sem_mem_usage(value: *const c_void) -> usize {
    (*value.cast::<Semaphore>()).memory()
}

/// The work of freeing a semaphore, in holds: above Redis' threshold,
/// `UNLINK` (and lazy freeing) frees it on a background thread.
unsafe extern "C" fn sem_free_effort(
    _key: *mut raw::RedisModuleString,
    value: *const c_void,
) -> usize {
    (*value.cast::<Semaphore>()).holders()
}

unsafe extern "C" fn sem_free(value: *mut c_void) {
    release_value::<Semaphore>(value, |sem, now| sem.deadline().is_some_and(|d| d < now));
}

unsafe extern "C" fn sem_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    let deadline = (*value.cast::<Semaphore>()).deadline().unwrap_or(0);
    guard::callback((), || note_unlink(ctx, deadline))
}

unsafe extern "C" fn sem_copy(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    // The copy is a new value whose holds this server did not grant, and
    // whose leases end no later than `warden.max-lease` from now; the expiry
    // it gets from its source is put back to its last lease.
    restored::note_copied(ctx);
    let mut copy = (*value.cast::<Semaphore>()).copied();
    cap_holds(&mut copy);
    copy.clear_changed();
    boxed(copy)
}
