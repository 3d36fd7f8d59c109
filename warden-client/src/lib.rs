//! A Rust client for warden's server-side locks, read-write locks and cache
//! leases, on redis-rs and tokio.
//!
//! - [`Warden::lock`], [`Warden::read_lock`], [`Warden::write_lock`]: a
//!   [`LockGuard`] with its fencing token, released by
//!   [`LockGuard::release`] or in the background when dropped, with an
//!   optional watchdog that renews the lease and reports a lost lock.
//! - [`Redlock`]: one lock over N independent servers.
//! - [`Warden::cache`]: [`Cache::get_or_load`], one load per key however
//!   many callers miss at once.
//!
//! # Connections
//!
//! A [`Warden`] holds a [`redis::Client`] and opens connections itself:
//!
//! - one shared multiplexed connection for every command that answers at once
//!   (acquire without `WAIT`, release, extend, the watchdog's renewals),
//!   reopened when it breaks;
//! - a dedicated connection for each request that may block server-side
//!   (an acquire with `WAIT`, `CACHE.GET … WAIT` and the fill or abandon that
//!   follows it on the same connection, as a cache lease ends with its
//!   connection). A blocked request therefore never delays other commands.
//!   Dedicated connections are reused through a small idle pool
//!   ([`Config::idle_connections`]) once their reply has come in; a request
//!   that is cancelled (its future dropped) closes its connection, which takes
//!   it out of the server's queue or ends its cache lease at once.
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

mod cache;
mod error;
mod link;
mod lock;
mod owner;
mod redlock;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue};

pub use cache::Cache;
pub use error::{Error, LoaderError, Result};
pub use lock::{LockGuard, LockKind, LockRequest, Release};
pub use redlock::{Redlock, RedlockGuard};

use link::{Link, Pool, Shared};

/// Client-side limits.
#[derive(Clone, Debug)]
pub struct Config {
    /// Longest wait to open a connection.
    pub connect_timeout: Duration,
    /// Longest wait for a reply to a command that answers at once; waiting
    /// requests get their `WAIT` plus this.
    pub command_timeout: Duration,
    /// Idle dedicated connections kept for waiting requests.
    pub idle_connections: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_secs(5),
            idle_connections: 8,
        }
    }
}

/// A handle on one warden server; cheap to clone (clones share connections
/// and the owner id prefix).
#[derive(Clone)]
pub struct Warden {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    config: Config,
    shared: Shared,
    pool: Pool,
    id: uuid::Uuid,
}

impl Warden {
    /// A client for `url` (`redis://host:port/db`, `redis+unix:///path`).
    /// Connects lazily, on the first command.
    pub fn open(url: &str) -> Result<Self> {
        Ok(Self::new(redis::Client::open(url)?))
    }

    pub fn new(client: redis::Client) -> Self {
        Self::with_config(client, Config::default())
    }

    pub fn with_config(client: redis::Client, config: Config) -> Self {
        let pool = Pool::new(config.idle_connections);
        Warden {
            inner: Arc::new(Inner {
                client,
                config,
                shared: Shared::new(),
                pool,
                id: uuid::Uuid::new_v4(),
            }),
        }
    }

    pub fn client(&self) -> &redis::Client {
        &self.inner.client
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The owner id this client uses from the current task (or thread):
    /// `<uuid>:task-<id>`. Acquiring a key again from the same task is
    /// re-entrant.
    pub fn owner(&self) -> String {
        owner::current(&self.inner.id)
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

    /// Cache reads through `CACHE.GET` leases, with default options.
    pub fn cache(&self) -> Cache {
        Cache::new(self.clone())
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
        let attempt = async {
            let link = inner
                .shared
                .get(&inner.client, inner.config.connect_timeout)
                .await?;
            let reply = link.query(cmd, None).await;
            if let Err(e) = &reply {
                if e.breaks_connection() {
                    inner.shared.discard(&link).await;
                }
            }
            reply
        };
        tokio::time::timeout(limit, attempt)
            .await
            .map_err(|_| Error::Timeout)?
    }

    /// A dedicated connection: an idle one from the pool or a new one.
    pub(crate) async fn dedicated(&self) -> Result<(Link, bool)> {
        match self.inner.pool.take() {
            Some(link) => Ok((link, true)),
            None => Ok((
                Link::open(&self.inner.client, self.inner.config.connect_timeout).await?,
                false,
            )),
        }
    }

    /// `cmd`, which may block for up to `wait` server-side, on a dedicated
    /// connection; returns the reply and the connection, still open. A pooled
    /// connection that turns out to be dead is replaced once.
    pub(crate) async fn query_blocking<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        wait: Duration,
    ) -> Result<(T, Link)> {
        let limit = self.wait_limit(wait);
        let (link, pooled) = self.dedicated().await?;
        match link.query(cmd, limit).await {
            Ok(v) => Ok((v, link)),
            Err(e) if pooled && e.breaks_connection() => {
                drop(link);
                let link =
                    Link::open(&self.inner.client, self.inner.config.connect_timeout).await?;
                let v = link.query(cmd, limit).await?;
                Ok((v, link))
            }
            Err(e) => Err(e),
        }
    }

    /// Client-side limit for a request that waits `wait` server-side (0: forever).
    pub(crate) fn wait_limit(&self, wait: Duration) -> Option<Duration> {
        (!wait.is_zero()).then(|| wait + self.inner.config.command_timeout)
    }

    /// Hands a dedicated connection whose replies have all come in back to the pool.
    pub(crate) fn recycle(&self, link: Link) {
        self.inner.pool.give(link);
    }
}
