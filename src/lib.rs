//! warden: native distributed locks, read-write locks, semaphores, cache
//! leases and Bloom filters for Redis. This file is only the registration table.

mod acks;
#[cfg(not(any(test, fuzzing)))]
mod alloc;
mod args;
mod bloom;
mod cache;
#[macro_use]
mod command;
mod config;
mod contended;
mod datatypes;
mod docs;
mod error;
mod events;
mod evicted;
mod fence;
mod follow;
mod grace;
mod guard;
mod info;
mod keyspace;
mod lock;
mod memory;
mod migration;
mod rate;
mod reply;
mod restored;
mod roster;
mod rwlock;
mod semaphore;
mod stats;
mod waiters;

use redis_module::{redis_module, Context, RedisString, Status};

use crate::bloom::datatype::{BLOOM_TYPE, REDISBLOOM_TYPE};
use crate::command::Command;
use crate::datatypes::RWLOCK_TYPE_FIRST;
use crate::rate::datatype::RATE_TYPE;
use crate::semaphore::datatype::SEM_TYPE;

#[cfg(not(any(test, fuzzing)))]
type Allocator = alloc::RedisAllocator;
#[cfg(not(any(test, fuzzing)))]
const ALLOCATOR: Allocator = alloc::RedisAllocator;
// Unit tests and fuzzers run outside Redis: its allocator does not exist there.
#[cfg(any(test, fuzzing))]
type Allocator = std::alloc::System;
#[cfg(any(test, fuzzing))]
const ALLOCATOR: Allocator = std::alloc::System;

/// The pure decoders and parsers, for the fuzz targets in `fuzz/`.
#[cfg(fuzzing)]
pub mod fuzzing {
    pub use crate::args::exercise as arguments;
    pub use crate::bloom::codec::exercise as bloom_codec;
    pub use crate::bloom::redisbloom::exercise as redisbloom_codec;
}

/// Every command: name, handler, flags. Each takes one key, its first
/// argument, but those declared `keyless`.
const CORE_COMMANDS: &[Command] = &[
    command!("lock.acquire", lock::commands::acquire, "write deny-oom"),
    command!("lock.release", lock::commands::release, "write fast"),
    command!("lock.extend", lock::commands::extend, "write fast"),
    command!("lock.info", lock::commands::info, "readonly fast"),
    command!("warden.lockset", lock::commands::set, "write deny-oom"),
    command!("rwlock.read", rwlock::commands::read, "write deny-oom"),
    command!("rwlock.write", rwlock::commands::write, "write deny-oom"),
    command!("rwlock.unlock", rwlock::commands::unlock, "write fast"),
    command!("rwlock.extend", rwlock::commands::extend, "write fast"),
    command!("rwlock.info", rwlock::commands::info, "readonly fast"),
    command!("warden.rwset", rwlock::commands::set, "write deny-oom"),
    command!(
        "sem.acquire",
        semaphore::commands::acquire,
        "write deny-oom"
    ),
    command!("sem.release", semaphore::commands::release, "write fast"),
    command!("sem.extend", semaphore::commands::extend, "write fast"),
    command!(
        "sem.setlimit",
        semaphore::commands::setlimit,
        "write deny-oom"
    ),
    command!("sem.info", semaphore::commands::info, "readonly fast"),
    command!("warden.semset", semaphore::commands::set, "write deny-oom"),
    command!("rate.acquire", rate::commands::acquire, "write deny-oom"),
    command!("rate.refund", rate::commands::refund, "write fast"),
    command!("rate.config", rate::commands::config, "write deny-oom"),
    command!("rate.info", rate::commands::info, "readonly fast"),
    command!("warden.rateset", rate::commands::set, "write deny-oom"),
    command!("warden.rwhold", rwlock::commands::hold, "write deny-oom"),
    // Its own entry: a plain hit is answered before the command wrapper.
    Command {
        name: "cache.get",
        flags: "write",
        keyed: true,
        run: cache::commands::get_command,
    },
    command!("cache.fill", cache::commands::fill, "write deny-oom"),
    command!("cache.abandon", cache::commands::abandon, "write fast"),
    command!("cache.invalidate", cache::commands::invalidate, "write"),
    command!("cache.info", cache::commands::info, "readonly fast"),
    command!("cache.peek", cache::commands::peek, "readonly fast"),
    command!("warden.syncstate", roster::syncstate, "write", keyless),
    command!(
        "warden.contended",
        contended::contended,
        "readonly",
        keyless
    ),
    command!("warden.withdraw", contended::withdraw, "readonly fast"),
];

/// The Bloom commands: left out when another module serves `BF.*`.
const BLOOM_COMMANDS: &[Command] = &[
    command!("bf.reserve", bloom::commands::reserve, "write deny-oom"),
    command!("bf.add", bloom::commands::add, "write deny-oom"),
    command!("bf.madd", bloom::commands::madd, "write deny-oom"),
    command!("bf.insert", bloom::commands::insert, "write deny-oom"),
    command!("bf.exists", bloom::commands::exists, "readonly fast"),
    command!("bf.mexists", bloom::commands::mexists, "readonly fast"),
    command!("bf.info", bloom::commands::info, "readonly fast"),
    command!("bf.card", bloom::commands::card, "readonly fast"),
    command!("bf.debug", bloom::commands::debug, "readonly fast"),
    command!("bf.scandump", bloom::commands::scandump, "readonly"),
    command!("bf.loadchunk", bloom::commands::loadchunk, "write deny-oom"),
];

/// `GCRA`: registered where the server has no such command (Redis 8.8+
/// builds with it) and `gcra-command` is not `no`.
const GCRA_COMMANDS: &[Command] = &[command!(
    "gcra",
    rate::commands::gcra,
    "write deny-oom fast"
)];

/// Who hears keyspace and server events, in this order: eviction tombstones
/// are recorded, and cache leases revoked, before waiters are served.
const LISTENERS: &[&events::Listener] = &[
    &evicted::EVENTS,
    &cache::commands::EVENTS,
    &keyspace::EVENTS,
    &grace::EVENTS,
    &restored::EVENTS,
    &waiters::EVENTS,
];

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    guard::install_panic_hook();
    migration::set_options(ctx);
    // Configuration first: `bf-commands` decides which commands exist.
    let ready = config::register(ctx, args)
        && datatypes::register_lock_type(ctx)
        && command::register(ctx, CORE_COMMANDS)
        && docs::register(ctx, CORE_COMMANDS)
        && (!bloom::commands_wanted(ctx, config::bf_commands())
            || REDISBLOOM_TYPE.create_data_type(ctx.ctx).is_ok()
                && command::register(ctx, BLOOM_COMMANDS)
                && docs::register(ctx, BLOOM_COMMANDS))
        && (!rate::commands::gcra_wanted(ctx, config::gcra_command())
            || command::register(ctx, GCRA_COMMANDS) && docs::register(ctx, GCRA_COMMANDS))
        && waiters::init()
        && restored::init()
        && events::subscribe(ctx, LISTENERS)
        && keyspace::watch_listeners(ctx)
        && evicted::watch_policy(ctx)
        && cache::filter::read_catalogue_at_load(ctx)
        && follow::read_names_at_load(ctx)
        && info::register(ctx.ctx);
    if ready {
        bloom::loaded();
        info::log_loaded(ctx);
        grace::on_module_load(ctx);
        Status::Ok
    } else {
        Status::Err
    }
}

// `MBbloom--` (RedisBloom's type, for its filters) is registered in `init`,
// and only when warden serves `BF.*`: with RedisBloom loaded, it is its own.
// `warden-lk` too: which aux callback it gets depends on the server.
redis_module! {
    name: "warden",
    version: info::VERSION_NUMBER,
    allocator: (Allocator, ALLOCATOR),
    data_types: [RWLOCK_TYPE_FIRST, BLOOM_TYPE, SEM_TYPE, RATE_TYPE],
    init: init,
}
