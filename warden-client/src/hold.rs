//! What lock and semaphore guards share: sending an acquire so that a grant
//! crossing its cancellation is given back, and the grant once held — its
//! lease, its watchdog, its release when dropped.

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::millis;
use crate::error::{Error, Result};
use crate::lease::{self, Lease};
use crate::Warden;

/// The commands that let go of a hold and renew it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Verbs {
    /// `<release> key owner`.
    pub(crate) release: &'static str,
    /// `<extend> key owner ttl`, answering `1` when renewed.
    pub(crate) extend: &'static str,
}

/// One acquire: the command (key, owner, ttl and options; `WAIT` is added
/// here), whether its owner is fresh, and what releases a grant to it.
pub(crate) struct Acquire<'a> {
    pub(crate) warden: &'a Warden,
    pub(crate) cmd: Cmd,
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    /// Only a fresh owner's grant can be given back: an owner of the
    /// caller's choosing may hold something the release would take too.
    pub(crate) fresh: bool,
    pub(crate) verbs: Verbs,
}

impl Acquire<'_> {
    /// Sends the acquire once — on the shared connection, or with `wait` on a
    /// dedicated one — and returns its token (`None`: not granted) and the
    /// time it was sent, from which its lease is dated.
    pub(crate) async fn send(mut self, wait: Option<Duration>) -> Result<(Option<i64>, Instant)> {
        let warden = self.warden;
        // Armed while the request is out: if this future is dropped (or the
        // request fails) before the reply is in, a grant may be on its way.
        let mut give_back = GiveBack {
            warden: warden.clone(),
            release: self.verbs.release,
            key: self.key.to_string(),
            owner: self.owner.to_string(),
            link: None,
            armed: self.fresh,
        };
        // The server grants after it receives the request, so its lease
        // ends no earlier than `sent + ttl`.
        let sent = Instant::now();
        let reply = match wait {
            None => warden.query::<Option<i64>>(&self.cmd).await,
            Some(wait) => {
                self.cmd.arg("WAIT").arg(millis(wait, 0));
                let link = warden.dedicated().await?;
                give_back.link = link.client_id();
                let reply = link
                    .query::<Option<i64>>(&self.cmd, warden.wait_limit(wait))
                    .await;
                // An error reply leaves the link as it was: nothing is pending on it.
                if matches!(reply, Ok(_) | Err(Error::Server { .. })) {
                    warden.recycle(link);
                }
                reply
            }
        };
        // An error reply is an answer: the request was refused, nothing granted.
        if matches!(reply, Ok(_) | Err(Error::Server { .. })) {
            give_back.armed = false;
        }
        let token = reply?;
        let span = tracing::Span::current();
        span.record("wait_ms", millis(sent.elapsed(), 0));
        match token {
            Some(token) => {
                span.record("token", token);
            }
            None => tracing::debug!("busy"),
        }
        Ok((token, sent))
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
    release: &'static str,
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
        let (release_cmd, link) = (self.release, self.link);
        let key = std::mem::take(&mut self.key);
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            if let Some(id) = link {
                let mut kill = redis::cmd("CLIENT");
                kill.arg("KILL").arg("ID").arg(id);
                let _ = warden.query::<redis::Value>(&kill).await;
            }
            let mut release = redis::cmd(release_cmd);
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

/// A grant being held: released by [`Hold::release`] or, when dropped, in
/// the background (on the runtime it was acquired on; if that runtime is
/// gone, the lease ends it).
pub(crate) struct Hold(Option<Held>);

struct Held {
    warden: Warden,
    verbs: Verbs,
    key: String,
    owner: String,
    token: i64,
    lease: Arc<Lease>,
    watchdog: Option<JoinHandle<()>>,
    runtime: Handle,
}

impl Hold {
    /// The hold of `token`, granted to a request sent at `sent` with `ttl`;
    /// with `watchdog`, renewed every ttl/3 until released.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        warden: Warden,
        verbs: Verbs,
        key: String,
        owner: String,
        token: i64,
        ttl: Duration,
        sent: Instant,
        watchdog: bool,
    ) -> Self {
        let margin = warden.config().margin(ttl);
        let lease = Arc::new(Lease::new(sent + ttl, margin));
        if lease.is_lost() {
            tracing::warn!(
                key,
                "granted, but the reply came after the lease's safety margin: the guard is lost"
            );
        } else {
            tracing::debug!("granted");
        }
        let watchdog = watchdog.then(|| {
            tokio::spawn(
                lease::renew(
                    warden.clone(),
                    verbs.extend,
                    key.clone(),
                    owner.clone(),
                    ttl,
                    lease.clone(),
                )
                .instrument(tracing::debug_span!("warden.watchdog", key = %key)),
            )
        });
        Hold(Some(Held {
            warden,
            verbs,
            key,
            owner,
            token,
            lease,
            watchdog,
            runtime: Handle::current(),
        }))
    }

    fn held(&self) -> &Held {
        self.0.as_ref().expect("a guard holds until released")
    }

    pub(crate) fn token(&self) -> i64 {
        self.held().token
    }

    pub(crate) fn key(&self) -> &str {
        &self.held().key
    }

    pub(crate) fn owner(&self) -> &str {
        &self.held().owner
    }

    pub(crate) fn lease_end(&self) -> Instant {
        self.held().lease.end()
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.held().lease.deadline()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.held().lease.is_lost()
    }

    pub(crate) async fn lost(&self) {
        self.held().lease.lost().await
    }

    pub(crate) fn lost_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.held().lease.subscribe()
    }

    /// Resets the lease to `ttl`, dated from this request's send; `false` if
    /// the hold is gone (the lease is then lost).
    pub(crate) async fn extend(&self, ttl: Duration) -> Result<bool> {
        let held = self.held();
        let ttl = ttl.max(Duration::from_millis(1));
        let mut cmd = redis::cmd(held.verbs.extend);
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

    /// Stops the watchdog, then sends the release; its integer reply.
    pub(crate) async fn release(mut self) -> Result<i64> {
        let held = self.0.take().expect("a guard holds until released");
        held.release().await
    }
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

    async fn release(mut self) -> Result<i64> {
        self.stop_watchdog().await;
        let mut cmd = redis::cmd(self.verbs.release);
        cmd.arg(&self.key).arg(&self.owner);
        let reply = self.warden.query::<i64>(&cmd).await?;
        tracing::debug!(key = %self.key, reply, "release");
        Ok(reply)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            let runtime = held.runtime.clone();
            runtime.spawn(async move {
                let _ = held.release().await;
            });
        }
    }
}
