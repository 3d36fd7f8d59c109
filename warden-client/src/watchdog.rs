//! Lease renewal: every ttl/3 a `LOCK.EXTEND` (or `RWLOCK.EXTEND`) on the
//! shared connection. A renewal answered `0` (not held), or failures until
//! the lease would have ended, mark the lock lost and end the watchdog.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::link::millis;
use crate::lock::LockKind;
use crate::Warden;

/// What the guard and its watchdog share: the lease end known here and the
/// loss flag.
pub(crate) struct Lease {
    end: Mutex<Instant>,
    lost: watch::Sender<bool>,
}

impl Lease {
    pub(crate) fn new(end: Instant) -> Self {
        Lease {
            end: Mutex::new(end),
            lost: watch::Sender::new(false),
        }
    }

    pub(crate) fn end(&self) -> Instant {
        *self.end.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn renewed(&self, end: Instant) {
        *self.end.lock().unwrap_or_else(|e| e.into_inner()) = end;
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.send_replace(true);
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }
}

pub(crate) async fn renew(
    warden: Warden,
    kind: LockKind,
    key: String,
    owner: String,
    ttl: Duration,
    lease: std::sync::Arc<Lease>,
) {
    let period = ttl / 3;
    // After a failure, try again soon: several attempts fit in the lease left.
    let retry = (ttl / 20).max(Duration::from_millis(5));
    let mut cmd = redis::cmd(kind.extend());
    cmd.arg(&key).arg(&owner).arg(millis(ttl, 1));
    let mut next = lease.end() - ttl + period;
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let end = lease.end();
        if sent >= end {
            lease.mark_lost();
            return;
        }
        match warden.query_within::<i64>(&cmd, end - sent).await {
            Ok(1) => {
                lease.renewed(sent + ttl);
                next = sent + period;
            }
            Ok(_) => {
                lease.mark_lost();
                return;
            }
            Err(_) => next = (Instant::now() + retry).min(end),
        }
    }
}
