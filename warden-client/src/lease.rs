//! A guard's lease as this client sees it, and the watchdog that renews it.
//!
//! The lease is dated from the moment the request was **sent**: the server
//! grants (or extends) after it received the request, so its lease ends no
//! earlier than `sent + ttl` — however late the reply arrives. The guard
//! counts the lock as lost a safety margin before that end (timer lateness
//! plus clock drift, see [`Config`](crate::Config)), so a loss is reported
//! while the server still holds the lock for us.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::millis;
use crate::error::Error;
use crate::Warden;

/// What the guard and its watchdog share.
pub(crate) struct Lease {
    term: Mutex<Term>,
    lost: watch::Sender<bool>,
}

#[derive(Clone, Copy)]
struct Term {
    /// `sent + ttl` of the last grant or renewal: never after the server's end.
    end: Instant,
    /// How long before `end` the guard counts as lost.
    margin: Duration,
}

impl Lease {
    pub(crate) fn new(end: Instant, margin: Duration) -> Self {
        Lease {
            term: Mutex::new(Term { end, margin }),
            lost: watch::Sender::new(false),
        }
    }

    fn term(&self) -> Term {
        *self.term.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn end(&self) -> Instant {
        self.term().end
    }

    /// The moment the guard counts as lost unless renewed: `end − margin`.
    pub(crate) fn deadline(&self) -> Instant {
        let Term { end, margin } = self.term();
        end.checked_sub(margin).unwrap_or(end)
    }

    pub(crate) fn renewed(&self, end: Instant, margin: Duration) {
        *self.term.lock().unwrap_or_else(|e| e.into_inner()) = Term { end, margin };
    }

    pub(crate) fn mark_lost(&self, key: &str, why: &str) {
        if !self.lost.send_replace(true) {
            tracing::warn!(key, why, "lock lost");
        }
    }

    /// Lost: flagged (not held, renewal failed), or the deadline has passed.
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow() || Instant::now() >= self.deadline()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Resolves once [`is_lost`](Self::is_lost) holds.
    pub(crate) async fn lost(&self) {
        let mut flag = self.subscribe();
        loop {
            if *flag.borrow_and_update() || Instant::now() >= self.deadline() {
                return;
            }
            // Renewals move the deadline: look again when it passes.
            tokio::select! {
                changed = flag.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(self.deadline()) => {}
            }
        }
    }
}

/// The cap in the server's refusal of a lease above `warden.max-lease`
/// (`ERR ttl exceeds warden.max-lease: expected an integer from 1 to N (ms)`).
pub(crate) fn cap_of(error: &Error) -> Option<u64> {
    let Error::Server { message, .. } = error else {
        return None;
    };
    let (_, digits) =
        message.split_once("ttl exceeds warden.max-lease: expected an integer from 1 to ")?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// Renews the lease of `ttl` every ttl/3 until aborted (the watchdog,
/// `until` `None`), or until `until` (a lease asked for beyond the server's
/// cap: capped and renewed; the last renewal asks only for what remains,
/// and the lease ends at `until`). A `0` answer (not held), or no successful
/// renewal before the deadline, marks the lease lost and ends. A refusal
/// above the cap (lowered at run time) teaches the cap, renewed at it.
pub(crate) async fn renew(
    warden: Warden,
    extend: &'static str,
    key: String,
    owner: String,
    mut ttl: Duration,
    until: Option<Instant>,
    lease: Arc<Lease>,
) {
    let mut next = lease.end() - ttl + ttl / 3;
    loop {
        if until.is_some_and(|until| lease.end() >= until) {
            return; // the lease runs to the end asked for
        }
        tokio::time::sleep_until(next.min(lease.deadline())).await;
        let sent = Instant::now();
        let deadline = lease.deadline();
        if sent >= deadline {
            lease.mark_lost(
                &key,
                "no renewal got through before the lease's safety margin",
            );
            return;
        }
        let ask = match until {
            Some(until) => ttl
                .min(until.saturating_duration_since(sent))
                .max(Duration::from_millis(1)),
            None => ttl,
        };
        let mut cmd = redis::cmd(extend);
        cmd.arg(&key).arg(&owner).arg(millis(ask, 1));
        match warden.query_within::<i64>(&cmd, deadline - sent).await {
            Ok(1) => {
                let ask = Duration::from_millis(millis(ask, 1));
                lease.renewed(sent + ask, warden.config().margin(ask));
                tracing::debug!(key, ttl_ms = millis(ask, 1), "lease renewed");
                next = sent + ttl / 3;
            }
            Ok(_) => {
                lease.mark_lost(&key, "the server says the owner no longer holds it");
                return;
            }
            Err(Error::Timeout) => next = Instant::now(),
            Err(e) => match cap_of(&e).filter(|&cap| cap < millis(ask, 1)) {
                Some(cap) => {
                    tracing::debug!(
                        key,
                        cap_ms = cap,
                        "warden.max-lease lowered: renewing at it"
                    );
                    warden.learn_cap(cap);
                    ttl = ttl.min(Duration::from_millis(cap.max(1)));
                    next = Instant::now();
                }
                None => {
                    tracing::debug!(key, error = %e, "renewal failed; retrying");
                    // After a failure, try again soon: several attempts fit in the lease left.
                    next = Instant::now() + (ttl / 20).max(Duration::from_millis(5));
                }
            },
        }
    }
}
