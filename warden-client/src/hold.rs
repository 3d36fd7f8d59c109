//! What lock and semaphore guards share: sending an acquire so that a grant
//! crossing its cancellation is given back, and the grant once held — its
//! lease, its watchdog, its release when dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Cmd;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{millis, Link};
use crate::deadline::Deadline;
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

/// One acquire: the command (key, owner, ttl and options; `WAIT` and
/// `QUEUE` are added here), whether its owner is fresh, and what releases a
/// grant to it.
pub(crate) struct Acquire<'a> {
    pub(crate) warden: &'a Warden,
    pub(crate) cmd: Cmd,
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    /// Only a fresh owner's grant can be given back: an owner of the
    /// caller's choosing may hold something the release would take too.
    pub(crate) fresh: bool,
    pub(crate) verbs: Verbs,
    /// `QUEUE n`: the request is answered nil at once when `n` or more
    /// already wait on the key.
    pub(crate) max_queue: Option<u64>,
}

impl Acquire<'_> {
    /// Sends the acquire and returns its token (`None`: not granted) and the
    /// time the granting request was sent, from which its lease is dated.
    ///
    /// First without `WAIT` on the shared connection: free capacity is
    /// granted in one round trip (a queued waiter is never overtaken: the
    /// server answers nil then). Only a busy answer goes on, when `wait` is
    /// given, to a dedicated connection with `WAIT` = what remains of the
    /// caller's deadline (zero: no end). A grant that comes in after the
    /// deadline, or races the cancellation of this future, is given back.
    pub(crate) async fn send(self, wait: Option<Duration>) -> Result<(Option<i64>, Instant)> {
        let deadline = wait.map(Deadline::after);
        let (warden, fresh) = (self.warden, self.fresh);
        // Armed while a request is out: if this future is dropped (or the
        // request fails) before the reply is in, a grant may be on its way.
        let mut give_back = GiveBack {
            warden: warden.clone(),
            release: self.verbs.release,
            key: self.key.to_string(),
            owner: self.owner.to_string(),
            link: None,
            armed: fresh,
        };
        // The server grants after it receives the request, so its lease
        // ends no earlier than `sent + ttl`.
        let sent = Instant::now();
        let reply = warden.query::<Option<i64>>(&self.cmd).await;
        let (reply, sent) = match (reply, deadline) {
            (Ok(None), Some(deadline)) => {
                // Busy: nothing was granted, nothing to give back until the
                // waiting request is out.
                give_back.armed = false;
                let Some(waited) = self.wait(deadline, &mut give_back).await else {
                    tracing::debug!("deadline passed before the wait was sent");
                    return Ok((None, sent));
                };
                waited
            }
            (reply, _) => (reply, sent),
        };
        // An error reply is an answer: the request was refused, nothing granted.
        if matches!(reply, Ok(_) | Err(Error::Server { .. })) {
            give_back.armed = false;
        }
        let mut token = reply?;
        if token.is_some() && deadline.is_some_and(|d| d.passed()) {
            // The caller has given up: the grant goes back, the call times out.
            tracing::debug!("granted after the caller's deadline: given back");
            give_back.armed = fresh;
            token = None;
        }
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

    /// The waiting request on a dedicated connection, got within the
    /// deadline; its reply and send time, or `None` if the deadline passed
    /// before it could be sent. While it is out, `give_back` holds the
    /// connection and is armed.
    async fn wait(
        mut self,
        deadline: Deadline,
        give_back: &mut GiveBack,
    ) -> Option<(Result<Option<i64>>, Instant)> {
        let warden = self.warden;
        // Waiting for a connection counts against the deadline, never past it.
        let link = match deadline.within(warden.dedicated()).await? {
            Ok(link) => link,
            Err(e) => return Some((Err(e), Instant::now())),
        };
        // Computed as it is sent: the time spent getting here is already gone.
        let Some(wait_ms) = deadline.wait_arg() else {
            warden.recycle(link);
            return None;
        };
        self.cmd.arg("WAIT").arg(wait_ms);
        if let Some(n) = self.max_queue {
            self.cmd.arg("QUEUE").arg(n);
        }
        give_back.armed = self.fresh;
        let link = give_back.link.insert(link);
        let sent = Instant::now();
        let limit = warden.wait_limit(Duration::from_millis(wait_ms));
        let reply = link.query::<Option<i64>>(&self.cmd, limit).await;
        // An answer leaves the link as it was: nothing is pending on it.
        if matches!(reply, Ok(_) | Err(Error::Server { .. })) {
            if let Some(link) = give_back.link.take() {
                warden.recycle(link);
            }
        }
        Some((reply, sent))
    }
}

/// Sends the acquire that `make` builds for a lease (`ttl`, or the server's
/// cap when one was learnt and is shorter): its token, send time and the
/// lease it asked for. A refusal above the server's `warden.max-lease` (the
/// command did nothing) teaches the cap, and the acquire goes again at it.
pub(crate) async fn acquire_capped<'a>(
    warden: &Warden,
    ttl: Duration,
    wait: Option<Duration>,
    mut make: impl FnMut(Duration) -> Acquire<'a>,
) -> Result<(Option<i64>, Instant, Duration)> {
    let mut lease = warden.capped(ttl);
    for attempt in 0.. {
        match make(lease).send(wait).await {
            Ok((token, sent)) => return Ok((token, sent, lease)),
            Err(e) => match lease::cap_of(&e) {
                Some(cap) if cap < millis(lease, 1) && attempt < 2 => {
                    tracing::debug!(cap_ms = cap, "above warden.max-lease: asking for the cap");
                    warden.learn_cap(cap);
                    lease = Duration::from_millis(cap.max(1));
                }
                _ => return Err(e),
            },
        }
    }
    unreachable!("the loop returns")
}

/// Gives back, when dropped armed, what the server may have granted a fresh
/// owner whose acquire was cancelled or failed before its reply came in.
///
/// A waiting request is taken out of the server's queue first, from the
/// shared connection: `WARDEN.WITHDRAW key owner` (every server; the owner
/// is fresh, so this request is its only one) answers it nil and never
/// grants it after, so its connection is kept once that reply is read, and
/// nothing needs giving back. Where it took nothing out (a grant on its way,
/// the request not arrived yet) or is refused (an older module, an ACL):
/// `CLIENT UNBLOCK` (Redis 7.4+, Valkey 8+), likewise; where that answers 0
/// the connection is killed instead (`CLIENT KILL ID`: the server drops the
/// waiter before the release below arrives; dropping the link alone closes
/// its socket only some time later), then the release: owner-checked, it can
/// only free this request's grant.
struct GiveBack {
    warden: Warden,
    release: &'static str,
    key: String,
    owner: String,
    link: Option<Link>,
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
        let (release_cmd, link) = (self.release, self.link.take());
        let key = std::mem::take(&mut self.key);
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            if let Some(link) = link {
                if warden.withdraw(&key, &owner).await {
                    // Answered nil: the link is clean once a PING sent
                    // after that reply is answered; nothing was granted.
                    tracing::debug!(key, "withdrew a cancelled wait from the queue");
                    if link.alive(warden.config().command_timeout).await {
                        warden.recycle(link);
                    }
                    return;
                }
                if let Some(id) = link.client_id() {
                    let mut unblock = redis::cmd("CLIENT");
                    unblock.arg("UNBLOCK").arg(id);
                    // Never sent where it cannot end a module's wait (Redis
                    // 7.0 crashes on one naming a client held back by
                    // CLIENT PAUSE): the connection is killed there.
                    let unblocked = warden.unblock_works().await
                        && matches!(warden.query::<i64>(&unblock).await, Ok(1));
                    if unblocked {
                        // Answered nil: the link is clean once a PING sent
                        // after that reply is answered.
                        tracing::debug!(key, "took a cancelled wait out of the queue");
                        if link.alive(warden.config().command_timeout).await {
                            warden.recycle(link);
                        }
                    } else {
                        let mut kill = redis::cmd("CLIENT");
                        kill.arg("KILL").arg("ID").arg(id);
                        let _ = warden.query::<redis::Value>(&kill).await;
                    }
                }
            }
            // Sent also after an unblock: a grant made in the same event-loop
            // turn as the unblock may still stand.
            let mut release = redis::cmd(release_cmd);
            release.arg(&key).arg(&owner);
            match warden.query::<i64>(&release).await {
                Ok(1) => tracing::debug!(key, "gave back a grant its caller did not take"),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(key, error = %e, "could not give back a cancelled acquire")
                }
            }
        });
    }
}

/// The fresh owners of the holds alive in this process, each with its
/// `shared` flag: set when an acquire names that owner (`reentrant`, a
/// semaphore's `owner`), before it is sent. A release whose reply is lost is
/// sent again only for an owner never shared: then a second release can end
/// nothing but that hold. Bounded by the holds alive.
static FRESH: std::sync::LazyLock<Mutex<HashMap<String, Arc<AtomicBool>>>> =
    std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));

/// Notes that an acquire about to be sent names `owner`: a live hold whose
/// fresh owner it is never has its release sent again.
pub(crate) fn lend(owner: &str) {
    if let Some(shared) = FRESH.lock().unwrap_or_else(|e| e.into_inner()).get(owner) {
        shared.store(true, Ordering::SeqCst);
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
    /// Renews every ttl/3 until released.
    watchdog: bool,
    /// Set when the owner was made for this hold (it is in `FRESH`): set
    /// to true once an acquire named it. `None`: an owner the caller chose.
    fresh: Option<Arc<AtomicBool>>,
    /// The task renewing the lease: the watchdog, or the renewals of a
    /// lease asked for beyond the server's cap.
    renewer: Mutex<Option<Renewer>>,
    runtime: Handle,
}

/// A running renewal task and what it renews: a lease of `ttl`, until `until`.
struct Renewer {
    task: JoinHandle<()>,
    ttl: Duration,
    until: Option<Instant>,
}

impl Hold {
    /// The hold of `token`, granted `granted` (at most the server's cap) to
    /// a request sent at `sent` for a lease of `ttl`; with `watchdog`,
    /// renewed every granted/3 until released; without, when `granted` is
    /// shorter than `ttl`, renewed until `ttl` after `sent` (capped and
    /// renewed). `fresh`: `owner` was made for this acquire, and holds
    /// nothing else.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        warden: Warden,
        verbs: Verbs,
        key: String,
        owner: String,
        token: i64,
        ttl: Duration,
        granted: Duration,
        sent: Instant,
        watchdog: bool,
        fresh: bool,
    ) -> Self {
        let margin = warden.config().margin(granted);
        let lease = Arc::new(Lease::new(sent + granted, margin));
        if lease.is_lost() {
            tracing::warn!(
                key,
                "granted, but the reply came after the lease's safety margin: the guard is lost"
            );
        } else {
            tracing::debug!("granted");
        }
        let fresh = fresh.then(|| {
            let shared = Arc::new(AtomicBool::new(false));
            FRESH
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(owner.clone(), shared.clone());
            shared
        });
        let held = Held {
            warden,
            verbs,
            key,
            owner,
            token,
            lease,
            watchdog,
            fresh,
            renewer: Mutex::new(None),
            runtime: Handle::current(),
        };
        if watchdog {
            held.renew(granted, None);
        } else if granted < ttl {
            held.renew(granted, Some(sent + ttl));
        }
        Hold(Some(held))
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
    /// the hold is gone (the lease is then lost). Beyond the server's cap
    /// the lease is the cap, renewed until `ttl` after the send (a hold
    /// without watchdog; a watchdog goes on renewing its own lease).
    pub(crate) async fn extend(&self, ttl: Duration) -> Result<bool> {
        let held = self.held();
        let ttl = ttl.max(Duration::from_millis(1));
        let mut lease = held.warden.capped(ttl);
        let mut attempt = 0;
        // The renewals of an earlier capped lease stop first: none may cross
        // this extend (and shorten the lease it sets). If it fails, they go on.
        let earlier = if held.watchdog {
            None
        } else {
            held.stop_renewer().await
        };
        let resume = |e: Error| {
            if let Some((ttl, until)) = earlier {
                held.renew(ttl, until);
            }
            e
        };
        let (reply, sent) = loop {
            let mut cmd = redis::cmd(held.verbs.extend);
            cmd.arg(&held.key).arg(&held.owner).arg(millis(lease, 1));
            let sent = Instant::now();
            match held.warden.query::<i64>(&cmd).await {
                Err(e) => match lease::cap_of(&e) {
                    Some(cap) if cap < millis(lease, 1) && attempt < 2 => {
                        held.warden.learn_cap(cap);
                        lease = Duration::from_millis(cap.max(1));
                        attempt += 1;
                    }
                    _ => return Err(resume(e)),
                },
                Ok(reply) => break (reply, sent),
            }
        };
        let held_still = reply == 1;
        if held_still {
            held.lease
                .renewed(sent + lease, held.warden.config().margin(lease));
            if !held.watchdog && lease < ttl {
                held.renew(lease, Some(sent + ttl));
            }
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
    /// Starts renewing a lease of `ttl` every ttl/3: until released (the
    /// watchdog, `until` `None`) or until `until`.
    fn renew(&self, ttl: Duration, until: Option<Instant>) {
        let task = tokio::spawn(
            lease::renew(
                self.warden.clone(),
                self.verbs.extend,
                self.key.clone(),
                self.owner.clone(),
                ttl,
                until,
                self.lease.clone(),
            )
            .instrument(tracing::debug_span!("warden.watchdog", key = %self.key)),
        );
        *self.renewer.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Renewer { task, ttl, until });
    }

    /// Stops the renewals and waits until they are gone, so that no renewal
    /// can be sent after this returns. Aborting is enough: a renewal already
    /// handed to the shared connection goes out before anything sent later
    /// on that connection.
    /// What the stopped task renewed: its lease and end.
    async fn stop_renewer(&self) -> Option<(Duration, Option<Instant>)> {
        let renewer = self
            .renewer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        renewer.task.abort();
        let _ = renewer.task.await;
        Some((renewer.ttl, renewer.until))
    }

    async fn release(self) -> Result<i64> {
        self.stop_renewer().await;
        let mut cmd = redis::cmd(self.verbs.release);
        cmd.arg(&self.key).arg(&self.owner);
        let outcome = self.warden.query::<i64>(&cmd).await;
        // Sent again only for an owner made for this hold and never named
        // by another acquire: a second release then ends this hold or
        // answers -1, never another's.
        let again = self
            .fresh
            .as_ref()
            .is_some_and(|shared| !shared.load(Ordering::SeqCst));
        match outcome {
            Ok(reply) => {
                tracing::debug!(key = %self.key, reply, "release");
                Ok(reply)
            }
            Err(e @ (Error::Connection(_) | Error::Timeout)) if again => {
                // No reply: the release may not have run, and the hold would
                // stay until its lease ends, held by nobody. Sent again in
                // the background (a broken shared connection is replaced
                // first) until it is answered or the lease would have ended
                // anyway. The caller still gets the error.
                tracing::debug!(key = %self.key, error = %e, "release failed: sent again");
                let runtime = self.runtime.clone();
                runtime.spawn(async move {
                    let end = self.lease.end();
                    let mut pause = Duration::from_millis(50);
                    loop {
                        match self.warden.query::<i64>(&cmd).await {
                            Ok(reply) => {
                                tracing::debug!(key = %self.key, reply, "release sent again");
                                break;
                            }
                            Err(Error::Connection(_) | Error::Timeout)
                                if Instant::now() + pause < end =>
                            {
                                tokio::time::sleep(pause).await;
                                pause = (pause * 2).min(Duration::from_secs(1));
                            }
                            Err(e) => {
                                tracing::warn!(
                                    key = %self.key,
                                    error = %e,
                                    "a release sent again failed (its lease will end)"
                                );
                                break;
                            }
                        }
                    }
                });
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for Held {
    /// Takes a fresh owner out of `FRESH`: its hold is over (released,
    /// sent again, or left to its lease with a runtime that is gone).
    fn drop(&mut self) {
        if self.fresh.is_some() {
            FRESH
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.owner);
        }
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
