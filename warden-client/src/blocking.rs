//! The same client for code without an async runtime: every call blocks the
//! calling thread. It runs the async core on a small runtime of its own (one
//! worker thread), where watchdogs renew and dropped guards release in the
//! background.
//!
//! Call it from plain threads, not from inside an async runtime: there every
//! call (and opening a client) answers [`Error::Client`] instead of blocking
//! the runtime's thread; use [`crate::Warden`] there.
//!
//! ```no_run
//! use std::time::Duration;
//! use warden_client::blocking::Warden;
//!
//! # fn run() -> warden_client::Result<()> {
//! let warden = Warden::open("redis://127.0.0.1/")?;
//! if let Some(guard) = warden.lock("order:42").wait(Duration::from_secs(5)).acquire()? {
//!     // ... guard.token() to the store, guard.is_lost() before each write ...
//!     guard.release()?;
//! }
//! let name: String = warden.cache().ttl(Duration::from_secs(60)).get_or_load(
//!     "user:42:name",
//!     Duration::from_secs(2),
//!     || Ok::<_, std::io::Error>("Ada".to_string()),
//! )?;
//! # let _ = name;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use redis::{FromRedisValue, ToRedisArgs};
use tokio::time::Instant;

use crate::error::{Error, LoaderError, Result};
use crate::{Config, LockKind, Release};

/// Blocking inside an async runtime would stall (or, in tokio, panic): an error instead.
fn outside_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::Client(
            "warden_client::blocking called inside an async runtime: use warden_client::Warden there"
                .into(),
        ));
    }
    Ok(())
}

/// `runtime.block_on(f)`, or an error when called inside an async runtime.
fn block_on<F: std::future::Future>(runtime: &Runtime, f: F) -> Result<F::Output> {
    outside_runtime()?;
    Ok(runtime.block_on(f))
}

fn runtime() -> Result<Arc<Runtime>> {
    outside_runtime()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("warden-client")
        .enable_all()
        .build()
        .map(|r| Arc::new(Runtime(Some(r))))
        .map_err(|e| Error::Client(Box::new(e)))
}

/// The facade's runtime. Dropped (with the last client or guard) inside an
/// async runtime, it shuts down in the background: tokio panics on a runtime
/// dropped where blocking is not allowed.
#[derive(Debug)]
struct Runtime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Runtime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime.shutdown_background();
            }
        }
    }
}

/// The blocking twin of [`crate::Warden`]; cheap to clone.
#[derive(Clone)]
pub struct Warden {
    inner: crate::Warden,
    runtime: Arc<Runtime>,
}

impl Warden {
    fn wrap(inner: crate::Warden) -> Result<Self> {
        Ok(Warden {
            inner,
            runtime: runtime()?,
        })
    }

    /// See [`crate::Warden::open`].
    pub fn open(url: &str) -> Result<Self> {
        Self::wrap(crate::Warden::open(url)?)
    }

    /// See [`crate::Warden::new`].
    pub fn new(client: redis::Client) -> Result<Self> {
        Self::wrap(crate::Warden::new(client))
    }

    /// See [`crate::Warden::cluster`].
    pub fn cluster(client: redis::cluster::ClusterClient) -> Result<Self> {
        Self::wrap(crate::Warden::cluster(client))
    }

    /// See [`crate::Warden::with_config`].
    pub fn with_config(self, config: Config) -> Self {
        Warden {
            inner: self.inner.with_config(config),
            runtime: self.runtime,
        }
    }

    /// The async client underneath, for code that has both worlds.
    pub fn as_async(&self) -> &crate::Warden {
        &self.inner
    }

    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        self.request(self.inner.lock(key))
    }

    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        self.request(self.inner.read_lock(key))
    }

    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        self.request(self.inner.write_lock(key))
    }

    fn request(&self, inner: crate::LockRequest) -> LockRequest {
        LockRequest {
            inner,
            runtime: self.runtime.clone(),
        }
    }

    pub fn cache(&self) -> Cache {
        Cache {
            inner: self.inner.cache(),
            runtime: self.runtime.clone(),
        }
    }
}

/// See [`crate::LockRequest`].
#[must_use = "a request does nothing until `.acquire()` is called"]
pub struct LockRequest {
    inner: crate::LockRequest,
    runtime: Arc<Runtime>,
}

impl LockRequest {
    pub fn ttl(self, ttl: Duration) -> Self {
        self.map(|r| r.ttl(ttl))
    }

    pub fn wait(self, timeout: Duration) -> Self {
        self.map(|r| r.wait(timeout))
    }

    pub fn watchdog(self, on: bool) -> Self {
        self.map(|r| r.watchdog(on))
    }

    pub fn reentrant(self, owner: impl Into<String>) -> Self {
        self.map(|r| r.reentrant(owner))
    }

    pub fn max_queue(self, n: u64) -> Self {
        self.map(|r| r.max_queue(n))
    }

    fn map(self, f: impl FnOnce(crate::LockRequest) -> crate::LockRequest) -> Self {
        LockRequest {
            inner: f(self.inner),
            runtime: self.runtime,
        }
    }

    /// The guard, or `None` if the lock stayed busy.
    pub fn acquire(self) -> Result<Option<LockGuard>> {
        let runtime = self.runtime;
        let guard = block_on(&runtime, self.inner.acquire())??;
        Ok(guard.map(|inner| LockGuard { inner, runtime }))
    }
}

/// See [`crate::LockGuard`]. Dropping it releases in the background.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct LockGuard {
    inner: crate::LockGuard,
    // Keeps the runtime (and with it the watchdog) alive as long as the guard.
    runtime: Arc<Runtime>,
}

impl LockGuard {
    pub fn token(&self) -> i64 {
        self.inner.token()
    }

    pub fn key(&self) -> &str {
        self.inner.key()
    }

    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    pub fn kind(&self) -> LockKind {
        self.inner.kind()
    }

    pub fn lease_end(&self) -> Instant {
        self.inner.lease_end()
    }

    pub fn deadline(&self) -> Instant {
        self.inner.deadline()
    }

    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    pub fn extend(&self, ttl: Duration) -> Result<bool> {
        block_on(&self.runtime, self.inner.extend(ttl))?
    }

    pub fn release(self) -> Result<Release> {
        outside_runtime()?;
        let LockGuard { inner, runtime } = self;
        runtime.block_on(inner.release())
    }
}

/// See [`crate::Cache`]; the loader is a plain closure, run on a blocking
/// thread of the client's runtime.
#[derive(Clone)]
pub struct Cache {
    inner: crate::Cache,
    runtime: Arc<Runtime>,
}

impl Cache {
    pub fn wait(self, wait: Duration) -> Self {
        self.map(|c| c.wait(wait))
    }

    pub fn ttl(self, ttl: Duration) -> Self {
        self.map(|c| c.ttl(ttl))
    }

    pub fn jitter(self, jitter: Duration) -> Self {
        self.map(|c| c.jitter(jitter))
    }

    pub fn refresh(self, before: Duration) -> Self {
        self.map(|c| c.refresh(before))
    }

    pub fn fresh(self, on: bool) -> Self {
        self.map(|c| c.fresh(on))
    }

    pub fn max_queue(self, n: u64) -> Self {
        self.map(|c| c.max_queue(n))
    }

    fn map(self, f: impl FnOnce(crate::Cache) -> crate::Cache) -> Self {
        Cache {
            inner: f(self.inner),
            runtime: self.runtime,
        }
    }

    /// See [`crate::Cache::get_or_load`].
    pub fn get_or_load<V, F, E>(&self, key: &str, lease: Duration, loader: F) -> Result<V>
    where
        V: FromRedisValue + ToRedisArgs + Send + 'static,
        F: FnOnce() -> std::result::Result<V, E> + Send + 'static,
        E: Into<LoaderError> + 'static,
    {
        let load = move || async move {
            match tokio::task::spawn_blocking(move || loader().map_err(Into::into)).await {
                Ok(loaded) => loaded,
                Err(e) => Err::<V, LoaderError>(Box::new(e)),
            }
        };
        block_on(&self.runtime, self.inner.get_or_load(key, lease, load))?
    }
}
