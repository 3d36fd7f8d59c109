//! Rate limiters (`RATE.*`): `count` tokens per `period`, at most `burst`
//! at once (GCRA, computed exactly by the server).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::millis;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::Warden;

/// A rate limiter on one key: `count` tokens every `period`, at most
/// `burst` (default `count`) at once. Made by [`Warden::rate_limiter`];
/// options set once, then [`acquire`](Self::acquire) or
/// [`try_acquire`](Self::try_acquire) per request. Cheap to clone.
///
/// Every request states the rate; while the limiter exists the server
/// refuses another one (`Error::Server`, `limiter rate is ...`), so that two
/// versions of a service cannot silently disagree on the bound — change it
/// on purpose with [`set_rate`](Self::set_rate).
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn run(warden: warden_client::Warden) -> warden_client::Result<()> {
/// // 10 calls a second to the partner's API, 20 at once after a quiet spell.
/// let partner = warden
///     .rate_limiter("partner:api", 10, Duration::from_secs(1))
///     .burst(20)
///     .wait(Duration::from_secs(2));
/// let d = partner.acquire(1).await?; // waits in the server's FIFO queue
/// if d.allowed {
///     // ... call the API ...
/// } else {
///     // not within 2 s: d.retry_after says when it would have been
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a rate limiter does nothing until `.acquire()` is awaited"]
pub struct RateLimiter {
    warden: Warden,
    key: String,
    count: u64,
    period: Duration,
    burst: Option<u64>,
    wait: Option<Duration>,
    max_queue: Option<u64>,
}

/// A limiter's answer to one request (`RATE.ACQUIRE`'s reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateDecision {
    /// The tokens were taken.
    pub allowed: bool,
    /// The limiter's burst (its bucket's size).
    pub burst: u64,
    /// Whole tokens left.
    pub remaining: u64,
    /// When the request would conform (counting the waiters ahead), for a
    /// request that was not allowed; `None` when allowed, or when a wait
    /// ended without an answer (its deadline passed, it was shed).
    pub retry_after: Option<Duration>,
    /// When the bucket is full again.
    pub reset_after: Duration,
}

/// What `RATE.INFO` reports of a limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateInfo {
    pub count: u64,
    pub period: Duration,
    pub burst: u64,
    /// Whole tokens available now.
    pub remaining: u64,
    /// When the bucket is full again.
    pub reset_after: Duration,
    /// Requests queued.
    pub waiters: u64,
}

impl RateDecision {
    fn from_words(words: &[i64]) -> Result<Self> {
        let [limited, burst, remaining, retry, reset] = words else {
            return Err(Error::Client(
                format!("RATE.ACQUIRE answered {} integers, not 5", words.len()).into(),
            ));
        };
        let ms = |n: i64| Duration::from_millis(n.max(0) as u64);
        Ok(RateDecision {
            allowed: *limited == 0,
            burst: (*burst).max(0) as u64,
            remaining: (*remaining).max(0) as u64,
            retry_after: (*retry >= 0 && *limited != 0).then(|| ms(*retry)),
            reset_after: ms(*reset),
        })
    }

    /// Not allowed, with no retry-after: a wait that ended unanswered.
    fn unanswered(burst: u64) -> Self {
        RateDecision {
            allowed: false,
            burst,
            remaining: 0,
            retry_after: None,
            reset_after: Duration::ZERO,
        }
    }
}

impl RateLimiter {
    pub(crate) fn new(warden: Warden, key: String, count: u64, period: Duration) -> Self {
        RateLimiter {
            warden,
            key,
            count,
            period,
            burst: None,
            wait: None,
            max_queue: None,
        }
    }

    /// The most tokens taken at once (the bucket's size); default `count`.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// How long [`acquire`](Self::acquire) waits in the server's FIFO queue
    /// (zero: until the tokens conform), measured from the call. A request
    /// that cannot conform within it is answered at once, not allowed.
    /// Without it, `acquire` does not wait.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// Load shedding (`QUEUE n`): when `n` or more requests already wait,
    /// [`acquire`](Self::acquire) answers at once instead of queueing.
    pub fn max_queue(mut self, n: u64) -> Self {
        self.max_queue = Some(n);
        self
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    fn command(&self, name: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(&self.key)
            .arg(self.count)
            .arg(millis(self.period, 0));
        if let Some(burst) = self.burst {
            cmd.arg("BURST").arg(burst);
        }
        cmd
    }

    /// `cost` tokens: at once if they conform (and nobody waits ahead), else
    /// after waiting in the server's queue up to [`wait`](Self::wait) when
    /// one is set. Cancelling it (dropping the future) takes the request out
    /// of the queue; tokens a grant took that never reached the caller are
    /// given back (`RATE.REFUND`) — only a grant the client saw, so a
    /// cancel never gives back more than was taken.
    pub async fn acquire(&self, cost: u64) -> Result<RateDecision> {
        let first = self.try_acquire(cost).await?;
        let Some(wait) = self.wait else {
            return Ok(first);
        };
        if first.allowed {
            return Ok(first);
        }
        let deadline = Deadline::after(wait);
        // Cannot conform in time: the server would answer the same at once.
        if let (Some(retry), Some(left)) = (first.retry_after, deadline.remaining()) {
            if retry > left {
                return Ok(first);
            }
        }
        self.wait_on_server(cost, deadline, first.burst).await
    }

    /// `cost` tokens if they conform now and nobody waits ahead.
    pub async fn try_acquire(&self, cost: u64) -> Result<RateDecision> {
        let mut cmd = self.command("RATE.ACQUIRE");
        cmd.arg("COST").arg(cost);
        let words: Vec<i64> = self.warden.query(&cmd).await?;
        RateDecision::from_words(&words)
    }

    async fn wait_on_server(
        &self,
        cost: u64,
        deadline: Deadline,
        burst: u64,
    ) -> Result<RateDecision> {
        let warden = &self.warden;
        let Some(link) = deadline.within(warden.dedicated()).await else {
            return Ok(RateDecision::unanswered(burst));
        };
        let link = link?;
        let Some(wait_ms) = deadline.wait_arg() else {
            warden.recycle(link);
            return Ok(RateDecision::unanswered(burst));
        };
        let mut cmd = self.command("RATE.ACQUIRE");
        cmd.arg("COST").arg(cost).arg("WAIT").arg(wait_ms);
        if let Some(n) = self.max_queue {
            cmd.arg("QUEUE").arg(n);
        }
        let id = link.client_id();
        let limit = warden.wait_limit(Duration::from_millis(wait_ms));
        // The request runs in a task of its own, which outlives this future:
        // if the caller goes away, the task still reads the answer and gives
        // back the tokens of a grant nobody received. Invariant: a refund
        // follows only a grant read from the server (never a guess).
        let (tx, rx) = oneshot::channel();
        let (task_warden, key) = (warden.clone(), self.key.clone());
        // Who owns the link's fate: the task once it read the reply, or the
        // cancel once it took the request out of the queue. Invariant: the
        // cancel's `CLIENT UNBLOCK`/`KILL` only ever names a link that is
        // not back in the pool (another request may own it by then).
        let state = Arc::new(AtomicU8::new(WAITING));
        let task_state = state.clone();
        tokio::spawn(async move {
            let reply = link.query::<Option<Vec<i64>>>(&cmd, limit).await;
            let taken = matches!(&reply, Ok(Some(words)) if words.first() == Some(&0));
            let answered = matches!(reply, Ok(_) | Err(Error::Server { .. }));
            let ours = task_state
                .compare_exchange(WAITING, READ, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if tx.send(reply).is_err() && taken {
                refund_in_background(&task_warden, &key, cost).await;
            }
            // A link a cancel named is dropped (closed), never reused.
            if answered && ours {
                task_warden.recycle(link);
            }
        });
        let mut leave = Leave {
            warden: warden.clone(),
            id,
            state,
            armed: true,
        };
        let reply = rx.await;
        leave.armed = false;
        let reply = reply.map_err(|_| Error::Client("the waiting request's task ended".into()))?;
        let Some(words) = reply? else {
            return Ok(RateDecision::unanswered(burst));
        };
        let decision = RateDecision::from_words(&words)?;
        if decision.allowed && deadline.passed() {
            // Granted, but after the caller's deadline: given back.
            refund_in_background(warden, &self.key, cost).await;
            return Ok(RateDecision::unanswered(burst));
        }
        Ok(decision)
    }

    /// Gives `cost` tokens back (`RATE.REFUND`): for a request whose work did
    /// not happen. `false`: no limiter (its bucket is full).
    pub async fn refund(&self, cost: u64) -> Result<bool> {
        let mut cmd = redis::cmd("RATE.REFUND");
        cmd.arg(&self.key).arg(cost);
        Ok(self.warden.query::<i64>(&cmd).await? == 1)
    }

    /// Changes the limiter's rate (`RATE.CONFIG`), keeping the tokens
    /// already owed, and the rate this handle's requests state. `false`: no
    /// limiter exists — the next request creates it at the new rate.
    pub async fn set_rate(
        &mut self,
        count: u64,
        period: Duration,
        burst: Option<u64>,
    ) -> Result<bool> {
        self.count = count;
        self.period = period;
        self.burst = burst;
        let cmd = self.command("RATE.CONFIG");
        Ok(self.warden.query::<i64>(&cmd).await? == 1)
    }

    /// The limiter's state (`RATE.INFO`), or `None` if its bucket is full
    /// and nobody waits.
    pub async fn info(&self) -> Result<Option<RateInfo>> {
        let mut cmd = redis::cmd("RATE.INFO");
        cmd.arg(&self.key);
        let Some(fields) = self
            .warden
            .query::<Option<HashMap<String, i64>>>(&cmd)
            .await?
        else {
            return Ok(None);
        };
        let field = |name: &str| fields.get(name).copied().unwrap_or(0).max(0) as u64;
        Ok(Some(RateInfo {
            count: field("count"),
            period: Duration::from_millis(field("period")),
            burst: field("burst"),
            remaining: field("remaining"),
            reset_after: Duration::from_millis(field("reset_after")),
            waiters: field("waiters"),
        }))
    }
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("key", &self.key)
            .field("count", &self.count)
            .field("period", &self.period)
            .field("burst", &self.burst)
            .field("wait", &self.wait)
            .field("max_queue", &self.max_queue)
            .finish_non_exhaustive()
    }
}

async fn refund_in_background(warden: &Warden, key: &str, cost: u64) {
    let mut cmd = redis::cmd("RATE.REFUND");
    cmd.arg(key).arg(cost);
    match warden.query::<i64>(&cmd).await {
        Ok(_) => tracing::debug!(key, cost, "gave back tokens its caller did not take"),
        Err(e) => tracing::debug!(key, error = %e, "could not give back a cancelled grant"),
    }
}

/// Takes a waiting request out of the server's queue when its caller goes
/// away: `CLIENT UNBLOCK` (Redis 7.4+, Valkey 8+: answered nil, nothing
/// taken); where it answers 0 (an older server, or an answer already on its
/// way), `CLIENT KILL ID`: the server drops the waiter, which takes nothing,
/// and the task reading the link still sees (and gives back) a grant
/// written before the kill. A grant written but lost with the connection
/// took tokens nobody used: fewer admitted, never more.
struct Leave {
    warden: Warden,
    id: Option<i64>,
    state: Arc<AtomicU8>,
    armed: bool,
}

/// The waiting request's link: still waiting, its reply read (the task
/// may recycle it), or cancelled (the task drops it).
const WAITING: u8 = 0;
const READ: u8 = 1;
const CANCELLED: u8 = 2;

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The reply was read: the task gives back a grant nobody received,
        // and the link may already serve another request: leave it alone.
        if self
            .state
            .compare_exchange(WAITING, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let (Some(id), Ok(runtime)) = (self.id, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let warden = self.warden.clone();
        runtime.spawn(async move {
            let mut unblock = redis::cmd("CLIENT");
            unblock.arg("UNBLOCK").arg(id);
            // Never sent where it cannot end a module's wait (Redis 7.0
            // crashes on one naming a client held back by CLIENT PAUSE).
            if !warden.unblock_works().await
                || !matches!(warden.query::<i64>(&unblock).await, Ok(1))
            {
                let mut kill = redis::cmd("CLIENT");
                kill.arg("KILL").arg("ID").arg(id);
                let _ = warden.query::<redis::Value>(&kill).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_decisions() {
        let d = RateDecision::from_words(&[0, 10, 9, -1, 100]).unwrap();
        assert!(d.allowed && d.remaining == 9 && d.retry_after.is_none());
        assert_eq!(d.reset_after, Duration::from_millis(100));
        let d = RateDecision::from_words(&[1, 10, 0, 250, 1000]).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(250)));
        assert!(RateDecision::from_words(&[0, 1]).is_err());
    }
}
