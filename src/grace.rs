//! Locks that survive restart and failover: `warden.max-lease` and the grace
//! window.
//!
//! A grant the old master made and this server never heard of (lost by
//! asynchronous replication, or by a restart from an RDB or an `everysec`
//! AOF) cannot outlive `max-lease` from the moment it was made. So after this
//! server starts, or becomes a master, no lock key gets a new holder for
//! `grace` ms: with `grace` ≥ `max-lease` (+ `min-replicas-max-lag`) every
//! lost lease has ended before anyone else is granted its key. Holders in the
//! dataset keep extending and releasing; requests that would make a new hold
//! — a re-entry included: the owner's release may have been lost — are busy
//! (nil, or queued with `WAIT` and served, FIFO, when the window ends).
//! Nothing stretches a lease past `max-lease` either: an expiry or a value
//! from outside warden's own grants is capped ([`capped_expiry`],
//! [`capped_deadline`]).
//!
//! The rules are the pure [`Window`] and [`lease_allowed`]; the rest records
//! when windows open (start, load, promotion) and ends them with a timer.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use redis_module::raw::RedisModuleTimerID;
use redis_module::{raw, Context, ContextFlags};

use crate::config::{GRACE, GRACE_AUTO, MAX_LEASE};
use crate::error;
use crate::events::{self, Listener, Server};
use crate::keyspace::now_ms;
use crate::stats;

/// A grace window: until `end_ms` (exclusive) nobody new is granted a lock
/// (a server that becomes a replica drops its window: it grants nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// 0: no window was ever opened (or it was closed).
    pub end_ms: i64,
}

impl Window {
    /// Opens a window of `grace_ms` from `now_ms`, or lengthens the open one
    /// (never shortens it). True if no window was open before.
    pub fn open(&mut self, now_ms: i64, grace_ms: i64) -> bool {
        if grace_ms <= 0 {
            return false;
        }
        let was_open = self.closed_until(now_ms).is_some();
        self.end_ms = self.end_ms.max(now_ms.saturating_add(grace_ms));
        !was_open
    }

    /// When new holders may be granted again, while the window is open.
    pub fn closed_until(&self, now_ms: i64) -> Option<i64> {
        (now_ms < self.end_ms).then_some(self.end_ms)
    }

    /// Milliseconds left in the window (0 when none is open).
    pub fn remaining(&self, now_ms: i64) -> i64 {
        (self.end_ms - now_ms).max(0)
    }
}

/// Whether a lock may be asked for `ttl_ms` under a cap of `max_lease_ms` (0: no cap).
pub fn lease_allowed(ttl_ms: i64, max_lease_ms: i64) -> bool {
    max_lease_ms == 0 || ttl_ms <= max_lease_ms
}

/// The lease a lock key's expiry `at_ms` gives, when warden last set the
/// lease to end at `known_ms` (0: not known) and `max_lease_ms` caps leases
/// (0: no cap). Without a cap the key's expiry is the lease. With one, an
/// expiry set by anything else may shorten the lease but not lengthen it:
/// never past `known_ms`, or past `max_lease_ms` from now when that is all
/// that is known.
pub fn capped_expiry(at_ms: i64, known_ms: i64, now_ms: i64, max_lease_ms: i64) -> i64 {
    if max_lease_ms == 0 {
        return at_ms;
    }
    let limit = if known_ms > 0 {
        known_ms
    } else {
        now_ms.saturating_add(max_lease_ms)
    };
    at_ms.min(limit)
}

/// A lease deadline read from outside warden's own grants (`RESTORE`, `COPY`,
/// an RDB): at most `max_lease_ms` from now (0: no cap).
pub fn capped_deadline(deadline_ms: i64, now_ms: i64, max_lease_ms: i64) -> i64 {
    if max_lease_ms == 0 {
        return deadline_ms;
    }
    deadline_ms.min(now_ms.saturating_add(max_lease_ms))
}

/// [`capped_expiry`] under the configured `warden.max-lease`.
pub fn cap_expiry(at_ms: i64, known_ms: i64, now_ms: i64) -> i64 {
    capped_expiry(at_ms, known_ms, now_ms, MAX_LEASE.load(Ordering::Relaxed))
}

/// Whether `warden.max-lease` caps leases.
pub fn capping() -> bool {
    MAX_LEASE.load(Ordering::Relaxed) > 0
}

/// [`capped_deadline`] under the configured `warden.max-lease`.
pub fn cap_deadline(deadline_ms: i64, now_ms: i64) -> i64 {
    capped_deadline(deadline_ms, now_ms, MAX_LEASE.load(Ordering::Relaxed))
}

/// The window of this server (its end, read by `INFO` too).
static END_MS: AtomicI64 = AtomicI64::new(0);

/// When the last window opened (0: none, or it closed showing nothing was
/// lost): a rate limiter admits nothing a lost admission made up to then
/// may have used (`crate::rate`).
static OPENED_MS: AtomicI64 = AtomicI64::new(0);

/// The time up to which admissions this server does not know of may have
/// been made (a restart, a promotion), while that matters: rate limiters
/// start empty from it. `None`: nothing was lost, or no window opened.
pub fn lost_until() -> Option<i64> {
    match OPENED_MS.load(Ordering::Relaxed) {
        0 => None,
        at => Some(at),
    }
}

thread_local! {
    /// The timer that ends the window, while one is armed.
    static TIMER: Cell<Option<RedisModuleTimerID>> = const { Cell::new(None) };
    /// From module load until the event loop first runs: a load now is the
    /// server's own start, not a `DEBUG RELOAD` or a replica's sync.
    static STARTING: Cell<bool> = const { Cell::new(false) };
}

fn window() -> Window {
    Window {
        end_ms: END_MS.load(Ordering::Relaxed),
    }
}

/// While the window is open: when it ends. `None`: new holders may be granted.
pub fn closed_until(now_ms: i64) -> Option<i64> {
    window().closed_until(now_ms)
}

/// `ERR ttl exceeds warden.max-lease` for a grant or extend asking for more.
pub fn check_lease(ttl_ms: i64) -> Result<(), String> {
    let max_lease_ms = MAX_LEASE.load(Ordering::Relaxed);
    if lease_allowed(ttl_ms, max_lease_ms) {
        Ok(())
    } else {
        Err(error::ttl_above_max_lease(max_lease_ms))
    }
}

/// A lock's arguments refused by the parser, the ttl's range as the server
/// accepts it now: under `warden.max-lease` it ends at the cap (the parser,
/// pure, knows only its own limit).
pub fn argument_error(text: impl Into<String>) -> redis_module::RedisError {
    let text = text.into();
    let max_lease_ms = MAX_LEASE.load(Ordering::Relaxed);
    if max_lease_ms != 0 && text == error::INVALID_TTL {
        return redis_module::RedisError::String(error::invalid_ttl(max_lease_ms));
    }
    redis_module::RedisError::String(text)
}

/// For `INFO warden`.
pub fn remaining_ms() -> i64 {
    window().remaining(now_ms())
}

fn is_replica(ctx: &Context) -> bool {
    ctx.get_flags().contains(ContextFlags::SLAVE)
}

/// The window's length: `warden.grace` ms, or with `auto` `max-lease` +
/// `min-replicas-max-lag` + 1 s (the README's rule, with a second to spare).
fn grace_ms(ctx: &Context) -> i64 {
    if !GRACE_AUTO.load(Ordering::Relaxed) {
        return GRACE.load(Ordering::Relaxed);
    }
    let lag_s = crate::roster::config_get(ctx, "min-replicas-max-lag")
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(10);
    MAX_LEASE
        .load(Ordering::Relaxed)
        .saturating_add(lag_s.saturating_mul(1000))
        .saturating_add(1000)
}

/// Ends an open window now (`grace auto` showed nothing was lost).
fn close(ctx: &Context) {
    OPENED_MS.store(0, Ordering::Relaxed);
    if END_MS.swap(0, Ordering::Relaxed) != 0 {
        ctx.log_notice("grace window ends: locks are granted again");
        crate::waiters::mark_all_dirty(ctx.ctx);
    }
}

/// Opens (or lengthens) the window for `warden.grace` ms, saying why in the log.
fn open(ctx: &Context, why: &str) {
    let grace = grace_ms(ctx);
    let now = now_ms();
    let mut w = window();
    let opened = w.open(now, grace);
    if grace > 0 {
        OPENED_MS.store(now, Ordering::Relaxed);
    }
    if w.end_ms == END_MS.load(Ordering::Relaxed) {
        return;
    }
    END_MS.store(w.end_ms, Ordering::Relaxed);
    if opened {
        stats::GRACE_WINDOWS.add(1);
    }
    // Logged through the module's context: Redis prefixes the line `<warden>`.
    ctx.log_notice(&format!(
        "grace window {} ({why}): no lock gets a new holder for {} ms",
        if opened { "opens" } else { "restarts" },
        w.end_ms - now
    ));
    let max_lease = MAX_LEASE.load(Ordering::Relaxed);
    if !GRACE_AUTO.load(Ordering::Relaxed) && (max_lease == 0 || max_lease > grace) {
        ctx.log_warning(&format!(
            "warden.grace ({grace} ms) is below warden.max-lease ({}): a lease \
             lost with the old master may outlive the window",
            if max_lease == 0 {
                "no cap".to_string()
            } else {
                format!("{max_lease} ms")
            }
        ));
    }
    arm(ctx, w.end_ms - now);
}

fn arm(ctx: &Context, delay_ms: i64) {
    if TIMER.get().is_some() {
        return;
    }
    let delay = Duration::from_millis(delay_ms.max(1) as u64);
    TIMER.set(Some(ctx.create_timer(delay, on_window_end, ())));
}

fn on_window_end(ctx: &Context, _: ()) {
    crate::guard::callback((), || {
        TIMER.set(None);
        let now = now_ms();
        if let Some(end) = closed_until(now) {
            arm(ctx, end - now); // lengthened since the timer was armed
            return;
        }
        if END_MS.swap(0, Ordering::Relaxed) == 0 {
            return; // closed already (became a replica)
        }
        ctx.log_notice("grace window ends: locks are granted again");
        crate::waiters::mark_all_dirty(ctx.ctx);
    })
}

/// At module load: a server that starts as a master opens a window at once
/// (with or without a file to load: a server restarted without persistence
/// lost every grant), and again when its data has loaded.
pub fn on_module_load(ctx: &Context) {
    STARTING.set(true);
    // The first timer runs once the event loop does, after loading from disk.
    ctx.create_timer(
        Duration::ZERO,
        |ctx, ()| {
            STARTING.set(false);
            // What `grace auto`'s next restart reads back from the AOF.
            crate::roster::mark_durability(ctx);
        },
        (),
    );
    if !is_replica(ctx) {
        open(ctx, "server started");
    }
}

/// The end of loading: the server's own start from an RDB or AOF (not a
/// replica's sync, not `DEBUG RELOAD`) counts the window from now.
fn on_loaded(ctx: &Context) {
    if STARTING.get() && !is_replica(ctx) {
        if GRACE_AUTO.load(Ordering::Relaxed) && crate::roster::restart_lost_nothing(ctx) {
            close(ctx);
        } else {
            open(ctx, "data loaded from disk");
        }
    }
}

/// A change of role: a new master opens a window (with `auto`, only where a
/// grant it does not have may have been answered); a replica needs none.
fn on_role_change(ctx: &Context, master: bool) {
    crate::roster::stop_watching();
    if master {
        use crate::roster::Promotion;
        let promotion = if GRACE_AUTO.load(Ordering::Relaxed) {
            crate::roster::promotion(ctx)
        } else {
            Promotion::MayHaveLost
        };
        if promotion != Promotion::LostNothing {
            open(ctx, "became master");
        }
        if promotion == Promotion::Watch {
            watch_resyncs(ctx);
        }
    } else {
        OPENED_MS.store(0, Ordering::Relaxed);
        if END_MS.swap(0, Ordering::Relaxed) != 0 {
            ctx.log_notice("grace window ends: this server is now a replica");
        }
    }
    crate::roster::reset();
}

/// Every 20 ms while a promotion's window is open: ends it once a resync
/// shows nothing was lost (`crate::roster::resynced`).
fn watch_resyncs(ctx: &Context) {
    ctx.create_timer(Duration::from_millis(20), on_watch, ());
}

fn on_watch(ctx: &Context, _: ()) {
    crate::guard::callback((), || {
        if is_replica(ctx) || closed_until(now_ms()).is_none() {
            crate::roster::stop_watching();
            return;
        }
        if crate::roster::resynced(ctx) {
            crate::roster::stop_watching();
            close(ctx);
        } else {
            watch_resyncs(ctx);
        }
    })
}

fn on_server(ctx: *mut raw::RedisModuleCtx, event: &Server) {
    match event {
        Server::LoadingAof if STARTING.get() => crate::roster::loading_aof(),
        Server::LoadingSync => crate::roster::full_sync_started(&Context::new(ctx)),
        Server::Loaded => on_loaded(&Context::new(ctx)),
        Server::Role { master } => on_role_change(&Context::new(ctx), *master),
        _ => {}
    }
}

/// What opens and closes windows: the end of a load, a change of role.
pub static EVENTS: Listener = Listener {
    key: events::ignore_key,
    server: on_server,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_window_before_one_opens() {
        let w = Window::default();
        assert_eq!(w.closed_until(1_000), None);
        assert_eq!(w.remaining(1_000), 0);
    }

    #[test]
    fn a_window_refuses_new_holders_until_its_end() {
        let mut w = Window::default();
        assert!(w.open(1_000, 5_000));
        assert_eq!(w.closed_until(1_000), Some(6_000));
        assert_eq!(w.closed_until(5_999), Some(6_000));
        assert_eq!(w.closed_until(6_000), None);
        assert_eq!(w.remaining(2_500), 3_500);
        assert_eq!(w.remaining(7_000), 0);
    }

    #[test]
    fn grace_zero_opens_nothing() {
        let mut w = Window::default();
        assert!(!w.open(1_000, 0));
        assert_eq!(w.closed_until(1_000), None);
    }

    #[test]
    fn reopening_lengthens_and_never_shortens() {
        let mut w = Window::default();
        assert!(w.open(1_000, 5_000));
        assert!(!w.open(3_000, 5_000), "still open: the same window");
        assert_eq!(w.closed_until(3_000), Some(8_000));
        assert!(!w.open(4_000, 1_000));
        assert_eq!(w.closed_until(4_000), Some(8_000));
    }

    #[test]
    fn a_window_after_the_last_one_ended_is_a_new_one() {
        let mut w = Window::default();
        w.open(1_000, 1_000);
        assert!(w.open(2_000, 1_000));
        assert_eq!(w.closed_until(2_000), Some(3_000));
    }

    #[test]
    fn an_outside_expiry_shortens_a_lease_but_never_lengthens_it_under_a_cap() {
        let cases = [
            // (key expiry, lease warden set, cap, lease)
            (5_000, 3_000, 0, 5_000),
            (5_000, 3_000, 2_000, 3_000),
            (2_500, 3_000, 2_000, 2_500),
            (3_600_000, 0, 2_000, 3_000),
            (2_500, 0, 2_000, 2_500),
        ];
        for (at, known, cap, lease) in cases {
            assert_eq!(
                capped_expiry(at, known, 1_000, cap),
                lease,
                "{at} {known} {cap}"
            );
        }
        assert_eq!(capped_deadline(3_601_000, 1_000, 2_000), 3_000);
        assert_eq!(capped_deadline(2_500, 1_000, 2_000), 2_500);
        assert_eq!(capped_deadline(3_601_000, 1_000, 0), 3_601_000);
    }

    #[test]
    fn max_lease_caps_asked_ttls_only_when_set() {
        assert!(lease_allowed(1 << 46, 0));
        assert!(lease_allowed(30_000, 30_000));
        assert!(!lease_allowed(30_001, 30_000));
    }
}
