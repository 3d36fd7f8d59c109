//! Keys holding warden values: open, type-check, read and write values and
//! absolute expiries. One of the few homes of raw FFI.
//!
//! Invariants: a `Key` closes its handle exactly once (on drop); values are
//! boxed Rust objects owned by Redis once set, freed by the type's `free`.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, ContextFlags, RedisError};

use crate::command::Arg;

use crate::error;
use crate::events::{self, Listener, Server};

/// Absolute unix time in milliseconds, as Redis' clock reads it.
pub fn now_ms() -> i64 {
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}

/// An open key. Empty keys are represented too (a write handle to an empty key).
pub struct Key {
    inner: *mut raw::RedisModuleKey,
    /// The context and name it was opened with, and whether for writing:
    /// what an expiry put back needs to reach replicas and the AOF.
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    writable: bool,
}

impl Key {
    /// Opens `name` for reading and writing.
    pub fn write(ctx: &Context, name: &Arg) -> Self {
        Self::open(
            ctx.ctx,
            name.raw(),
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        )
    }

    /// Opens `name` for reading and writing where Redis gives no command
    /// context (a timer's); `name` must outlive the key.
    pub fn write_raw(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString) -> Self {
        Self::open(ctx, name, raw::REDISMODULE_READ | raw::REDISMODULE_WRITE)
    }

    /// Opens `name` for reading only (a missing key stays missing).
    pub fn read(ctx: &Context, name: &Arg) -> Self {
        Self::open(ctx.ctx, name.raw(), raw::REDISMODULE_READ)
    }

    fn open(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString, mode: u32) -> Self {
        let inner = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode as c_int) }
            .cast::<raw::RedisModuleKey>();
        Self {
            inner,
            ctx,
            name,
            writable: mode & raw::REDISMODULE_WRITE != 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_null()
            || unsafe { raw::RedisModule_KeyType.unwrap()(self.inner) }
                == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The value if the key holds `ty`, `None` if the key is empty,
    /// `Err(WRONGTYPE)` if it holds anything else.
    #[allow(clippy::mut_from_ref)]
    pub fn value<T>(&self, ty: &RedisType) -> Result<Option<&mut T>, &'static str> {
        self.value_of_any(&[ty])
    }

    /// The value if the key holds one of `types` (all of which hold a `T`).
    #[allow(clippy::mut_from_ref)]
    pub fn value_of_any<T>(&self, types: &[&RedisType]) -> Result<Option<&mut T>, &'static str> {
        if self.is_empty() {
            return Ok(None);
        }
        let actual = unsafe { raw::RedisModule_ModuleTypeGetType.unwrap()(self.inner) };
        if actual.is_null() || !types.iter().any(|ty| actual == *ty.raw_type.borrow()) {
            return Err(error::WRONGTYPE);
        }
        let value = unsafe { raw::RedisModule_ModuleTypeGetValue.unwrap()(self.inner) }.cast::<T>();
        // Safety: a key of these types always holds a boxed `T` (set only by `set_value`).
        Ok(unsafe { value.as_mut() })
    }

    /// Stores `value` in the key, replacing whatever it held (and its expiry).
    pub fn set_value<T>(&self, ty: &RedisType, value: T) {
        let boxed = Box::into_raw(Box::new(value)).cast::<c_void>();
        unsafe {
            raw::RedisModule_ModuleTypeSetValue.unwrap()(self.inner, *ty.raw_type.borrow(), boxed)
        };
    }

    /// The key's string value, `None` if the key is empty, `Err(WRONGTYPE)`
    /// if it holds anything else.
    pub fn string(&self) -> Result<Option<&[u8]>, &'static str> {
        if self.inner.is_null() {
            return Ok(None);
        }
        match unsafe { raw::RedisModule_KeyType.unwrap()(self.inner) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => return Ok(None),
            raw::REDISMODULE_KEYTYPE_STRING => {}
            _ => return Err(error::WRONGTYPE),
        }
        let mut len = 0;
        let ptr = unsafe {
            raw::RedisModule_StringDMA.unwrap()(
                self.inner,
                &mut len,
                raw::REDISMODULE_READ as c_int,
            )
        };
        if ptr.is_null() {
            return Ok(Some(&[]));
        }
        // Safety: the value lives as long as the open key and is not written through it.
        Ok(Some(unsafe {
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        }))
    }

    pub fn delete(&self) {
        if !self.is_empty() {
            unsafe { raw::RedisModule_DeleteKey.unwrap()(self.inner) };
        }
    }

    /// The key's absolute expiry in unix ms, `None` if it has none (or is empty).
    pub fn expire_at(&self) -> Option<i64> {
        if self.is_empty() {
            return None;
        }
        let at = unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.inner) };
        (at >= 0).then_some(at)
    }

    pub fn set_expire_at(&self, at_ms: i64) {
        unsafe { raw::RedisModule_SetAbsExpire.unwrap()(self.inner, at_ms) };
    }

    /// Puts the key's expiry back to its lease end after something else
    /// (`PERSIST`, `PEXPIRE`, `RESTORE`) moved it: on this server and, the
    /// key being open for writing on a master, on replicas and in the AOF,
    /// which saw that command too. A key open for reading is left as it is
    /// (false).
    pub fn restore_expire_at(&self, at_ms: i64) -> bool {
        if !self.writable {
            return false;
        }
        self.set_expire_at(at_ms);
        if LISTENERS.load(Ordering::Relaxed) && !maybe_replica() {
            unsafe {
                raw::RedisModule_Replicate.unwrap()(
                    self.ctx,
                    c"PEXPIREAT".as_ptr(),
                    c"sl".as_ptr(),
                    self.name,
                    at_ms as std::os::raw::c_longlong,
                )
            };
        }
        true
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.inner.is_null() {
            unsafe { raw::RedisModule_CloseKey.unwrap()(self.inner) };
            self.inner = ptr::null_mut();
        }
    }
}

/// Replicas never grant, extend or release: their state comes from the
/// master's effects. Refused like any write on a replica — writable replicas
/// included — unless the command comes from the master or the AOF.
pub fn refuse_on_replica(ctx: &Context) -> Result<(), RedisError> {
    // A master knows it is one without asking (the role is heard as it changes).
    if !maybe_replica() {
        return Ok(());
    }
    let flags = ctx.get_flags();
    if flags.contains(ContextFlags::SLAVE)
        && !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        return Err(RedisError::Str(error::READONLY));
    }
    Ok(())
}

/// Effect commands carry state decided elsewhere; only the master link and
/// the AOF may send them (anyone else could forge a holder or a token).
pub fn effects_only(ctx: &Context) -> Result<(), RedisError> {
    if ctx
        .get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        Ok(())
    } else {
        Err(RedisError::Str(error::EFFECT_FROM_CLIENT))
    }
}

/// Whether an effect could reach anyone: Redis drops propagated commands when
/// there is no AOF, no replica and no replication backlog, but building them
/// (command lookup, argument objects) costs a third of a lock grant. A backlog
/// only appears when a replica syncs, which forks (or this server was a
/// replica); so once a fork or a role change was seen, or the AOF is on, every
/// effect is sent. The AOF is either on at load (effects are sent from the
/// start) or switched on later, which starts a rewrite, which forks: no flags
/// are read per effect.
pub fn effects_needed(ctx: &Context) -> bool {
    let needed = LISTENERS.load(Ordering::Relaxed);
    if needed {
        crate::roster::before_effect(ctx);
    }
    needed
}

static LISTENERS: AtomicBool = AtomicBool::new(false);

/// Whether effects may reach a replica or the AOF (see [`effects_needed`]).
pub fn effects_listened() -> bool {
    LISTENERS.load(Ordering::Relaxed)
}

/// Whether this server is a replica, as the last role change (or the load)
/// said: lets hot paths skip the context-flags call on a master.
static REPLICA: AtomicBool = AtomicBool::new(false);

pub fn maybe_replica() -> bool {
    REPLICA.load(Ordering::Relaxed)
}

/// What may add listeners to the effect stream: a fork (an AOF rewrite, a
/// full sync). A replica comes online only through a full sync, or through a
/// backlog that one made or that this server kept from its time as a replica
/// (its role change is heard). Heard until the first fork, then never again:
/// every server-event subscription is walked on each event-loop turn.
const LISTENER_EVENTS: [u64; 1] = [raw::REDISMODULE_EVENT_FORK_CHILD];

fn subscribe_listener_events(on: bool) -> bool {
    LISTENER_EVENTS.iter().all(|&id| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        let callback = if on {
            Some(on_listener_event as _)
        } else {
            None
        };
        let status = unsafe {
            raw::RedisModule_SubscribeToServerEvent.unwrap()(events::detached(), event, callback)
        };
        status == raw::REDISMODULE_OK as c_int
    })
}

/// Effects are sent from now on; the events that told are no longer heard
/// (from a timer: Redis reads a subscription after its callback returns).
fn listened_to() {
    if !LISTENERS.swap(true, Ordering::Relaxed) && !crate::roster::wants_forks() {
        unsafe {
            raw::RedisModule_CreateTimer.unwrap()(
                events::detached(),
                0,
                Some(on_unsubscribe),
                std::ptr::null_mut(),
            )
        };
    }
}

extern "C" fn on_unsubscribe(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    crate::guard::callback((), || {
        subscribe_listener_events(false);
    })
}

extern "C" fn on_listener_event(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    crate::guard::callback((), || {
        listened_to();
        if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_DIED {
            crate::roster::child_ended(&Context::new(ctx));
        }
    })
}

/// Forks are heard while `warden.grace auto` wants them (an AOF rewrite's
/// end), and until the first one otherwise.
pub fn hear_forks() {
    subscribe_listener_events(true);
}

/// Watches for what may add listeners to the effect stream. At load time a
/// server that already replicates (or is a replica), or has the AOF on,
/// counts as listened to.
pub fn watch_listeners(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    REPLICA.store(flags.contains(ContextFlags::SLAVE), Ordering::Relaxed);
    let replicating = flags.intersects(ContextFlags::SLAVE | ContextFlags::AOF)
        || ctx.call("INFO", &["replication"]).map_or(true, |info| {
            let text = format!("{info:?}");
            !(text.contains("connected_slaves:0") && text.contains("repl_backlog_active:0"))
        });
    if replicating {
        LISTENERS.store(true, Ordering::Relaxed);
        if crate::roster::wants_forks() {
            hear_forks();
        }
        return true;
    }
    // A role change reaches `EVENTS` (through `events`, its one subscriber).
    subscribe_listener_events(true)
}

fn on_server(_ctx: *mut raw::RedisModuleCtx, event: &Server) {
    if let Server::Role { master } = event {
        REPLICA.store(!master, Ordering::Relaxed);
        listened_to();
    }
}

/// A role change may add listeners to the effect stream.
pub static EVENTS: Listener = Listener {
    key: events::ignore_key,
    server: on_server,
};

/// Sends `DEL key` to replicas and the AOF.
pub fn replicate_del(ctx: &Context, key: &Arg) {
    if effects_needed(ctx) {
        unsafe {
            raw::RedisModule_Replicate.unwrap()(ctx.ctx, c"DEL".as_ptr(), c"s".as_ptr(), key.raw())
        };
    }
}

/// Sends `<cmd> key bytes n1 n2 n3` to replicas and the AOF without building
/// intermediate strings (the hot path of every lock grant and release).
pub fn replicate_key_bytes_3(
    ctx: &Context,
    cmd: &CStr,
    key: &Arg,
    bytes: &[u8],
    numbers: [i64; 3],
) {
    if !effects_needed(ctx) {
        return;
    }
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.ctx,
            cmd.as_ptr(),
            c"sblll".as_ptr(),
            key.raw(),
            bytes.as_ptr().cast::<c_char>(),
            bytes.len(),
            numbers[0],
            numbers[1],
            numbers[2],
        )
    };
}

/// Publishes a keyspace event of the module class (`notify-keyspace-events` with `d`).
/// Tells the server that `key` changed though no command wrote it: clients
/// tracking it (`CLIENT TRACKING`) are sent an invalidation and a `WATCH` on
/// it fails.
pub fn signal_modified(ctx: &Context, key: &Arg) {
    unsafe { raw::RedisModule_SignalModifiedKey.unwrap()(ctx.ctx, key.raw()) };
}

pub fn notify(ctx: &Context, event: &CStr, key: &Arg) {
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx.ctx,
            raw::REDISMODULE_NOTIFY_MODULE as c_int,
            event.as_ptr(),
            key.raw(),
        )
    };
}
