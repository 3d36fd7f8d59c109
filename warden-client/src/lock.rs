//! Lock requests and guards, for `LOCK.*` and `RWLOCK.*` alike.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::millis;
use crate::error::Result;
use crate::hold::{acquire_capped, Acquire, Hold, Verbs};
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

    fn extend(self) -> &'static str {
        match self {
            LockKind::Exclusive => "LOCK.EXTEND",
            _ => "RWLOCK.EXTEND",
        }
    }

    fn verbs(self) -> Verbs {
        Verbs {
            release: self.release(),
            extend: self.extend(),
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
/// Every acquire is its own owner (a fresh UUID), so two acquires never share
/// a hold — also when they run concurrently inside one task:
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run(warden: warden_client::Warden) -> warden_client::Result<()> {
/// let one = || async {
///     let guard = warden.lock("inventory").wait(Duration::from_secs(5)).acquire().await?;
///     // ... the critical section: one future at a time ...
///     if let Some(guard) = guard {
///         guard.release().await?;
///     }
///     Ok::<_, warden_client::Error>(())
/// };
/// // Three futures in one task: they take turns, each with its own token.
/// let (a, b, c) = tokio::join!(one(), one(), one());
/// a?; b?; c?;
/// # Ok(())
/// # }
/// ```
///
/// Re-entrancy (the same owner acquiring again: one more hold, the same
/// token) is only on request, with an owner of your choosing
/// ([`reentrant`](Self::reentrant)).
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
    owner: Option<String>,
    max_queue: Option<u64>,
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
            owner: None,
            max_queue: None,
        }
    }

    /// The lease (default 30 s); at least 1 ms. The guard counts as lost a
    /// safety margin before it ends ([`Config`](crate::Config)).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// Wait up to `timeout` if the lock is busy (zero: forever), measured
    /// from the call to [`acquire`](Self::acquire): a free lock is taken in
    /// one round trip on the shared connection; a busy one is waited for
    /// server-side on a dedicated connection, with `WAIT` set to what remains
    /// of `timeout` when it is sent (less a few ms for the reply's way back).
    /// The server never grants it past that; a grant that still reaches the
    /// client after `timeout` is given back and the acquire answers `None`.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// Load shedding (`QUEUE n`): when `n` or more requests already wait for
    /// the lock, a waiting acquire answers `None` at once instead of queueing
    /// (as if its wait had run out). Needs a server whose warden knows
    /// `QUEUE`; `n` at most 2^46.
    pub fn max_queue(mut self, n: u64) -> Self {
        self.max_queue = Some(n);
        self
    }

    /// Renew the lease every ttl/3 while the guard lives.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Acquire as `owner` instead of a fresh owner id: acquiring again with
    /// the same owner while it holds the lock is re-entrant (one more hold,
    /// the same token; each guard releases one hold). Use one owner per
    /// logical holder — not per task: futures joined in one task are
    /// different holders ([`Warden::new_owner`] makes a unique one).
    pub fn reentrant(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The guard, or `None` if the lock stayed busy (for the whole
    /// [`wait`](Self::wait), or shed by [`max_queue`](Self::max_queue)).
    ///
    /// Each request is sent once: if its connection breaks, the caller gets
    /// [`Error::Connection`](crate::Error::Connection). A request that fails
    /// or is cancelled (its future dropped, by `tokio::time::timeout` or
    /// `tokio::select!`) before its reply came in is taken out of the
    /// server's queue at once: `WARDEN.WITHDRAW key owner` (the connection
    /// is kept); where that takes nothing out or is refused, `CLIENT
    /// UNBLOCK` of its connection (Redis 7.4+, Valkey 8+; the connection is
    /// kept), else that connection is closed. A grant that was already on its way is given back in the
    /// background with a fresh owner (`LOCK.RELEASE`/`RWLOCK.UNLOCK key
    /// owner`, which only the grant this request got can answer). With
    /// [`reentrant`](Self::reentrant) nothing is released: the client cannot
    /// tell a hold the cancelled request got from one the owner already had.
    pub async fn acquire(self) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!(
            "warden.acquire",
            key = %self.key,
            kind = ?self.kind,
            wait_ms = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        self.acquire_inner().instrument(span).await
    }

    async fn acquire_inner(self) -> Result<Option<LockGuard>> {
        let fresh = self.owner.is_none();
        if let Some(owner) = &self.owner {
            crate::hold::lend(owner); // before the send: see `lend`
        }
        let owner = self.owner.unwrap_or_else(crate::owner::fresh);
        let (token, sent, granted) = acquire_capped(&self.warden, self.ttl, self.wait, |lease| {
            let mut cmd = redis::cmd(self.kind.acquire());
            cmd.arg(&self.key).arg(&owner).arg(millis(lease, 1));
            Acquire {
                warden: &self.warden,
                cmd,
                key: &self.key,
                owner: &owner,
                fresh,
                verbs: self.kind.verbs(),
                max_queue: self.max_queue,
            }
        })
        .await?;
        let Some(token) = token else {
            return Ok(None);
        };
        Ok(Some(LockGuard {
            kind: self.kind,
            hold: Hold::new(
                self.warden,
                self.kind.verbs(),
                self.key,
                owner,
                token,
                self.ttl,
                granted,
                sent,
                self.watchdog,
                fresh,
            ),
        }))
    }
}

/// A held lock. [`release`](LockGuard::release) lets it go; dropping the
/// guard releases it in the background (on the runtime it was acquired on;
/// if that runtime is gone, the lease ends it).
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    kind: LockKind,
    hold: Hold,
}

impl LockGuard {
    /// The fencing token of this grant.
    pub fn token(&self) -> i64 {
        self.hold.token()
    }

    pub fn key(&self) -> &str {
        self.hold.key()
    }

    /// The owner id the lock is held under.
    pub fn owner(&self) -> &str {
        self.hold.owner()
    }

    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The lease end as far as this client can be sure: the send time of the
    /// last grant or renewal plus its ttl. The server's lease ends no earlier.
    pub fn lease_end(&self) -> Instant {
        self.hold.lease_end()
    }

    /// When the guard counts as lost unless renewed: [`lease_end`](Self::lease_end)
    /// minus the safety margin ([`Config::margin`](crate::Config::margin)).
    pub fn deadline(&self) -> Instant {
        self.hold.deadline()
    }

    /// Whether the lock is lost or may be: the [`deadline`](Self::deadline)
    /// has passed (with a watchdog or without), or a renewal or
    /// [`extend`](Self::extend) was answered "not held".
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when [`is_lost`](Self::is_lost) becomes true; made for
    /// `tokio::select!` beside the work the lock protects.
    pub async fn lost(&self) {
        self.hold.lost().await
    }

    /// The "not held" flag as a `watch` channel (`true` once a renewal or an
    /// extend was refused, or the watchdog ran out of time).
    pub fn lost_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.hold.lost_watch()
    }

    /// Resets the lease to `ttl`, dated from this request's send; `false` if
    /// the lock is no longer held (the guard is then lost).
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        self.hold.extend(ttl).await
    }

    /// Releases the lock, after stopping the watchdog.
    pub async fn release(self) -> Result<Release> {
        let released = match self.hold.release().await? {
            1 => Release::Released,
            0 => Release::HoldsRemain,
            _ => Release::NotHeld,
        };
        Ok(released)
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("kind", &self.kind)
            .field("key", &self.key())
            .field("owner", &self.owner())
            .field("token", &self.token())
            .finish()
    }
}
