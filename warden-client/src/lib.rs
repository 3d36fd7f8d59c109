//! A Rust client for warden's server-side locks, read-write locks,
//! semaphores and cache leases, on redis-rs and tokio.
//!
//! - [`Warden::lock`], [`Warden::read_lock`], [`Warden::write_lock`]: a
//!   [`LockGuard`] with its fencing token, released by
//!   [`LockGuard::release`] or in the background when dropped, with an
//!   optional watchdog that renews the lease and reports a lost lock.
//! - [`Warden::semaphore`]: at most N permits held at once, each
//!   [`SemaphoreGuard`] with its own lease and fencing token.
//! - [`Redlock`]: one lock over N independent servers.
//! - [`Warden::cache`]: [`Cache::get_or_load`], one load per key however
//!   many callers miss at once.
//!
//! # Connections
//!
//! A [`Warden`] is built from a [`redis::Client`] ([`Warden::new`],
//! [`Warden::open`]), a cluster client ([`Warden::cluster`]), or the
//! application's `ConnectionManager` ([`Warden::with_manager`]), and opens
//! connections itself:
//!
//! - one shared connection for every command that answers at once
//!   (release, extend, the watchdog's renewals, and the first try of every
//!   acquire: free capacity is granted in one round trip there);
//! - a dedicated connection for each request that waits server-side (an
//!   acquire whose try found the key busy, sent again with `WAIT`;
//!   `CACHE.GET … WAIT` and the fill or abandon that follows it on the same
//!   connection, as a cache lease ends with its connection). A blocked
//!   request therefore never delays other commands. Dedicated connections
//!   are opened as needed (no pool limit to raise for many waiters) and
//!   reused through a small idle pool ([`Config::idle_connections`]) once
//!   their reply has come in.
//!
//! # Deadlines and overload
//!
//! A wait (`.wait(timeout)`) is a deadline measured from the call: the
//! `WAIT` sent is what remains of it at that moment, less a margin for the
//! reply's way back (a tenth, 1 to 5 ms), and getting a connection counts
//! against it. The server never grants a waiter past its `WAIT`; a grant
//! whose reply still reaches the client after the deadline is given back and
//! the call answers `None`. A request that is cancelled (its future dropped,
//! e.g. by `tokio::time::timeout`) leaves the server's queue at once:
//! `WARDEN.WITHDRAW key owner` (the connection is kept for the next wait);
//! where that is refused, `CLIENT UNBLOCK` of its connection where the
//! server ends a wait that way (Redis 7.4+, Valkey 8+), else the connection
//! is closed; a lock or semaphore grant that was already on
//! its way is given back in the background ([`LockRequest::acquire`]).
//! `.max_queue(n)` sheds load at the door: with `n` requests already waiting
//! on the key, the acquire answers `None` at once (`QUEUE n`).
//!
//! No request is ever sent twice: when a connection breaks, the request on it
//! fails with [`Error::Connection`] (the server may or may not have run it).
//!
//! TLS is redis-rs': enable this crate's `tls-rustls` (or `tls-native-tls`)
//! feature and use `rediss://` URLs or a TLS cluster client.
//!
//! # Owners and leases
//!
//! Every acquire is its own owner (a fresh UUID): futures joined in one task
//! never share a hold. Re-entrancy is on request only
//! ([`LockRequest::reentrant`]). A guard's lease is dated from the moment its
//! request was sent, and the guard counts as lost a safety margin
//! ([`Config::margin`]) before that lease ends, so [`LockGuard::is_lost`] turns
//! true while the server still holds the lock for it.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use warden_client::Warden;
//!
//! # async fn run() -> warden_client::Result<()> {
//! let warden = Warden::open("redis://127.0.0.1/")?;
//! if let Some(guard) = warden
//!     .lock("order:42")
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(5))
//!     .watchdog(true)
//!     .acquire()
//!     .await?
//! {
//!     let fence = guard.token(); // hand it to the store, which refuses lower ones
//!     # let _ = fence;
//!     tokio::select! {
//!         _ = guard.lost() => { /* stop: the lock is no longer ours */ }
//!         _ = tokio::time::sleep(Duration::from_secs(1)) => {}
//!     }
//!     guard.release().await?;
//! }
//! # Ok(())
//! # }
//! ```

mod backend;
pub mod blocking;
mod cache;
mod deadline;
mod error;
mod hold;
mod lease;
mod lock;
mod near;
mod owner;
mod rate;
mod redlock;
mod semaphore;

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue};

pub use cache::Cache;
pub use error::{Error, LoaderError, Result};
pub use lock::{LockGuard, LockKind, LockRequest, Release};
pub use near::{NearCache, NearConfig, NearStats};
pub use rate::{RateDecision, RateInfo, RateLimiter};
pub use redlock::{Redlock, RedlockGuard};
pub use semaphore::{Semaphore, SemaphoreGuard, SemaphoreInfo};

use backend::{Backend, Link, Pool};

/// Client-side limits and the lease safety margin. Made with
/// [`Config::builder`] (or [`Config::default`]).
///
/// ```
/// use std::time::Duration;
/// let config = warden_client::Config::builder()
///     .command_timeout(Duration::from_secs(2))
///     .timer_slack(Duration::from_millis(100))
///     .build();
/// assert_eq!(config.margin(Duration::from_secs(10)), Duration::from_millis(200));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Longest wait to open a connection (default 1 s).
    pub connect_timeout: Duration,
    /// Longest wait for a reply to a command that answers at once; waiting
    /// requests get their `WAIT` plus this (default 5 s).
    pub command_timeout: Duration,
    /// Idle dedicated connections kept for waiting requests (default 8);
    /// more are opened while more requests wait, and closed after.
    pub idle_connections: usize,
    /// How late a timer or a task may run on a busy runtime: part of the
    /// safety margin (default 50 ms).
    pub timer_slack: Duration,
    /// The bound on how much this client's clock and the server's may drift
    /// apart over a lease, as a fraction of the ttl: part of the safety
    /// margin (default 0.01, i.e. 1 %, far above a quartz clock's 0.01 %).
    pub clock_drift: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_secs(5),
            idle_connections: 8,
            timer_slack: Duration::from_millis(50),
            clock_drift: 0.01,
        }
    }
}

impl Config {
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder(Config::default())
    }

    /// How long before the end of a `ttl` lease the guard counts as lost:
    /// `timer_slack + ttl × clock_drift`.
    pub fn margin(&self, ttl: Duration) -> Duration {
        self.timer_slack + ttl.mul_f64(self.clock_drift.clamp(0.0, 1.0))
    }
}

/// Builds a [`Config`]; every setting starts at its default.
#[derive(Clone, Debug)]
#[must_use]
pub struct ConfigBuilder(Config);

impl ConfigBuilder {
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.0.connect_timeout = timeout;
        self
    }

    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.0.command_timeout = timeout;
        self
    }

    pub fn idle_connections(mut self, n: usize) -> Self {
        self.0.idle_connections = n;
        self
    }

    pub fn timer_slack(mut self, slack: Duration) -> Self {
        self.0.timer_slack = slack;
        self
    }

    /// The clock-drift bound as a fraction of the ttl (0.01 = 1 %).
    pub fn clock_drift(mut self, fraction: f64) -> Self {
        self.0.clock_drift = fraction;
        self
    }

    pub fn build(self) -> Config {
        self.0
    }
}

/// A handle on one warden deployment — a server or a Redis Cluster; cheap to
/// clone (clones share connections).
#[derive(Clone)]
pub struct Warden {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    config: Config,
    pool: Pool,
    /// The server's `warden.max-lease` in ms as learnt from its refusals (0:
    /// none learnt): grants and renewals ask for at most this.
    max_lease_ms: std::sync::atomic::AtomicU64,
    /// Set once the server refused `WARDEN.WITHDRAW` (a module before
    /// 1.1.0, an ACL): cancelled waits go out by `CLIENT UNBLOCK` or a kill.
    no_withdraw: std::sync::atomic::AtomicBool,
    /// Whether `CLIENT UNBLOCK` ends a module's wait here (Redis 7.4+,
    /// Valkey 8+), learnt once from `INFO server`: 0 unknown, 1 yes, 2 no.
    unblock_works: std::sync::atomic::AtomicU8,
}

impl Warden {
    fn build(backend: Backend, config: Config) -> Self {
        Warden {
            inner: Arc::new(Inner {
                pool: Pool::new(config.idle_connections),
                backend,
                config,
                max_lease_ms: std::sync::atomic::AtomicU64::new(0),
                no_withdraw: std::sync::atomic::AtomicBool::new(false),
                unblock_works: std::sync::atomic::AtomicU8::new(0),
            }),
        }
    }

    /// A client for `url` (`redis://host:port/db`, `redis+unix:///path`,
    /// `rediss://` with a TLS feature). Connects lazily, on the first command.
    pub fn open(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(Error::from_redis)?;
        Ok(Self::new(client))
    }

    /// Over a server reached through `client`.
    pub fn new(client: redis::Client) -> Self {
        Self::build(Backend::client(client), Config::default())
    }

    /// Over a Redis Cluster: commands that answer at once go through one
    /// cluster connection, each waiting request through its own.
    pub fn cluster(client: redis::cluster::ClusterClient) -> Self {
        Self::build(Backend::cluster(client), Config::default())
    }

    /// Over the application's own `ConnectionManager` for every command that
    /// answers at once; `client` (the one the manager came from) opens the
    /// dedicated connections that waiting requests need, since a request
    /// blocked server-side would hold up everything behind it on a shared
    /// connection.
    pub fn with_manager(manager: redis::aio::ConnectionManager, client: redis::Client) -> Self {
        Self::build(Backend::manager(manager, client), Config::default())
    }

    /// The same servers with `config`; connections are not shared with `self`.
    pub fn with_config(self, config: Config) -> Self {
        Self::build(self.inner.backend.fresh(), config)
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// A new unique owner id, for [`LockRequest::reentrant`].
    pub fn new_owner() -> String {
        owner::fresh()
    }

    /// An exclusive lock on `key` (`LOCK.*`).
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), LockKind::Exclusive, key.into())
    }

    /// A shared (read) hold of a read-write lock (`RWLOCK.READ`).
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), LockKind::Read, key.into())
    }

    /// The exclusive (write) hold of a read-write lock (`RWLOCK.WRITE`).
    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), LockKind::Write, key.into())
    }

    /// A semaphore on `key` with room for `limit` permits at once (`SEM.*`).
    pub fn semaphore(&self, key: impl Into<String>, limit: u32) -> Semaphore {
        Semaphore::new(self.clone(), key.into(), limit)
    }

    /// A rate limiter on `key`: `count` tokens every `period` (`RATE.*`).
    pub fn rate_limiter(
        &self,
        key: impl Into<String>,
        count: u64,
        period: Duration,
    ) -> RateLimiter {
        RateLimiter::new(self.clone(), key.into(), count, period)
    }

    /// Cache reads through `CACHE.GET` leases, with default options.
    pub fn cache(&self) -> Cache {
        Cache::new(self.clone())
    }

    /// The plain server's client (`None` for a Cluster client).
    pub(crate) fn plain_client(&self) -> Option<&redis::Client> {
        self.inner.backend.plain_client()
    }

    /// `ttl`, or the server's lease cap when one was learnt and is shorter.
    pub(crate) fn capped(&self, ttl: Duration) -> Duration {
        match self
            .inner
            .max_lease_ms
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => ttl,
            cap => ttl.min(Duration::from_millis(cap)),
        }
    }

    /// Remembers the server's lease cap (`warden.max-lease`, in ms), learnt
    /// from a refusal; a lower one learnt later (the cap lowered at run
    /// time) replaces it.
    pub(crate) fn learn_cap(&self, cap_ms: u64) {
        self.inner
            .max_lease_ms
            .store(cap_ms.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// `cmd` on the shared connection, within the command timeout.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        self.query_within(cmd, self.inner.config.command_timeout)
            .await
    }

    /// `cmd` on the shared connection, within `limit` (connecting included).
    pub(crate) async fn query_within<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        limit: Duration,
    ) -> Result<T> {
        let inner = &self.inner;
        tokio::time::timeout(
            limit,
            inner.backend.query(cmd, inner.config.connect_timeout),
        )
        .await
        .map_err(|_| Error::Timeout)?
    }

    /// How long the reply to a request that waits up to `wait` server-side
    /// may take (None: forever, for a wait without end).
    pub(crate) fn wait_limit(&self, wait: Duration) -> Option<Duration> {
        (!wait.is_zero()).then(|| wait + self.inner.config.command_timeout)
    }

    /// A dedicated connection: an idle one that still answers, or a new one.
    pub(crate) async fn dedicated(&self) -> Result<Link> {
        let config = &self.inner.config;
        while let Some(link) = self.inner.pool.take() {
            if link.alive(config.command_timeout).await {
                return Ok(link);
            }
        }
        self.inner.backend.open_link(config.connect_timeout).await
    }

    /// Hands a dedicated connection whose replies have all come in back to the pool.
    /// `WARDEN.WITHDRAW key owner`: true when the server took the owner's
    /// queued request out (it is answered nil on its own connection and
    /// never granted). False when nothing was queued (granted, its reply on
    /// its way, or not arrived yet) or the server refuses the command (then
    /// never asked again).
    pub(crate) async fn withdraw(&self, key: &str, owner: &str) -> bool {
        use std::sync::atomic::Ordering;
        if self.inner.no_withdraw.load(Ordering::Relaxed) {
            return false;
        }
        let mut cmd = redis::cmd("WARDEN.WITHDRAW");
        cmd.arg(key).arg(owner);
        match self.query::<i64>(&cmd).await {
            Ok(n) => n > 0,
            Err(Error::Server { code, message }) => {
                // Refused for good only by an ACL or a server without it (a
                // module before 1.1.0, a renamed command); BUSY, LOADING or a
                // redirect pass, and it is sent again next time.
                if code == "NOPERM" || message.to_lowercase().contains("unknown command") {
                    tracing::debug!(code, message, "WARDEN.WITHDRAW refused: unblocking instead");
                    self.inner.no_withdraw.store(true, Ordering::Relaxed);
                }
                false
            }
            Err(_) => false,
        }
    }

    /// Whether `CLIENT UNBLOCK` takes a module's waiter out of its queue on
    /// this server (Redis 7.4+, Valkey 8+), learnt once from `INFO server`;
    /// false when that cannot be read. Older servers are never sent one:
    /// Redis 7.0 crashes on `CLIENT UNBLOCK` of a client held back by
    /// `CLIENT PAUSE`.
    pub(crate) async fn unblock_works(&self) -> bool {
        use std::sync::atomic::Ordering;
        match self.inner.unblock_works.load(Ordering::Relaxed) {
            1 => return true,
            2 => return false,
            _ => {}
        }
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let Ok(text) = self.query::<String>(&info).await else {
            return false;
        };
        let works = unblocks_module_waiters(&text);
        let state = if works { 1 } else { 2 };
        self.inner.unblock_works.store(state, Ordering::Relaxed);
        works
    }

    pub(crate) fn recycle(&self, link: Link) {
        self.inner.pool.give(link);
    }
}

/// Whether an `INFO server` reply names a server whose `CLIENT UNBLOCK` ends
/// a module's wait: Redis 7.4+, Valkey 8+.
fn unblocks_module_waiters(info: &str) -> bool {
    let version = |name: &str| -> Option<(u32, u32)> {
        let line = info.lines().find_map(|l| l.strip_prefix(name))?;
        let mut parts = line.trim().split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    match version("valkey_version:") {
        Some(v) => v >= (8, 0),
        None => version("redis_version:").is_some_and(|v| v >= (7, 4)),
    }
}

#[cfg(test)]
mod tests {
    use super::unblocks_module_waiters;

    #[test]
    fn unblock_is_sent_only_where_it_ends_a_module_wait() {
        for (info, works) in [
            ("# Server\r\nredis_version:7.0.15\r\n", false),
            ("# Server\r\nredis_version:7.2.4\r\n", false),
            ("# Server\r\nredis_version:7.4.0\r\n", true),
            ("# Server\r\nredis_version:8.2.3\r\n", true),
            ("redis_version:7.2.4\r\nvalkey_version:7.2.9\r\n", false),
            ("redis_version:7.2.4\r\nvalkey_version:9.1.2\r\n", true),
            ("", false),
        ] {
            assert_eq!(unblocks_module_waiters(info), works, "{info:?}");
        }
    }
}
