//! What warden hears of the server: keyspace notifications and server events,
//! subscribed once here and handed to every part that listens, in the order
//! `lib.rs` gives. Redis keeps one callback per module and server event (a
//! second subscription replaces the first), so nothing else subscribes to
//! these events; and the waiting core needs to know no kind that uses it.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
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
    /// This server became a master (`master`) or a replica.
    Role { master: bool },
    /// A client disconnected.
    ClientGone { id: u64 },
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
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => Some(Server::Role {
            master: subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER,
        }),
        raw::REDISMODULE_EVENT_CLIENT_CHANGE
            if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED =>
        {
            let info = unsafe { data.cast::<raw::RedisModuleClientInfo>().as_ref() }?;
            Some(Server::ClientGone { id: info.id })
        }
        _ => None,
    }
}

/// Subscribes once to everything the listeners hear.
pub fn subscribe(ctx: &Context, listeners: &'static [&'static Listener]) -> bool {
    if LISTENERS.set(listeners).is_err() {
        return false;
    }
    let classes = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_STRING
        | raw::REDISMODULE_NOTIFY_LIST
        | raw::REDISMODULE_NOTIFY_SET
        | raw::REDISMODULE_NOTIFY_HASH
        | raw::REDISMODULE_NOTIFY_ZSET
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED
        | raw::REDISMODULE_NOTIFY_STREAM
        | raw::REDISMODULE_NOTIFY_LOADED;
    // Not the module class: warden's own events never free a key, and hearing
    // them would cost every command a callback.
    let ok = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(
            ctx.ctx,
            classes as c_int,
            Some(on_keyspace_event),
        )
    } == raw::REDISMODULE_OK as c_int;
    let server_events = [
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE,
    ];
    server_events.iter().fold(ok, |ok, &id| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        ok && unsafe {
            raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(on_server_event))
        } == raw::REDISMODULE_OK as c_int
    })
}
