//! What warden hears of the server: keyspace notifications and server events,
//! subscribed here and handed to every part that listens, in the order
//! `lib.rs` gives. Redis keeps one callback per module and server event (a
//! second subscription replaces the first), so nothing else subscribes to
//! these events; and the waiting core needs to know no kind that uses it.
//!
//! What a subscription costs the rest of the server decides what is heard:
//! - no keyspace class that ordinary writes raise (Redis builds a context and
//!   calls the subscriber on every such write, before it even checks
//!   `notify-keyspace-events`): the lock kinds hear of their own keys through
//!   their types' `unlink` callback, the cache through its command filter
//!   (`cache/filter.rs`), only while it has leases;
//! - `evicted` only, and only once the server can evict (a server without a
//!   memory limit never raises it);
//! - the server events that must be heard always (flushes, `SWAPDB`, loads,
//!   role changes, and on Valkey 9 atomic slot migrations), and client disconnects only while cache leases exist:
//!   every server-event subscription is walked on each event-loop turn.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::OnceLock;

use redis_module::{raw, Context};

use crate::guard;

type Ctx = *mut raw::RedisModuleCtx;

/// A server event, as the parts of warden need it.
pub enum Server {
    /// A `FLUSHDB`/`FLUSHALL` ended (`db` -1: every database).
    Flushed { db: c_int },
    /// `SWAPDB first second`.
    Swapped { first: c_int, second: c_int },
    /// Loading a dataset (RDB, AOF, or a full sync from a master) ended.
    Loaded,
    /// Loading an AOF began.
    LoadingAof,
    /// A full sync from this replica's master began loading (its RDB
    /// replaces the dataset; the replication stream before it is gone).
    LoadingSync,
    /// This server became a master (`master`) or a replica.
    Role { master: bool },
    /// A client disconnected.
    ClientGone { id: u64 },
    /// These slots now belong to another node (Valkey's atomic slot
    /// migration finished exporting them); their keys are deleted next.
    SlotsMoved { slots: crate::migration::Slots },
}

/// One listener: what it does on a key's change and on a server event.
pub struct Listener {
    /// A key changed or went away (`event` is Redis' name: `del`, `expired`,
    /// `evicted`, `set`, ...); the selected database is the key's.
    pub key: fn(ctx: Ctx, name: &[u8], event: &CStr),
    pub server: fn(ctx: Ctx, event: &Server),
}

/// For a listener that only hears server events.
pub fn ignore_key(_ctx: Ctx, _name: &[u8], _event: &CStr) {}

static LISTENERS: OnceLock<&'static [&'static Listener]> = OnceLock::new();

/// A context of the module's own, for what runs where Redis gives none
/// (type callbacks, the command filter): timers, filters, subscriptions.
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());
static HEARING_EVICTIONS: AtomicBool = AtomicBool::new(false);
static HEARING_CLIENTS: AtomicBool = AtomicBool::new(false);

pub fn detached() -> Ctx {
    DETACHED.load(Ordering::Relaxed)
}

fn listeners() -> &'static [&'static Listener] {
    LISTENERS.get().copied().unwrap_or(&[])
}

extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let mut len = 0;
        let ptr = raw::string_ptr_len(key, &mut len);
        let name = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        let event = if event.is_null() {
            c""
        } else {
            unsafe { CStr::from_ptr(event) }
        };
        for l in listeners() {
            (l.key)(ctx, name, event);
        }
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_server_event(
    ctx: Ctx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        // Heard only once every module loaded (a dataset loads after them).
        crate::bloom::started();
        let Some(event) = (unsafe { decode(event.id, subevent, data) }) else {
            return;
        };
        for l in listeners() {
            (l.server)(ctx, &event);
        }
    })
}

/// Safety: `data` is what Redis passes with event `id`.
unsafe fn decode(id: u64, subevent: u64, data: *mut c_void) -> Option<Server> {
    match id {
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            let info = data.cast::<raw::RedisModuleFlushInfoV1>();
            let db = unsafe { info.as_ref() }.map_or(-1, |i| i.dbnum);
            Some(Server::Flushed { db })
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            let info = unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() }?;
            Some(Server::Swapped {
                first: info.dbnum_first,
                second: info.dbnum_second,
            })
        }
        raw::REDISMODULE_EVENT_LOADING if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            Some(Server::Loaded)
        }
        raw::REDISMODULE_EVENT_LOADING
            if subevent == raw::REDISMODULE_SUBEVENT_LOADING_AOF_START =>
        {
            Some(Server::LoadingAof)
        }
        raw::REDISMODULE_EVENT_LOADING
            if subevent == raw::REDISMODULE_SUBEVENT_LOADING_REPL_START =>
        {
            Some(Server::LoadingSync)
        }
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => Some(Server::Role {
            master: subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER,
        }),
        raw::REDISMODULE_EVENT_CLIENT_CHANGE
            if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED =>
        {
            let info = unsafe { data.cast::<raw::RedisModuleClientInfo>().as_ref() }?;
            Some(Server::ClientGone { id: info.id })
        }
        crate::migration::EVENT if subevent == crate::migration::EXPORT_COMPLETED => {
            let slots = unsafe { crate::migration::exported(data) }?;
            Some(Server::SlotsMoved { slots })
        }
        _ => None,
    }
}

fn subscribe_server(id: u64, on: bool) -> bool {
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    let callback = if on { Some(on_server_event as _) } else { None };
    let status =
        unsafe { raw::RedisModule_SubscribeToServerEvent.unwrap()(detached(), event, callback) };
    status == raw::REDISMODULE_OK as c_int
}

/// Subscribes to what the listeners must always hear.
pub fn subscribe(ctx: &Context, listeners: &'static [&'static Listener]) -> bool {
    if LISTENERS.set(listeners).is_err() {
        return false;
    }
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx.ctx) };
    DETACHED.store(detached, Ordering::Relaxed);
    [
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
    ]
    .iter()
    .all(|&id| subscribe_server(id, true))
        && (!crate::migration::supported() || subscribe_server(crate::migration::EVENT, true))
}

/// From the first time the server can evict: hear `evicted` (evicted locks
/// keep their keys taken; an evicted cached value ends its lease). A
/// keyspace subscription lasts for the module's life on Redis before 8.2.
pub fn hear_evictions() {
    if HEARING_EVICTIONS.swap(true, Ordering::Relaxed) {
        return;
    }
    unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(
            detached(),
            raw::REDISMODULE_NOTIFY_EVICTED as c_int,
            Some(on_keyspace_event),
        )
    };
}

/// Client disconnects, heard while cache leases exist (a lease ends with its
/// holder's connection). Never called from inside that event's own callback:
/// Redis still reads the subscription after the callback returns.
pub fn hear_clients(on: bool) {
    if HEARING_CLIENTS.swap(on, Ordering::Relaxed) != on {
        subscribe_server(raw::REDISMODULE_EVENT_CLIENT_CHANGE, on);
    }
}

/// Whether client disconnects are heard now (`INFO warden`, tests).
pub fn hearing_clients() -> bool {
    HEARING_CLIENTS.load(Ordering::Relaxed)
}
