//! Redlock: one lock over N independent warden servers.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::backend::{millis, Backend};
use crate::error::{Error, Result};

/// A lock held on a majority of N independent servers, each with the same
/// owner (a fresh one per acquire): `LOCK.ACQUIRE` without `WAIT` on all of
/// them at once, each bounded by a per-server timeout; the lock is granted if
/// a majority answered with a token and `validity = ttl − elapsed − drift`
/// (drift = ttl/100 + 2 ms) is positive. Otherwise it is released everywhere
/// and, with [`retries`](Self::retries), tried again after a random delay.
///
/// Fencing tokens come from each server's own counter: the guard reports
/// them per server ([`RedlockGuard::tokens`]); they are not comparable across
/// servers.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use warden_client::Redlock;
/// let servers = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let clients = servers.iter().map(|u| redis::Client::open(*u)).collect::<Result<Vec<_>, _>>()?;
/// let redlock = Redlock::new(clients)
///     .server_timeout(Duration::from_millis(50))
///     .retries(3)
///     .retry_delay(Duration::from_millis(200));
/// if let Some(mut guard) = redlock.acquire("report:daily", Duration::from_secs(10)).await? {
///     // work only until guard.valid_until(); tokens() holds each server's token
///     if guard.extend(Duration::from_secs(10)).await? {
///         // still held on a majority, valid for another ~10 s
///     }
///     guard.release().await;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redlock {
    servers: Arc<Vec<Backend>>,
    server_timeout: Duration,
    retries: u32,
    retry_delay: Duration,
}

impl Redlock {
    /// Over these servers (an odd number, typically 5); each server call
    /// (connecting included) is bounded by 50 ms unless changed; no retries.
    pub fn new(clients: Vec<redis::Client>) -> Self {
        Redlock {
            servers: Arc::new(clients.into_iter().map(Backend::client).collect()),
            server_timeout: Duration::from_millis(50),
            retries: 0,
            retry_delay: Duration::from_millis(200),
        }
    }

    /// The bound on each server's answer, connecting included.
    pub fn server_timeout(mut self, timeout: Duration) -> Self {
        self.server_timeout = timeout;
        self
    }

    /// Attempts after a failed one (default 0).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The mean pause before a retry (default 200 ms); each pause is drawn
    /// uniformly from `delay/2 ..= 3·delay/2`, so that competing clients
    /// fall out of step.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// `cmd` on every server at once, each within the server timeout.
    async fn everywhere<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Vec<Result<T>> {
        let limit = self.server_timeout;
        join_all(self.servers.iter().map(|s| async move {
            tokio::time::timeout(limit, s.query::<T>(cmd, limit))
                .await
                .map_err(|_| Error::Timeout)?
        }))
        .await
    }

    /// The guard if a majority granted the lock in time (within the allowed
    /// attempts), else `None` (and whatever was granted is released).
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Option<RedlockGuard>> {
        let ttl = ttl.max(Duration::from_millis(1));
        for attempt in 0..=self.retries {
            if attempt > 0 {
                let jitter = self.retry_delay.mul_f64(fastrand::f64());
                tokio::time::sleep(self.retry_delay / 2 + jitter).await;
            }
            if let Some(guard) = self.attempt(key, ttl).await {
                tracing::debug!(key, attempt, "redlock acquired");
                return Ok(Some(guard));
            }
            tracing::debug!(key, attempt, "redlock not acquired");
        }
        Ok(None)
    }

    async fn attempt(&self, key: &str, ttl: Duration) -> Option<RedlockGuard> {
        let owner = crate::owner::fresh();
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(key).arg(&owner).arg(millis(ttl, 1));
        let start = Instant::now();
        let tokens: Vec<Option<i64>> = self
            .everywhere::<Option<i64>>(&cmd)
            .await
            .into_iter()
            .map(|r| r.ok().flatten())
            .collect();
        let granted = tokens.iter().flatten().count();
        match validity(ttl, start.elapsed()) {
            Some(validity) if granted >= self.quorum() => Some(RedlockGuard {
                redlock: self.clone(),
                key: key.to_string(),
                owner,
                tokens,
                valid_until: start + validity,
                released: false,
            }),
            _ => {
                release_all(self, key, &owner).await;
                None
            }
        }
    }
}

/// `ttl − elapsed − drift`, if positive.
fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    let drift = ttl / 100 + Duration::from_millis(2);
    ttl.checked_sub(elapsed + drift).filter(|v| !v.is_zero())
}

/// `LOCK.RELEASE` on every server at once; the number that released.
async fn release_all(redlock: &Redlock, key: &str, owner: &str) -> usize {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
    redlock
        .everywhere::<i64>(&cmd)
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
    tokens: Vec<Option<i64>>,
    valid_until: Instant,
    released: bool,
}

impl RedlockGuard {
    /// How many servers granted the lock.
    pub fn granted(&self) -> usize {
        self.tokens.iter().flatten().count()
    }

    /// Each server's fencing token, in the order the servers were given
    /// (`None` where that server did not grant). Each server counts on its
    /// own: a store that checks fences must keep one per server.
    pub fn tokens(&self) -> &[Option<i64>] {
        &self.tokens
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

    /// Resets the lease to `ttl` on every server that still holds it
    /// (`LOCK.EXTEND`); `true` if a majority did so in time, and the validity
    /// is then `ttl − elapsed − drift` from now. On `false` the lock must be
    /// taken as lost (the validity is left as it was).
    pub async fn extend(&mut self, ttl: Duration) -> Result<bool> {
        let ttl = ttl.max(Duration::from_millis(1));
        if self.validity().is_zero() {
            return Ok(false);
        }
        let mut cmd = redis::cmd("LOCK.EXTEND");
        cmd.arg(&self.key).arg(&self.owner).arg(millis(ttl, 1));
        let start = Instant::now();
        let extended = self
            .redlock
            .everywhere::<i64>(&cmd)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(1)))
            .count();
        match validity(ttl, start.elapsed()) {
            Some(validity) if extended >= self.redlock.quorum() => {
                self.valid_until = start + validity;
                tracing::debug!(key = %self.key, extended, "redlock extended");
                Ok(true)
            }
            _ => {
                tracing::warn!(key = %self.key, extended, "redlock extend failed: lost");
                Ok(false)
            }
        }
    }

    /// Releases on every server; returns how many released a hold.
    pub async fn release(mut self) -> usize {
        self.released = true;
        release_all(&self.redlock, &self.key, &self.owner).await
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Ok(runtime) = Handle::try_current() {
            let redlock = self.redlock.clone();
            let key = std::mem::take(&mut self.key);
            let owner = std::mem::take(&mut self.owner);
            runtime.spawn(async move {
                release_all(&redlock, &key, &owner).await;
            });
        }
    }
}
