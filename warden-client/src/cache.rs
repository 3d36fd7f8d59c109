//! `get_or_load` over `CACHE.GET … WAIT` / `CACHE.FILL` / `CACHE.ABANDON`.

use std::future::Future;
use std::time::Duration;

use redis::{FromRedisValue, ToRedisArgs};

use crate::backend::{millis, Link};
use crate::deadline::Deadline;
use crate::error::{Error, LoaderError, Result};
use crate::Warden;

/// Cache reads with one load per key: the first caller to miss gets the
/// lease and runs the loader, the others wait server-side and are answered
/// with the filled value. Made by [`Warden::cache`]; options set once, then
/// [`get_or_load`](Cache::get_or_load) per read.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run(warden: warden_client::Warden) -> warden_client::Result<()> {
/// let cache = warden
///     .cache()
///     .ttl(Duration::from_secs(60))       // CACHE.FILL … PX 60000
///     .jitter(Duration::from_secs(6))     // … JITTER 6000: spreads expiries
///     .refresh(Duration::from_secs(10));  // reload in the background 10 s before expiry
/// let name: String = cache
///     .get_or_load("user:42:name", Duration::from_secs(2), || async {
///         Ok::<_, std::io::Error>("Ada".to_string()) // the database read
///     })
///     .await?;
/// # let _ = name;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Cache {
    warden: Warden,
    wait: Duration,
    ttl: Option<Duration>,
    jitter: Option<Duration>,
    refresh: Option<Duration>,
    fresh: bool,
    max_queue: Option<u64>,
}

impl Cache {
    pub(crate) fn new(warden: Warden) -> Self {
        Cache {
            warden,
            wait: Duration::from_secs(5),
            ttl: None,
            jitter: None,
            refresh: None,
            fresh: false,
            max_queue: None,
        }
    }

    /// How long a caller waits for another's fill (default 5 s; zero:
    /// forever), measured from the call to
    /// [`get_or_load`](Self::get_or_load): the `WAIT` sent is what remains of
    /// it then, less a few ms for the reply's way back.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Load shedding (`QUEUE n`): when `n` or more callers already wait for
    /// the key's fill, a miss answers [`Error::WaitTimedOut`] at once instead
    /// of queueing. Needs a server whose warden knows `QUEUE`; `n` at most
    /// 2^46.
    pub fn max_queue(mut self, n: u64) -> Self {
        self.max_queue = Some(n);
        self
    }

    /// The TTL of filled values (`PX`); none by default.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// A random extra 0..=`jitter` on each fill's TTL (`JITTER`; needs a TTL).
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = Some(jitter);
        self
    }

    /// Refresh ahead: when a hit's TTL is below `before`, one caller reloads
    /// in the background while everyone is served the current value.
    pub fn refresh(mut self, before: Duration) -> Self {
        self.refresh = Some(before);
        self
    }

    /// Treat a value marked stale by `CACHE.INVALIDATE … STALE` as a miss.
    pub fn fresh(mut self, on: bool) -> Self {
        self.fresh = on;
        self
    }

    pub(crate) fn warden(&self) -> &Warden {
        &self.warden
    }

    /// The refresh-ahead margin, if any.
    pub(crate) fn refresh_before(&self) -> Option<Duration> {
        self.refresh
    }

    /// The value of `key`, loading it with `loader` if this caller gets the
    /// lease (valid for `lease`). The loader's result is filled on the
    /// connection that got the lease; if the loader fails the lease is
    /// abandoned, which hands it to the oldest waiter, and its error is
    /// returned as [`Error::Loader`]. A refresh-ahead lease runs the loader in
    /// a background task (hence `Send + 'static`).
    pub async fn get_or_load<V, F, Fut, E>(
        &self,
        key: &str,
        lease: Duration,
        loader: F,
    ) -> Result<V>
    where
        V: FromRedisValue + ToRedisArgs + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = std::result::Result<V, E>> + Send + 'static,
        E: Into<LoaderError>,
    {
        let deadline = Deadline::after(self.wait);
        // Waiting for a connection counts against the wait, never past it.
        let link = deadline
            .within(self.warden.dedicated())
            .await
            .ok_or(Error::WaitTimedOut)??;
        // Computed as it is sent: the time spent getting here is already gone.
        let Some(wait_ms) = deadline.wait_arg() else {
            self.warden.recycle(link);
            return Err(Error::WaitTimedOut);
        };
        let mut get = redis::cmd("CACHE.GET");
        get.arg(key).arg(millis(lease, 1)).arg("WAIT").arg(wait_ms);
        if let Some(before) = self.refresh {
            get.arg("REFRESH").arg(millis(before, 0));
        }
        if self.fresh {
            get.arg("FRESH");
        }
        if let Some(n) = self.max_queue {
            get.arg("QUEUE").arg(n);
        }
        let limit = self.warden.wait_limit(Duration::from_millis(wait_ms));
        let (value, token) = link.query::<(Option<V>, Option<i64>)>(&get, limit).await?;
        if value.is_none() && token.is_some() && deadline.passed() {
            // A lease handed over after the caller's wait: passed on to the
            // next waiter rather than loaded for a caller who gave up.
            let mut abandon = redis::cmd("CACHE.ABANDON");
            abandon.arg(key).arg(token);
            let abandoned = link
                .query::<i64>(&abandon, Some(self.warden.config().command_timeout))
                .await;
            if abandoned.is_ok() {
                self.warden.recycle(link);
            }
            return Err(Error::WaitTimedOut);
        }
        match (value, token) {
            (Some(value), None) => {
                self.warden.recycle(link);
                Ok(value)
            }
            (Some(value), Some(token)) => {
                let this = self.clone();
                let key = key.to_string();
                tokio::spawn(async move {
                    // Nobody awaits this load: its failure is only logged.
                    if let Err(e) = this.load_and_fill(&key, token, link, loader).await {
                        tracing::warn!(key, error = %e, "refresh-ahead load failed");
                    }
                });
                Ok(value)
            }
            (None, Some(token)) => self.load_and_fill(key, token, link, loader).await,
            (None, None) => {
                self.warden.recycle(link);
                Err(Error::WaitTimedOut)
            }
        }
    }

    /// Runs the loader under lease `token`, then fills or abandons on `link`,
    /// the connection the lease belongs to.
    async fn load_and_fill<V, F, Fut, E>(
        &self,
        key: &str,
        token: i64,
        link: Link,
        loader: F,
    ) -> Result<V>
    where
        V: FromRedisValue + ToRedisArgs,
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<V, E>>,
        E: Into<LoaderError>,
    {
        let limit = Some(self.warden.config().command_timeout);
        let loaded: std::result::Result<V, LoaderError> = loader().await.map_err(Into::into);
        match loaded {
            Ok(value) => {
                let mut fill = redis::cmd("CACHE.FILL");
                fill.arg(key).arg(token).arg(&value);
                if let Some(ttl) = self.ttl {
                    fill.arg("PX").arg(millis(ttl, 1));
                    if let Some(jitter) = self.jitter {
                        fill.arg("JITTER").arg(millis(jitter, 0));
                    }
                }
                // 0: the lease lapsed or was revoked (an invalidation won);
                // the value loaded is still this caller's answer.
                let _stored: i64 = link.query(&fill, limit).await?;
                self.warden.recycle(link);
                Ok(value)
            }
            Err(e) => {
                let mut abandon = redis::cmd("CACHE.ABANDON");
                abandon.arg(key).arg(token);
                let abandoned = link.query::<i64>(&abandon, limit).await;
                if abandoned.is_ok() {
                    self.warden.recycle(link);
                }
                Err(Error::Loader(e))
            }
        }
    }
}
