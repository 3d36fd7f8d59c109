//! Lock requests and guards, for `LOCK.*` and `RWLOCK.*` alike.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::millis;
use crate::error::Result;
use crate::lease::{self, Lease};
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
        }
    }

    /// The lease (default 30 s); at least 1 ms. The guard counts as lost a
    /// safety margin before it ends ([`Config`](crate::Config)).
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

    /// Acquire as `owner` instead of a fresh owner id: acquiring again with
    /// the same owner while it holds the lock is re-entrant (one more hold,
    /// the same token; each guard releases one hold). Use one owner per
    /// logical holder — not per task: futures joined in one task are
    /// different holders ([`Warden::new_owner`] makes a unique one).
    pub fn reentrant(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The guard, or `None` if the lock stayed busy.
    ///
    /// A waiting acquire is sent once: if its connection breaks, the caller
    /// gets [`Error::Connection`](crate::Error::Connection). A request that
    /// fails or is cancelled (its future dropped, by `tokio::time::timeout`
    /// or `tokio::select!`) before its reply came in may still have been
    /// granted: with a fresh owner, the client then gives that grant back in
    /// the background (the waiting connection is closed first, then
    /// `LOCK.RELEASE`/`RWLOCK.UNLOCK key owner` is sent, which only the
    /// grant this request got can answer). With [`reentrant`](Self::reentrant)
    /// nothing is sent: the client cannot tell a hold the cancelled request
    /// got from one the owner already had.
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
        let owner = self.owner.unwrap_or_else(crate::owner::fresh);
        let mut cmd = redis::cmd(self.kind.acquire());
        cmd.arg(&self.key).arg(&owner).arg(millis(self.ttl, 1));
        // Armed while the request is out: if this future is dropped (or the
        // request fails) before the reply is in, a grant may be on its way.
        let mut give_back = GiveBack {
            warden: self.warden.clone(),
            kind: self.kind,
            key: self.key.clone(),
            owner: owner.clone(),
            link: None,
            armed: fresh,
        };
        // The lease is dated from here: the server grants after it receives
        // the request, so its lease ends no earlier than `sent + ttl`.
        let sent = Instant::now();
        let token = match self.wait {
            None => self.warden.query::<Option<i64>>(&cmd).await?,
            Some(wait) => {
                cmd.arg("WAIT").arg(millis(wait, 0));
                let link = self.warden.dedicated().await?;
                give_back.link = link.client_id();
                let token = link
                    .query::<Option<i64>>(&cmd, self.warden.wait_limit(wait))
                    .await?;
                self.warden.recycle(link);
                token
            }
        };
        give_back.armed = false;
        let span = tracing::Span::current();
        span.record("wait_ms", millis(sent.elapsed(), 0));
        let Some(token) = token else {
            tracing::debug!("busy");
            return Ok(None);
        };
        span.record("token", token);
        let margin = self.warden.config().margin(self.ttl);
        let lease = Arc::new(Lease::new(sent + self.ttl, margin));
        if lease.is_lost() {
            tracing::warn!(
                key = %self.key,
                "granted, but the reply came after the lease's safety margin: the guard is lost"
            );
        } else {
            tracing::debug!("granted");
        }
        let watchdog = self.watchdog.then(|| {
            tokio::spawn(
                lease::renew(
                    self.warden.clone(),
                    self.kind,
                    self.key.clone(),
                    owner.clone(),
                    self.ttl,
                    lease.clone(),
                )
                .instrument(tracing::debug_span!("warden.watchdog", key = %self.key)),
            )
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

/// Gives back, when dropped armed, what the server may have granted a fresh
/// owner whose acquire was cancelled or failed before its reply came in.
/// First the waiting connection is closed from the shared one (`CLIENT
/// KILL ID`, so the server drops the waiter before the release below arrives
/// — dropping the link alone closes its socket only some time later), then
/// the release: owner-checked, it can only free this request's grant.
struct GiveBack {
    warden: Warden,
    kind: LockKind,
    key: String,
    owner: String,
    link: Option<i64>,
    armed: bool,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            return; // no runtime left: the lease ends the grant
        };
        let warden = self.warden.clone();
        let (kind, link) = (self.kind, self.link);
        let key = std::mem::take(&mut self.key);
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            if let Some(id) = link {
                let mut kill = redis::cmd("CLIENT");
                kill.arg("KILL").arg("ID").arg(id);
                let _ = warden.query::<redis::Value>(&kill).await;
            }
            let mut release = redis::cmd(kind.release());
            release.arg(&key).arg(&owner);
            match warden.query::<i64>(&release).await {
                Ok(1) => tracing::debug!(key, "gave back a grant that crossed a cancelled acquire"),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(key, error = %e, "could not give back a cancelled acquire")
                }
            }
        });
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
        let released = match self.warden.query::<i64>(&cmd).await? {
            1 => Release::Released,
            0 => Release::HoldsRemain,
            _ => Release::NotHeld,
        };
        tracing::debug!(key = %self.key, ?released, "release");
        Ok(released)
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

    /// The owner id the lock is held under.
    pub fn owner(&self) -> &str {
        &self.held().owner
    }

    pub fn kind(&self) -> LockKind {
        self.held().kind
    }

    /// The lease end as far as this client can be sure: the send time of the
    /// last grant or renewal plus its ttl. The server's lease ends no earlier.
    pub fn lease_end(&self) -> Instant {
        self.held().lease.end()
    }

    /// When the guard counts as lost unless renewed: [`lease_end`](Self::lease_end)
    /// minus the safety margin ([`Config::margin`](crate::Config::margin)).
    pub fn deadline(&self) -> Instant {
        self.held().lease.deadline()
    }

    /// Whether the lock is lost or may be: the [`deadline`](Self::deadline)
    /// has passed (with a watchdog or without), or a renewal or
    /// [`extend`](Self::extend) was answered "not held".
    pub fn is_lost(&self) -> bool {
        self.held().lease.is_lost()
    }

    /// Resolves when [`is_lost`](Self::is_lost) becomes true; made for
    /// `tokio::select!` beside the work the lock protects.
    pub async fn lost(&self) {
        self.held().lease.lost().await
    }

    /// The "not held" flag as a `watch` channel (`true` once a renewal or an
    /// extend was refused, or the watchdog ran out of time).
    pub fn lost_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.held().lease.subscribe()
    }

    /// Resets the lease to `ttl`, dated from this request's send; `false` if
    /// the lock is no longer held (the guard is then lost).
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        let held = self.held();
        let ttl = ttl.max(Duration::from_millis(1));
        let mut cmd = redis::cmd(held.kind.extend());
        cmd.arg(&held.key).arg(&held.owner).arg(millis(ttl, 1));
        let sent = Instant::now();
        let held_still = held.warden.query::<i64>(&cmd).await? == 1;
        if held_still {
            held.lease
                .renewed(sent + ttl, held.warden.config().margin(ttl));
        } else {
            held.lease.mark_lost(&held.key, "extend answered: not held");
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
