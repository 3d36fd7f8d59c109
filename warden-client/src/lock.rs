//! Lock requests and guards, for `LOCK.*` and `RWLOCK.*` alike.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::Result;
use crate::link::millis;
use crate::watchdog::{self, Lease};
use crate::Warden;

/// Which lock a request or guard is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// `LOCK.ACQUIRE` / `LOCK.RELEASE` / `LOCK.EXTEND`.
    Exclusive,
    /// `RWLOCK.READ` / `RWLOCK.UNLOCK` / `RWLOCK.EXTEND`.
    Read,
    /// `RWLOCK.WRITE` / `RWLOCK.UNLOCK` / `RWLOCK.EXTEND`.
    Write,
}

impl LockKind {
    fn acquire(self) -> &'static str {
        match self {
            LockKind::Exclusive => "LOCK.ACQUIRE",
            LockKind::Read => "RWLOCK.READ",
            LockKind::Write => "RWLOCK.WRITE",
        }
    }

    fn release(self) -> &'static str {
        match self {
            LockKind::Exclusive => "LOCK.RELEASE",
            _ => "RWLOCK.UNLOCK",
        }
    }

    pub(crate) fn extend(self) -> &'static str {
        match self {
            LockKind::Exclusive => "LOCK.EXTEND",
            _ => "RWLOCK.EXTEND",
        }
    }
}

/// What a release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// The hold is gone: the lock is free or handed to the next waiter (`1`).
    Released,
    /// Re-entrant holds of the same owner remain (`0`).
    HoldsRemain,
    /// The owner held nothing any more: the lease had ended (`-1`).
    NotHeld,
}

/// An acquire being set up: [`Warden::lock`], [`Warden::read_lock`] or
/// [`Warden::write_lock`], then `.ttl(..)`, `.wait(..)`, `.watchdog(..)`,
/// `.acquire()`.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run(warden: warden_client::Warden) -> warden_client::Result<()> {
/// // Readers share; each has its own lease.
/// let read = warden.read_lock("catalog").ttl(Duration::from_secs(5)).acquire().await?;
/// if let Some(read) = read {
///     read.release().await?;
/// }
/// // A writer waits up to 2 s for the readers to leave, on its own connection.
/// let write = warden
///     .write_lock("catalog")
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// drop(write); // released in the background
/// # Ok(())
/// # }
/// ```
#[must_use = "a request does nothing until `.acquire()` is awaited"]
pub struct LockRequest {
    warden: Warden,
    kind: LockKind,
    key: String,
    ttl: Duration,
    wait: Option<Duration>,
    watchdog: bool,
}

impl LockRequest {
    pub(crate) fn new(warden: Warden, kind: LockKind, key: String) -> Self {
        LockRequest {
            warden,
            kind,
            key,
            ttl: Duration::from_secs(30),
            wait: None,
            watchdog: false,
        }
    }

    /// The lease (default 30 s); at least 1 ms.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// Wait server-side up to `timeout` if the lock is busy (zero: forever),
    /// on a dedicated connection.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// Renew the lease every ttl/3 while the guard lives.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// The guard, or `None` if the lock stayed busy.
    pub async fn acquire(self) -> Result<Option<LockGuard>> {
        let owner = self.warden.owner();
        let mut cmd = redis::cmd(self.kind.acquire());
        cmd.arg(&self.key).arg(&owner).arg(millis(self.ttl, 1));
        let sent = Instant::now();
        let (token, lease_start) = match self.wait {
            None => (self.warden.query::<Option<i64>>(&cmd).await?, sent),
            Some(wait) => {
                cmd.arg("WAIT").arg(millis(wait, 0));
                let (token, link) = self
                    .warden
                    .query_blocking::<Option<i64>>(&cmd, wait)
                    .await?;
                self.warden.recycle(link);
                // A grant is answered in the event-loop turn that made it,
                // so its lease began about when a reply that waited arrived.
                let start = if token.is_some() && sent.elapsed() > self.ttl / 10 {
                    Instant::now()
                } else {
                    sent
                };
                (token, start)
            }
        };
        let Some(token) = token else {
            return Ok(None);
        };
        let lease = Arc::new(Lease::new(lease_start + self.ttl));
        let watchdog = self.watchdog.then(|| {
            tokio::spawn(watchdog::renew(
                self.warden.clone(),
                self.kind,
                self.key.clone(),
                owner.clone(),
                self.ttl,
                lease.clone(),
            ))
        });
        Ok(Some(LockGuard {
            held: Some(Held {
                warden: self.warden,
                kind: self.kind,
                key: self.key,
                owner,
                token,
                lease,
                watchdog,
                runtime: Handle::current(),
            }),
        }))
    }
}

/// A held lock. [`release`](LockGuard::release) lets it go; dropping the
/// guard releases it in the background (on the runtime it was acquired on;
/// if that runtime is gone, the lease ends it).
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    held: Option<Held>,
}

struct Held {
    warden: Warden,
    kind: LockKind,
    key: String,
    owner: String,
    token: i64,
    lease: Arc<Lease>,
    watchdog: Option<JoinHandle<()>>,
    runtime: Handle,
}

impl Held {
    /// Stops the watchdog and waits until it is gone, so that no renewal
    /// can be sent after this returns. Aborting is enough: a renewal already
    /// handed to the shared connection goes out before anything sent later
    /// on that connection.
    async fn stop_watchdog(&mut self) {
        if let Some(task) = self.watchdog.take() {
            task.abort();
            let _ = task.await;
        }
    }

    async fn release(mut self) -> Result<Release> {
        self.stop_watchdog().await;
        let mut cmd = redis::cmd(self.kind.release());
        cmd.arg(&self.key).arg(&self.owner);
        match self.warden.query::<i64>(&cmd).await? {
            1 => Ok(Release::Released),
            0 => Ok(Release::HoldsRemain),
            _ => Ok(Release::NotHeld),
        }
    }
}

impl LockGuard {
    fn held(&self) -> &Held {
        self.held.as_ref().expect("a guard holds until released")
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> i64 {
        self.held().token
    }

    pub fn key(&self) -> &str {
        &self.held().key
    }

    pub fn owner(&self) -> &str {
        &self.held().owner
    }

    pub fn kind(&self) -> LockKind {
        self.held().kind
    }

    /// When the lease ends as far as this client knows (renewals move it).
    pub fn lease_end(&self) -> Instant {
        self.held().lease.end()
    }

    /// Whether the lock is known lost: the watchdog was told it is not held
    /// or could not renew before the lease ended; without a watchdog, the
    /// lease's end has passed.
    pub fn is_lost(&self) -> bool {
        let held = self.held();
        held.lease.is_lost() || (held.watchdog.is_none() && Instant::now() >= held.lease.end())
    }

    /// Resolves when the lock is lost (see [`is_lost`](Self::is_lost)); made
    /// for `tokio::select!` beside the work the lock protects.
    pub async fn lost(&self) {
        let held = self.held();
        let mut flag = held.lease.subscribe();
        loop {
            if *flag.borrow_and_update() {
                return;
            }
            if held.watchdog.is_none() {
                let end = held.lease.end();
                if Instant::now() >= end {
                    return;
                }
                tokio::select! {
                    _ = flag.changed() => {}
                    _ = tokio::time::sleep_until(end) => {}
                }
            } else if flag.changed().await.is_err() {
                return;
            }
        }
    }

    /// The loss flag as a `watch` channel (`true` once lost), set by the watchdog.
    pub fn lost_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.held().lease.subscribe()
    }

    /// Resets the lease to `ttl` now; `false` if the lock is no longer held.
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        let held = self.held();
        let mut cmd = redis::cmd(held.kind.extend());
        cmd.arg(&held.key).arg(&held.owner).arg(millis(ttl, 1));
        let sent = Instant::now();
        let held_still = held.warden.query::<i64>(&cmd).await? == 1;
        if held_still {
            held.lease.renewed(sent + ttl);
        } else {
            held.lease.mark_lost();
        }
        Ok(held_still)
    }

    /// Releases the lock, after stopping the watchdog.
    pub async fn release(mut self) -> Result<Release> {
        let held = self.held.take().expect("a guard holds until released");
        held.release().await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            let runtime = held.runtime.clone();
            runtime.spawn(async move {
                let _ = held.release().await;
            });
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.held {
            Some(h) => f
                .debug_struct("LockGuard")
                .field("kind", &h.kind)
                .field("key", &h.key)
                .field("owner", &h.owner)
                .field("token", &h.token)
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}
