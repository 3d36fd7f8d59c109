//! Redlock: one lock over N independent warden servers.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::link::{millis, Shared};

/// A lock held on a majority of N independent servers, each with the same
/// owner: `LOCK.ACQUIRE` without `WAIT` on all of them at once, each bounded
/// by a per-server timeout; the lock is granted if a majority answered with a
/// token and `validity = ttl − elapsed − drift` (drift = ttl/100 + 2 ms) is
/// positive. Otherwise it is released everywhere.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run() -> warden_client::Result<()> {
/// use warden_client::Redlock;
/// let servers = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let clients = servers.iter().map(|u| redis::Client::open(*u)).collect::<Result<Vec<_>, _>>()?;
/// let redlock = Redlock::new(clients).server_timeout(Duration::from_millis(50));
/// if let Some(guard) = redlock.acquire("report:daily", Duration::from_secs(10)).await? {
///     // work only until guard.valid_until(); guard.token() is the highest token granted
///     guard.release().await;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    servers: Vec<Server>,
    server_timeout: Duration,
    id: uuid::Uuid,
}

struct Server {
    client: redis::Client,
    shared: Shared,
}

impl Server {
    async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> Result<T> {
        let attempt = async {
            let link = self.shared.get(&self.client, limit).await?;
            let reply = link.query(cmd, None).await;
            if let Err(e) = &reply {
                if e.breaks_connection() {
                    self.shared.discard(&link).await;
                }
            }
            reply
        };
        tokio::time::timeout(limit, attempt)
            .await
            .map_err(|_| Error::Timeout)?
    }
}

impl Redlock {
    /// Over these servers (an odd number, typically 5); each server call
    /// (connecting included) is bounded by 50 ms unless changed.
    pub fn new(clients: Vec<redis::Client>) -> Self {
        Redlock {
            inner: Arc::new(Inner {
                servers: clients
                    .into_iter()
                    .map(|client| Server {
                        client,
                        shared: Shared::new(),
                    })
                    .collect(),
                server_timeout: Duration::from_millis(50),
                id: uuid::Uuid::new_v4(),
            }),
        }
    }

    /// The bound on each server's answer, connecting included.
    pub fn server_timeout(self, timeout: Duration) -> Self {
        let inner = Arc::try_unwrap(self.inner)
            .unwrap_or_else(|_| panic!("set the server timeout before cloning the Redlock"));
        Redlock {
            inner: Arc::new(Inner {
                server_timeout: timeout,
                ..inner
            }),
        }
    }

    /// The guard if a majority granted the lock in time, else `None` (and
    /// whatever was granted is released).
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Option<RedlockGuard>> {
        let owner = crate::owner::current(&self.inner.id);
        let ttl = ttl.max(Duration::from_millis(1));
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(key).arg(&owner).arg(millis(ttl, 1));
        let start = Instant::now();
        let replies = join_all(
            self.inner
                .servers
                .iter()
                .map(|s| s.query::<Option<i64>>(&cmd, self.inner.server_timeout)),
        )
        .await;
        let elapsed = start.elapsed();
        let tokens: Vec<i64> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        let quorum = self.inner.servers.len() / 2 + 1;
        let drift = ttl / 100 + Duration::from_millis(2);
        match ttl.checked_sub(elapsed + drift) {
            Some(validity) if tokens.len() >= quorum && !validity.is_zero() => {
                Ok(Some(RedlockGuard {
                    redlock: self.clone(),
                    key: key.to_string(),
                    owner,
                    granted: tokens.len(),
                    token: tokens.into_iter().max().unwrap_or_default(),
                    valid_until: start + validity,
                    released: false,
                }))
            }
            _ => {
                release_all(&self.inner, key, &owner).await;
                Ok(None)
            }
        }
    }

    pub fn servers(&self) -> usize {
        self.inner.servers.len()
    }
}

/// `LOCK.RELEASE` on every server at once; the number that released.
async fn release_all(inner: &Inner, key: &str, owner: &str) -> usize {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
    join_all(
        inner
            .servers
            .iter()
            .map(|s| s.query::<i64>(&cmd, inner.server_timeout)),
    )
    .await
    .into_iter()
    .filter(|r| matches!(r, Ok(1)))
    .count()
}

/// A Redlock held on a majority. Dropping it releases everywhere in the
/// background.
#[must_use = "dropping the guard releases the lock"]
pub struct RedlockGuard {
    redlock: Redlock,
    key: String,
    owner: String,
    token: i64,
    granted: usize,
    valid_until: Instant,
    released: bool,
}

impl RedlockGuard {
    /// How many servers granted the lock.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// The highest fencing token any server granted (tokens are per server).
    pub fn token(&self) -> i64 {
        self.token
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The moment the lock may no longer be relied on.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// How much of the validity is left.
    pub fn validity(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Releases on every server; returns how many released a hold.
    pub async fn release(mut self) -> usize {
        self.released = true;
        release_all(&self.redlock.inner, &self.key, &self.owner).await
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Ok(runtime) = Handle::try_current() {
            let inner = self.redlock.inner.clone();
            let key = std::mem::take(&mut self.key);
            let owner = std::mem::take(&mut self.owner);
            runtime.spawn(async move {
                release_all(&inner, &key, &owner).await;
            });
        }
    }
}
