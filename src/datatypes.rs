//! The lock types and their `extern "C"` callbacks (RDB, AOF, copy, memory,
//! free, aux data); the Bloom type's live in `bloom::datatype`. Decoding
//! validates every field: `RESTORE` hands hostile bytes to `rdb_load`, which
//! must answer with an error, never a crash.

use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::args::MAX_OWNER;
use crate::fence::{self, FENCES};
use crate::grace;
use crate::guard;
use crate::keyspace::Key;
use crate::lock::state::{Lock, MAX_HOLDS};
use crate::restored;
use crate::rwlock::state::{Hold, RwLock};
use crate::stats;

/// Values whose numbers `INFO warden` reports: counted in when stored (or
/// loaded, or copied), counted out when Redis frees them.
pub trait Tracked {
    fn track(&self, sign: i64);

    /// The value leaves the keyspace at `now_ms`: the holds it had end.
    fn freed(&self, _now_ms: i64) {}
}

impl Tracked for Lock {
    fn track(&self, sign: i64) {
        stats::LOCK_KEYS.add(sign);
    }

    fn freed(&self, now_ms: i64) {
        if let Some(held_ms) = self.held_for(now_ms) {
            stats::LOCK_HOLD.observe(held_ms);
        }
    }
}

impl Tracked for RwLock {
    fn track(&self, sign: i64) {
        stats::RWLOCK_KEYS.add(sign);
    }

    fn freed(&self, now_ms: i64) {
        let holds = self.writer.iter().chain(&self.readers);
        let ended = self.ended.iter().copied();
        for held_ms in ended.chain(holds.filter_map(|h| h.held_for(now_ms))) {
            stats::RWLOCK_HOLD.observe(held_ms);
        }
    }
}

/// Stores a new value in a key (replacing, and so freeing, what it held).
pub fn store<T: Tracked>(key: &Key, ty: &RedisType, value: T) {
    value.track(1);
    key.set_value(ty, value);
}

pub(crate) fn boxed<T: Tracked>(value: T) -> *mut c_void {
    value.track(1);
    Box::into_raw(Box::new(value)).cast::<c_void>()
}

/// Frees a value; `lapsed` says whether its lease had ended unreleased.
pub(crate) unsafe fn release_value<T: Tracked>(
    value: *mut c_void,
    lapsed: impl FnOnce(&T, i64) -> bool,
) {
    let value = Box::from_raw(value.cast::<T>());
    value.track(-1);
    // `free` may run on a background thread: the system clock, not Redis'.
    let now = system_ms();
    value.freed(now);
    if lapsed(&value, now) {
        stats::LEASE_EXPIRIES.add(1);
    }
}

/// Encoding version of `warden-lk` values; `rdb_load` reads every version up
/// to it. 1: holds, fence, owner. 2: and the lease deadline (so that a lock
/// evicted before any command touched it still keeps its key until then).
const LOCK_ENCVER: c_int = 2;

/// The lock type as code refers to it. Registered by `register_lock_type`
/// in one of two shapes (which aux callback the server gets), never twice.
pub static LOCK_TYPE: RedisType = RedisType::new("warden-lk", LOCK_ENCVER, lock_methods(false));

/// The same type where the server has `aux_save2` (Redis ≥ 7.2, Valkey):
/// aux data only when there is something to save.
static LOCK_TYPE_AUX2: RedisType = RedisType::new("warden-lk", LOCK_ENCVER, lock_methods(true));

/// Registers the lock type. Aux data ties an RDB to the module: a server
/// without warden refuses the whole file. With `aux_save2` warden writes it
/// only while it matters — an evicted lock still keeps its key, or the token
/// counter is ahead of the clock floor every later draw starts from. Without
/// it (Redis 7.0), warden writes none: the counter's floor and the fences in
/// the saved keys keep tokens increasing, and evicted locks are forgotten by a
/// restart. Aux data from any version is read either way.
pub fn register_lock_type(ctx: &redis_module::Context) -> bool {
    let method_version =
        unsafe { raw::RedisModule_GetTypeMethodVersion }.map_or(0, |f| unsafe { f() });
    let aux2 = method_version >= 5;
    let ty = if aux2 { &LOCK_TYPE_AUX2 } else { &LOCK_TYPE };
    if ty.create_data_type(ctx.ctx).is_err() {
        return false;
    }
    if aux2 {
        *LOCK_TYPE.raw_type.borrow_mut() = *LOCK_TYPE_AUX2.raw_type.borrow();
    }
    ctx.log_notice(if aux2 {
        "warden: RDB aux data only while an evicted lock keeps its key or the token counter is ahead of the clock"
    } else {
        "warden: no RDB aux data on this server (it has no aux_save2): evicted locks do not outlive a restart"
    });
    true
}

const fn lock_methods(aux2: bool) -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(lock_rdb_load),
        rdb_save: Some(lock_rdb_save),
        aof_rewrite: Some(lock_aof_rewrite),
        mem_usage: Some(lock_mem_usage),
        digest: None,
        free: Some(lock_free),
        aux_load: Some(fence_aux_load),
        aux_save: None,
        aux_save2: if aux2 { Some(fence_aux_save) } else { None },
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        copy2: Some(lock_copy),
        free_effort2: None,
        mem_usage2: None,
        unlink2: Some(lock_unlink),
    }
}

/// The name of the command that carries a lock's full state to replicas and the AOF.
pub const LOCK_EFFECT: &std::ffi::CStr = c"WARDEN.LOCKSET";

/// A saved lease deadline, or 0 (no lease: ended) if it lies further ahead
/// than any lease can reach: every deadline warden keeps is finite.
pub fn bounded_deadline(at_ms: i64) -> i64 {
    if at_ms <= system_ms().saturating_add(crate::args::MAX_MS) {
        at_ms
    } else {
        0
    }
}

/// The system clock in ms (callbacks may run where Redis' clock is not at hand).
pub(crate) fn system_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Checks a lock read from outside (RDB, `RESTORE`, a replicated effect).
pub fn valid_lock(owner: &[u8], holds: u64, fence: u64) -> bool {
    (1..=MAX_OWNER).contains(&owner.len())
        && (1..=MAX_HOLDS).contains(&holds)
        && fence::acceptable(fence)
}

unsafe extern "C" fn lock_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || {
        if !(1..=LOCK_ENCVER).contains(&encver) {
            return std::ptr::null_mut();
        }
        let Ok(holds) = raw::load_unsigned(rdb) else {
            return std::ptr::null_mut();
        };
        let Ok(fence) = raw::load_unsigned(rdb) else {
            return std::ptr::null_mut();
        };
        let Ok(owner) = raw::load_string_buffer(rdb) else {
            return std::ptr::null_mut();
        };
        // The lease is the key's own expiry, which commands read when they
        // open the key; the saved copy serves eviction and a key without
        // expiry. Encoding 1 has none, and earlier builds saved "never" for a
        // key without expiry: 0 then, until the key's expiry (set right after
        // loading) is read into it.
        // Under `warden.max-lease` no loaded lease (a `RESTORE`d payload
        // included) ends later than the cap from now.
        let (deadline_ms, lowered) = match encver {
            1 => (0, false),
            _ => match raw::load_signed(rdb) {
                Ok(0) => (0, false),
                Ok(at) if at > 0 => {
                    let saved = bounded_deadline(at);
                    let capped = grace::cap_deadline(saved, system_ms());
                    (capped, capped != saved)
                }
                _ => return std::ptr::null_mut(),
            },
        };
        if !valid_lock(owner.as_ref(), holds, fence) {
            return std::ptr::null_mut();
        }
        // A `RESTORE` (not a load: there the saved expiry is the lease, as
        // the value's may lag a `PEXPIRE` made without a cap) keeps the
        // saved lease, whatever its ttl; the key's expiry is put back to it,
        // as is a load's beyond the capped lease.
        let restoring = !restored::loading();
        if lowered || restoring {
            restored::note_loaded(rdb);
        }
        FENCES.observe(fence);
        let lock = Lock {
            owner: owner.as_ref().to_vec(),
            holds,
            fence,
            deadline_ms,
            granted_ms: 0,
            foreign_expiry: restoring && deadline_ms > 0,
        };
        boxed(lock)
    })
}

unsafe extern "C" fn lock_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let lock = &*value.cast::<Lock>();
    raw::save_unsigned(rdb, lock.holds);
    raw::save_unsigned(rdb, lock.fence);
    raw::save_slice(rdb, &lock.owner);
    raw::save_signed(rdb, lock.deadline_ms);
}

/// A lock key leaves the keyspace (deleted, expired, evicted, overwritten,
/// renamed or moved away): its waiters are served, and the eviction guard
/// learns which lock it held. This callback, not a keyspace subscription, is
/// how the lock kinds hear of their own keys: it costs other keys nothing.
pub(crate) unsafe fn note_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, deadline_ms: i64) {
    note_unlink_of(ctx, deadline_ms, true);
}

/// [`note_unlink`] for a lock (`lock`) or a rate limiter.
pub(crate) unsafe fn note_unlink_of(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    deadline_ms: i64,
    lock: bool,
) {
    let db = raw::RedisModule_GetDbIdFromOptCtx.unwrap()(ctx);
    let key = raw::RedisModule_GetKeyNameFromOptCtx.unwrap()(ctx);
    let mut len = 0;
    let ptr = raw::string_ptr_len(key.cast_mut(), &mut len);
    let name = std::slice::from_raw_parts(ptr.cast::<u8>(), len);
    crate::waiters::key_removed(db, name);
    if crate::evicted::eviction_possible() {
        crate::evicted::on_unlink(db, name, deadline_ms, lock);
    }
}

unsafe extern "C" fn lock_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard::callback((), || note_unlink(ctx, (*value.cast::<Lock>()).deadline_ms))
}

unsafe extern "C" fn rwlock_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    let deadline = (*value.cast::<RwLock>()).deadline().unwrap_or(0);
    guard::callback((), || note_unlink(ctx, deadline))
}

unsafe extern "C" fn lock_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let lock = &*value.cast::<Lock>();
    let cmd = c"WARDEN.LOCKSET";
    // Redis writes the key's PEXPIREAT right after this command; the lease
    // also travels here, so a key without expiry still gets one back.
    raw::RedisModule_EmitAOF.unwrap()(
        aof,
        cmd.as_ptr(),
        c"sblll".as_ptr(),
        key,
        lock.owner.as_ptr().cast::<c_char>(),
        lock.owner.len(),
        lock.holds as i64,
        lock.fence as i64,
        lock.deadline_ms,
    );
}

unsafe extern "C" fn lock_mem_usage(value: *const c_void) -> usize {
    (*value.cast::<Lock>()).memory()
}

unsafe extern "C" fn lock_free(value: *mut c_void) {
    release_value::<Lock>(value, |lock, now| lock.deadline_ms < now);
}

unsafe extern "C" fn lock_copy(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    // The copy is a new value whose holds this server did not grant, and
    // whose lease no longer than `warden.max-lease` from now; the expiry it
    // gets from its source is put back to that lease.
    let lock = &*value.cast::<Lock>();
    let deadline_ms = match lock.deadline_ms {
        0 => 0,
        at => grace::cap_deadline(at, system_ms()),
    };
    // Without a cap the copy's expiry is its source's, which is the lease
    // unless that is a `RESTORE`'s ttl not put back yet (the copy keeps the flag).
    if grace::capping() || lock.foreign_expiry {
        restored::note_copied(ctx);
    }
    boxed(Lock {
        granted_ms: 0,
        deadline_ms,
        ..lock.clone()
    })
}

/// Aux data, before the keys: the token counter; from encoding 2 on, also
/// the evicted locks still keeping their keys (db, key, deadline). Saved
/// (through `aux_save2`) only when needed: while an evicted lock keeps its
/// key, or while the counter is at or ahead of the next millisecond's clock
/// floor (a restart, a millisecond later at least, draws above every token
/// drawn before).
unsafe extern "C" fn fence_aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    let next_floor = (system_ms().max(0) as u64 + 1) << 10;
    let needed = crate::evicted::any() || FENCES.last() >= next_floor;
    if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int && needed {
        raw::save_unsigned(rdb, FENCES.last());
        let taken = crate::evicted::snapshot();
        raw::save_unsigned(rdb, taken.len() as u64);
        for (db, name, deadline) in taken {
            raw::save_signed(rdb, i64::from(db));
            raw::save_slice(rdb, &name);
            raw::save_signed(rdb, deadline);
        }
    }
}

unsafe extern "C" fn fence_aux_load(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    when: c_int,
) -> c_int {
    let ok = raw::REDISMODULE_OK as c_int;
    if when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        return ok;
    }
    match raw::load_unsigned(rdb) {
        Ok(last) if fence::acceptable(last) || last == 0 => FENCES.observe(last),
        _ => return raw::REDISMODULE_ERR as c_int,
    }
    if encver < 2 {
        return ok;
    }
    let Ok(count) = raw::load_unsigned(rdb) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    for _ in 0..count {
        let entry = (
            raw::load_signed(rdb),
            raw::load_string_buffer(rdb),
            raw::load_signed(rdb),
        );
        let (Ok(db), Ok(name), Ok(deadline)) = entry else {
            return raw::REDISMODULE_ERR as c_int;
        };
        let Ok(db) = c_int::try_from(db) else {
            return raw::REDISMODULE_ERR as c_int;
        };
        if db < 0 || name.as_ref().len() > 1 << 29 {
            return raw::REDISMODULE_ERR as c_int;
        }
        crate::evicted::restore(db, name.as_ref(), deadline);
    }
    ok
}

/// Encoding version of `warden-rw` values.
const RWLOCK_ENCVER: c_int = 1;

/// The name of the command that carries a read-write lock's full state.
pub const RWLOCK_EFFECT: &str = "WARDEN.RWSET";

/// The name of the command that carries the holds one command changed.
pub const RWLOCK_DELTA: &str = "WARDEN.RWHOLD";

pub static RWLOCK_TYPE: RedisType = RedisType::new(
    "warden-rw",
    RWLOCK_ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rwlock_rdb_load),
        rdb_save: Some(rwlock_rdb_save),
        aof_rewrite: Some(rwlock_aof_rewrite),
        mem_usage: Some(rwlock_mem_usage),
        digest: None,
        free: Some(rwlock_free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        copy2: Some(rwlock_copy),
        free_effort2: None,
        mem_usage2: None,
        unlink2: Some(rwlock_unlink),
    },
);

/// Checks a read-write lock read from outside: valid holds, distinct
/// readers, no token above the key's, and at least one hold.
pub fn valid_rwlock(lock: &RwLock) -> bool {
    let holds: Vec<&Hold> = lock.writer.iter().chain(&lock.readers).collect();
    let distinct = lock
        .readers
        .iter()
        .enumerate()
        .all(|(i, r)| lock.readers[..i].iter().all(|o| o.owner != r.owner));
    // Readers beside a writer are only its own (a downgrade in progress).
    let exclusive = lock
        .writer
        .as_ref()
        .is_none_or(|w| lock.readers.iter().all(|r| r.owner == w.owner));
    let total = holds
        .iter()
        .try_fold(0u64, |total, h| total.checked_add(h.holds));
    !holds.is_empty()
        && distinct
        && exclusive
        && total.is_some_and(|t| t <= MAX_HOLDS)
        && fence::acceptable(lock.fence)
        && holds.iter().all(|h| {
            valid_lock(&h.owner, h.holds, h.fence)
                && h.fence <= lock.fence
                && h.deadline_ms >= 0
                && bounded_deadline(h.deadline_ms) == h.deadline_ms
        })
}

/// Under `warden.max-lease`, no hold of a loaded or copied read-write lock
/// ends later than the cap from now.
fn cap_holds(lock: &mut RwLock) {
    let now = system_ms();
    for hold in lock.writer.iter_mut().chain(&mut lock.readers) {
        hold.deadline_ms = grace::cap_deadline(hold.deadline_ms, now);
    }
}

fn load_hold(rdb: *mut raw::RedisModuleIO) -> Option<Hold> {
    let owner = raw::load_string_buffer(rdb).ok()?;
    let holds = raw::load_unsigned(rdb).ok()?;
    let fence = raw::load_unsigned(rdb).ok()?;
    let deadline_ms = raw::load_signed(rdb).ok()?;
    Some(Hold {
        owner: owner.as_ref().to_vec(),
        holds,
        fence,
        deadline_ms,
        granted_ms: 0,
    })
}

unsafe extern "C" fn rwlock_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || {
        let load = || -> Option<(bool, RwLock)> {
            if !(1..=RWLOCK_ENCVER).contains(&encver) {
                return None;
            }
            let fence = raw::load_unsigned(rdb).ok()?;
            let writer = match raw::load_unsigned(rdb).ok()? {
                0 => None,
                1 => Some(load_hold(rdb)?),
                _ => return None,
            };
            let count = raw::load_unsigned(rdb).ok()?;
            // No allocation from the count: each reader must actually be in the payload.
            let mut readers = Vec::new();
            for _ in 0..count {
                readers.push(load_hold(rdb)?);
            }
            let mut lock = RwLock {
                writer,
                readers,
                fence,
                ..RwLock::default()
            };
            if !valid_rwlock(&lock) {
                return None;
            }
            let saved = lock.deadline();
            cap_holds(&mut lock);
            Some((lock.deadline() != saved, lock))
        };
        match load() {
            Some((lowered, lock)) => {
                // The key's expiry, a `RESTORE` ttl or a capped load's saved
                // one, is put back to the last lease when it lies beyond it.
                if lowered || !restored::loading() {
                    restored::note_loaded(rdb);
                }
                FENCES.observe(lock.fence);
                boxed(lock)
            }
            None => std::ptr::null_mut(),
        }
    })
}

fn save_hold(rdb: *mut raw::RedisModuleIO, hold: &Hold) {
    raw::save_slice(rdb, &hold.owner);
    raw::save_unsigned(rdb, hold.holds);
    raw::save_unsigned(rdb, hold.fence);
    raw::save_signed(rdb, hold.deadline_ms);
}

unsafe extern "C" fn rwlock_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let lock = &*value.cast::<RwLock>();
    raw::save_unsigned(rdb, lock.fence);
    raw::save_unsigned(rdb, u64::from(lock.writer.is_some()));
    if let Some(w) = &lock.writer {
        save_hold(rdb, w);
    }
    raw::save_unsigned(rdb, lock.readers.len() as u64);
    for r in &lock.readers {
        save_hold(rdb, r);
    }
}

unsafe extern "C" fn rwlock_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let lock = &*value.cast::<RwLock>();
    let mut words: Vec<Vec<u8>> = vec![lock.fence.to_string().into_bytes()];
    let tagged = lock
        .writer
        .iter()
        .map(|h| (b"W", h))
        .chain(lock.readers.iter().map(|h| (b"R", h)));
    for (tag, h) in tagged {
        words.push(tag.to_vec());
        words.push(h.owner.clone());
        words.push(h.holds.to_string().into_bytes());
        words.push(h.fence.to_string().into_bytes());
        words.push(h.deadline_ms.to_string().into_bytes());
    }
    emit_aof(aof, c"WARDEN.RWSET", key, &words);
}

/// Writes `cmd key words...` to the AOF being rewritten.
pub(crate) unsafe fn emit_aof(
    aof: *mut raw::RedisModuleIO,
    cmd: &std::ffi::CStr,
    key: *mut raw::RedisModuleString,
    words: &[Vec<u8>],
) {
    let create = raw::RedisModule_CreateString.unwrap();
    let strings: Vec<*mut raw::RedisModuleString> = words
        .iter()
        .map(|w| create(std::ptr::null_mut(), w.as_ptr().cast::<c_char>(), w.len()))
        .collect();
    raw::RedisModule_EmitAOF.unwrap()(
        aof,
        cmd.as_ptr(),
        c"sv".as_ptr(),
        key,
        strings.as_ptr(),
        strings.len(),
    );
    for s in strings {
        raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), s);
    }
}

unsafe extern "C" fn rwlock_mem_usage(value: *const c_void) -> usize {
    (*value.cast::<RwLock>()).memory()
}

unsafe extern "C" fn rwlock_free(value: *mut c_void) {
    release_value::<RwLock>(value, |lock, now| lock.deadline().is_some_and(|d| d < now));
}

unsafe extern "C" fn rwlock_copy(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    // The expiry the copy gets from its source is put back to its last lease.
    restored::note_copied(ctx);
    let mut copy = (*value.cast::<RwLock>()).clone();
    copy.ended.clear();
    copy.changed.clear();
    copy.lapsed_until = None;
    for hold in copy.writer.iter_mut().chain(&mut copy.readers) {
        hold.granted_ms = 0;
    }
    cap_holds(&mut copy);
    boxed(copy)
}

/// The read-write lock type as the `redis_module!` table registers it: the
/// first thing that table does, and so the place to quiet its defrag probe.
/// The table then registers defrag callbacks, of which warden has none, and
/// logs a warning at every load where the server lacks
/// `RedisModule_RegisterDefragCallbacks` (Redis before 8, Valkey): a warning
/// about nothing. With a stand-in that is never called (it is called only
/// for callbacks that exist, and answers an error if it ever were), a normal
/// load logs no warning.
pub struct FirstType(&'static RedisType);

pub static RWLOCK_TYPE_FIRST: FirstType = FirstType(&RWLOCK_TYPE);

impl FirstType {
    pub fn create_data_type(&self, ctx: *mut raw::RedisModuleCtx) -> Result<(), &str> {
        // Safety: written once, on the main thread, while the module loads.
        unsafe {
            let slot = ptr::addr_of_mut!(raw::RedisModule_RegisterDefragCallbacks);
            if slot.read().is_none() {
                slot.write(Some(no_defrag_callbacks));
            }
        }
        self.0.create_data_type(ctx)
    }
}

extern "C" fn no_defrag_callbacks(
    _ctx: *mut raw::RedisModuleCtx,
    _start: raw::RedisModuleDefragFunc,
    _end: raw::RedisModuleDefragFunc,
) -> c_int {
    raw::REDISMODULE_ERR as c_int
}
