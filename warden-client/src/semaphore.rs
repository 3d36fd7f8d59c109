//! Semaphores (`SEM.*`): at most `limit` permits held at once.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::millis;
use crate::error::{Error, Result};
use crate::hold::{acquire_capped, Acquire, Hold, Verbs};
use crate::{Release, Warden};

const VERBS: Verbs = Verbs {
    release: "SEM.RELEASE",
    extend: "SEM.EXTEND",
};

/// A semaphore on one key: at most `limit` permits held at once, each hold
/// with its own lease and fencing token. Made by [`Warden::semaphore`];
/// options set once, then [`acquire`](Self::acquire) or
/// [`try_acquire`](Self::try_acquire) per hold. Cheap to clone.
///
/// Every acquire states the limit; while the semaphore exists the server
/// refuses another one ([`Error::LimitMismatch`]), so that two versions of a
/// service cannot silently disagree on the bound — change it on purpose with
/// [`set_limit`](Self::set_limit).
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run(warden: warden_client::Warden) -> warden_client::Result<()> {
/// // At most 10 imports at once; a big one takes 3 permits.
/// let imports = warden.semaphore("imports", 10).ttl(Duration::from_secs(60)).watchdog(true);
/// if let Some(guard) = imports.clone().permits(3).wait(Duration::from_secs(5)).acquire().await? {
///     // ... guard.token() to the store, guard.lost() beside the work ...
///     guard.release().await?;
/// }
/// // Without waiting: None when fewer than 1 permit is free.
/// let quick = imports.try_acquire().await?;
/// drop(quick); // released in the background
/// # Ok(())
/// # }
/// ```
///
/// The wait is FIFO and never overtaken: a request for 3 permits is granted
/// before a later request for 1, even while 1 is free.
#[derive(Clone)]
#[must_use = "a semaphore does nothing until `.acquire()` is awaited"]
pub struct Semaphore {
    warden: Warden,
    key: String,
    limit: u32,
    permits: u32,
    ttl: Duration,
    wait: Duration,
    watchdog: bool,
    owner: Option<String>,
    max_queue: Option<u64>,
}

/// What `SEM.INFO` reports of a semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The bound on the permits held at once.
    pub limit: u32,
    /// The permits held now (above `limit` for a while after it was lowered).
    pub used: u32,
    /// The owners holding permits.
    pub holders: u64,
    /// The requests queued.
    pub waiters: u64,
}

impl Semaphore {
    pub(crate) fn new(warden: Warden, key: String, limit: u32) -> Self {
        Semaphore {
            warden,
            key,
            limit,
            permits: 1,
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            watchdog: false,
            owner: None,
            max_queue: None,
        }
    }

    /// Permits per hold (default 1), from 1 to the limit.
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Each hold's lease (default 30 s); at least 1 ms. The guard counts as
    /// lost a safety margin before it ends ([`Config`](crate::Config)).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// How long [`acquire`](Self::acquire) waits for its permits (default
    /// and zero: until granted), measured from the call: free permits are
    /// taken in one round trip on the shared connection; otherwise the
    /// request waits server-side on a dedicated connection with `WAIT` set to
    /// what remains of `timeout` when it is sent (less a few ms for the
    /// reply's way back). A grant that still reaches the client after
    /// `timeout` is given back and the acquire answers `None`.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = timeout;
        self
    }

    /// Load shedding (`QUEUE n`): when `n` or more requests already wait on
    /// the semaphore, [`acquire`](Self::acquire) answers `None` at once
    /// instead of queueing (as if its wait had run out). Needs a server whose
    /// warden knows `QUEUE`; `n` at most 2^46.
    pub fn max_queue(mut self, n: u64) -> Self {
        self.max_queue = Some(n);
        self
    }

    /// Renew each hold's lease every ttl/3 while its guard lives.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Acquire as `owner` instead of a fresh owner id per acquire. An owner
    /// has one hold at a time: while it holds permits, another acquire of it
    /// is refused (`Error::Server`, `owner already holds this semaphore`).
    /// A cancelled acquire of such an owner is not given back (see
    /// [`LockRequest::acquire`](crate::LockRequest::acquire)).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The limit this handle's acquires state.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The permits, at once if free, else after waiting in the server's
    /// queue (up to [`wait`](Self::wait)); `None` if the wait ran out or the
    /// request was shed ([`max_queue`](Self::max_queue)). Cancelling it
    /// (dropping the future) takes it out of the queue and gives back a
    /// grant that was already on its way, as for locks
    /// ([`LockRequest::acquire`](crate::LockRequest::acquire)).
    pub async fn acquire(&self) -> Result<Option<SemaphoreGuard>> {
        self.acquire_within(Some(self.wait)).await
    }

    /// The permits if they are free now (and nobody is queued); else `None`.
    pub async fn try_acquire(&self) -> Result<Option<SemaphoreGuard>> {
        self.acquire_within(None).await
    }

    async fn acquire_within(&self, wait: Option<Duration>) -> Result<Option<SemaphoreGuard>> {
        let span = tracing::debug_span!(
            "warden.acquire",
            key = %self.key,
            kind = "semaphore",
            permits = self.permits,
            wait_ms = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        self.acquire_inner(wait).instrument(span).await
    }

    async fn acquire_inner(&self, wait: Option<Duration>) -> Result<Option<SemaphoreGuard>> {
        if let Some(owner) = &self.owner {
            crate::hold::lend(owner); // before the send: see `lend`
        }
        let owner = self.owner.clone().unwrap_or_else(crate::owner::fresh);
        let (token, sent, granted) = acquire_capped(&self.warden, self.ttl, wait, |lease| {
            let mut cmd = redis::cmd("SEM.ACQUIRE");
            cmd.arg(&self.key)
                .arg(&owner)
                .arg(millis(lease, 1))
                .arg("LIMIT")
                .arg(self.limit)
                .arg("PERMITS")
                .arg(self.permits);
            Acquire {
                warden: &self.warden,
                cmd,
                key: &self.key,
                owner: &owner,
                fresh: self.owner.is_none(),
                verbs: VERBS,
                max_queue: self.max_queue,
            }
        })
        .await
        .map_err(Error::limit_mismatch)?;
        let Some(token) = token else {
            return Ok(None);
        };
        Ok(Some(SemaphoreGuard {
            permits: self.permits,
            hold: Hold::new(
                self.warden.clone(),
                VERBS,
                self.key.clone(),
                owner,
                token,
                self.ttl,
                granted,
                sent,
                self.watchdog,
                self.owner.is_none(),
            ),
        }))
    }

    /// Changes the semaphore's limit to `limit` (`SEM.SETLIMIT`), and the
    /// limit this handle's acquires state. Waiters that now fit are granted
    /// at once; holds above a lowered limit run to their release or lease
    /// end, and queued requests for more than `limit` permits fail.
    /// `false`: no semaphore exists (nobody holds permits) — the next
    /// acquire creates it with `limit`.
    pub async fn set_limit(&mut self, limit: u32) -> Result<bool> {
        let mut cmd = redis::cmd("SEM.SETLIMIT");
        cmd.arg(&self.key).arg(limit);
        let changed = self.warden.query::<i64>(&cmd).await? == 1;
        self.limit = limit;
        Ok(changed)
    }

    /// The semaphore's state (`SEM.INFO`), or `None` if it does not exist.
    pub async fn info(&self) -> Result<Option<SemaphoreInfo>> {
        let mut cmd = redis::cmd("SEM.INFO");
        cmd.arg(&self.key);
        let Some(fields) = self
            .warden
            .query::<Option<HashMap<String, i64>>>(&cmd)
            .await?
        else {
            return Ok(None);
        };
        let field = |name: &str| fields.get(name).copied().unwrap_or(0).max(0);
        Ok(Some(SemaphoreInfo {
            limit: u32::try_from(field("limit")).unwrap_or(u32::MAX),
            used: u32::try_from(field("used")).unwrap_or(u32::MAX),
            holders: field("holders") as u64,
            waiters: field("waiters") as u64,
        }))
    }
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("key", &self.key)
            .field("limit", &self.limit)
            .field("permits", &self.permits)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("watchdog", &self.watchdog)
            .field("max_queue", &self.max_queue)
            .finish()
    }
}

/// Permits held on a semaphore. [`release`](Self::release) gives them back;
/// dropping the guard releases them in the background (on the runtime they
/// were acquired on; if that runtime is gone, the lease ends the hold).
#[must_use = "dropping the guard releases the permits"]
pub struct SemaphoreGuard {
    permits: u32,
    hold: Hold,
}

impl SemaphoreGuard {
    /// The fencing token of this hold: higher than every earlier hold's on
    /// the key.
    pub fn token(&self) -> i64 {
        self.hold.token()
    }

    pub fn key(&self) -> &str {
        self.hold.key()
    }

    /// The owner id the permits are held under.
    pub fn owner(&self) -> &str {
        self.hold.owner()
    }

    /// The permits this hold has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// See [`LockGuard::lease_end`](crate::LockGuard::lease_end).
    pub fn lease_end(&self) -> Instant {
        self.hold.lease_end()
    }

    /// See [`LockGuard::deadline`](crate::LockGuard::deadline).
    pub fn deadline(&self) -> Instant {
        self.hold.deadline()
    }

    /// Whether the hold is lost or may be: the deadline has passed, or a
    /// renewal or [`extend`](Self::extend) was answered "not held".
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when [`is_lost`](Self::is_lost) becomes true.
    pub async fn lost(&self) {
        self.hold.lost().await
    }

    /// See [`LockGuard::lost_watch`](crate::LockGuard::lost_watch).
    pub fn lost_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.hold.lost_watch()
    }

    /// Resets the lease to `ttl`, dated from this request's send; `false` if
    /// the hold is gone (the guard is then lost).
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        self.hold.extend(ttl).await
    }

    /// Gives the permits back, after stopping the watchdog:
    /// [`Release::Released`], or [`Release::NotHeld`] if the lease had ended.
    pub async fn release(self) -> Result<Release> {
        Ok(match self.hold.release().await? {
            1 => Release::Released,
            _ => Release::NotHeld,
        })
    }
}

impl std::fmt::Debug for SemaphoreGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreGuard")
            .field("key", &self.key())
            .field("owner", &self.owner())
            .field("permits", &self.permits)
            .field("token", &self.token())
            .finish()
    }
}
