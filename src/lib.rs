//! warden: native distributed locks, read-write locks and Bloom filters for
//! Redis. This file is only the registration table.

mod args;
mod bloom;
mod config;
mod datatypes;
mod error;
mod fence;
mod guard;
mod info;
mod keyspace;
mod lock;
mod reply;
mod rwlock;
mod stats;
mod waiters;

use redis_module::{redis_module, Context, RedisString, Status};

use crate::datatypes::{BLOOM_TYPE, LOCK_TYPE, RWLOCK_TYPE};

#[cfg(not(test))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
// Unit tests run outside Redis: its allocator does not exist there.
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

/// Wraps a handler in the panic guard.
macro_rules! guarded {
    ($handler:path) => {
        |ctx: &Context, args: Vec<RedisString>| guard::command(ctx, args, $handler)
    };
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    guard::install_panic_hook();
    ctx.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
    if config::register(ctx, args) && waiters::subscribe(ctx) && info::register(ctx.ctx) {
        Status::Ok
    } else {
        Status::Err
    }
}

redis_module! {
    name: "warden",
    version: 1,
    allocator: (Allocator, ALLOCATOR),
    data_types: [LOCK_TYPE, RWLOCK_TYPE, BLOOM_TYPE],
    init: init,
    commands: [
        ["lock.acquire", guarded!(lock::commands::acquire), "write deny-oom", 1, 1, 1, ""],
        ["lock.release", guarded!(lock::commands::release), "write fast", 1, 1, 1, ""],
        ["lock.extend", guarded!(lock::commands::extend), "write fast", 1, 1, 1, ""],
        ["lock.info", guarded!(lock::commands::info), "readonly fast", 1, 1, 1, ""],
        ["warden.lockset", guarded!(lock::commands::set), "write deny-oom", 1, 1, 1, ""],
        ["rwlock.read", guarded!(rwlock::commands::read), "write deny-oom", 1, 1, 1, ""],
        ["rwlock.write", guarded!(rwlock::commands::write), "write deny-oom", 1, 1, 1, ""],
        ["rwlock.unlock", guarded!(rwlock::commands::unlock), "write fast", 1, 1, 1, ""],
        ["rwlock.extend", guarded!(rwlock::commands::extend), "write fast", 1, 1, 1, ""],
        ["rwlock.info", guarded!(rwlock::commands::info), "readonly fast", 1, 1, 1, ""],
        ["warden.rwset", guarded!(rwlock::commands::set), "write deny-oom", 1, 1, 1, ""],
        ["bf.reserve", guarded!(bloom::commands::reserve), "write deny-oom", 1, 1, 1, ""],
        ["bf.add", guarded!(bloom::commands::add), "write deny-oom", 1, 1, 1, ""],
        ["bf.madd", guarded!(bloom::commands::madd), "write deny-oom", 1, 1, 1, ""],
        ["bf.insert", guarded!(bloom::commands::insert), "write deny-oom", 1, 1, 1, ""],
        ["bf.exists", guarded!(bloom::commands::exists), "readonly fast", 1, 1, 1, ""],
        ["bf.mexists", guarded!(bloom::commands::mexists), "readonly fast", 1, 1, 1, ""],
        ["bf.info", guarded!(bloom::commands::info), "readonly fast", 1, 1, 1, ""],
        ["bf.card", guarded!(bloom::commands::card), "readonly fast", 1, 1, 1, ""],
        ["bf.scandump", guarded!(bloom::commands::scandump), "readonly", 1, 1, 1, ""],
        ["bf.loadchunk", guarded!(bloom::commands::loadchunk), "write deny-oom", 1, 1, 1, ""],
    ],
}
