//! Cache leases: what a read gets, given the key's value, its staleness and
//! the outstanding fill lease. Pure rules; the time is always an argument.

/// An outstanding fill lease: its token, when it lapses, who holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub token: u64,
    pub deadline_ms: i64,
    /// The holder's client id: the lease ends when that client disconnects.
    /// (`None`: held by no connection, ends at its deadline.)
    pub holder: Option<u64>,
}

/// The lease table's entry for one key: it exists only while a lease or a
/// stale window does (waiters are kept by the waiting queues).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub lease: Option<Lease>,
    /// Until when the key's value is served as stale (after `INVALIDATE STALE`).
    pub stale_until: Option<i64>,
}

impl Entry {
    /// The lease, if it has not lapsed at `now_ms`.
    pub fn live_lease(&self, now_ms: i64) -> Option<&Lease> {
        self.lease.as_ref().filter(|l| now_ms <= l.deadline_ms)
    }

    pub fn is_stale(&self, now_ms: i64) -> bool {
        self.stale_until.is_some_and(|t| now_ms <= t)
    }

    /// Nothing left to remember.
    pub fn is_empty(&self) -> bool {
        self.lease.is_none() && self.stale_until.is_none()
    }
}

/// What the key holds, as a read sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Missing,
    /// A value; `ttl_left`: ms until it expires, `None` if it never does.
    Value {
        ttl_left: Option<i64>,
        stale: bool,
    },
}

/// The options of a `CACHE.GET`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub refresh_ms: Option<i64>,
    pub fresh: bool,
}

/// What a `CACHE.GET` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// `[value, nil]`.
    Hit { stale: bool },
    /// `[value, token]`: serve the value and reload (refresh-ahead or stale).
    HitAndLease { stale: bool },
    /// `[nil, token]`: load and fill.
    MissAndLease,
    /// `[nil, nil]` at once, or wait (with `WAIT`) for the fill.
    MissBusy,
}

/// The rules of `CACHE.GET` (SPEC "Cache leases", semantics 1–3 and 5).
pub fn read(seen: Seen, lease_outstanding: bool, opts: Options) -> Read {
    match seen {
        Seen::Value { stale: true, .. } if opts.fresh => miss(lease_outstanding),
        Seen::Value { stale: true, .. } if !lease_outstanding => Read::HitAndLease { stale: true },
        Seen::Value { stale: true, .. } => Read::Hit { stale: true },
        Seen::Value { ttl_left, .. } => {
            let due = matches!((opts.refresh_ms, ttl_left), (Some(r), Some(t)) if t < r);
            if due && !lease_outstanding {
                Read::HitAndLease { stale: false }
            } else {
                Read::Hit { stale: false }
            }
        }
        Seen::Missing => miss(lease_outstanding),
    }
}

fn miss(lease_outstanding: bool) -> Read {
    if lease_outstanding {
        Read::MissBusy
    } else {
        Read::MissAndLease
    }
}

/// A uniform draw in `0..=jitter` from 8 random bytes (jitter < 2^47, so the
/// modulo bias is below 2^-16).
pub fn jitter_from(random: u64, jitter: i64) -> i64 {
    if jitter <= 0 {
        0
    } else {
        (random % (jitter as u64 + 1)) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(ttl_left: Option<i64>) -> Seen {
        Seen::Value {
            ttl_left,
            stale: false,
        }
    }

    const STALE: Seen = Seen::Value {
        ttl_left: Some(100),
        stale: true,
    };

    #[test]
    fn a_hit_is_a_hit_whatever_the_lease() {
        for lease in [false, true] {
            assert_eq!(
                read(value(None), lease, Options::default()),
                Read::Hit { stale: false }
            );
        }
    }

    #[test]
    fn refresh_ahead_leases_once_the_ttl_is_below_the_window() {
        let opts = Options {
            refresh_ms: Some(200),
            fresh: false,
        };
        assert_eq!(
            read(value(Some(500)), false, opts),
            Read::Hit { stale: false }
        );
        assert_eq!(
            read(value(Some(150)), false, opts),
            Read::HitAndLease { stale: false }
        );
        // One refresher at a time: the others keep getting the value.
        assert_eq!(
            read(value(Some(150)), true, opts),
            Read::Hit { stale: false }
        );
        // A value without expiry never needs refreshing.
        assert_eq!(read(value(None), false, opts), Read::Hit { stale: false });
    }

    #[test]
    fn a_miss_leases_to_the_first_reader_only() {
        assert_eq!(
            read(Seen::Missing, false, Options::default()),
            Read::MissAndLease
        );
        assert_eq!(
            read(Seen::Missing, true, Options::default()),
            Read::MissBusy
        );
    }

    #[test]
    fn a_stale_value_hands_its_first_reader_the_refresh() {
        let opts = Options::default();
        assert_eq!(read(STALE, false, opts), Read::HitAndLease { stale: true });
        assert_eq!(read(STALE, true, opts), Read::Hit { stale: true });
    }

    #[test]
    fn fresh_counts_a_stale_value_as_a_miss() {
        let opts = Options {
            refresh_ms: None,
            fresh: true,
        };
        assert_eq!(read(STALE, false, opts), Read::MissAndLease);
        assert_eq!(read(STALE, true, opts), Read::MissBusy);
        assert_eq!(read(value(None), false, opts), Read::Hit { stale: false });
    }

    #[test]
    fn leases_lapse_at_their_deadline() {
        let e = Entry {
            lease: Some(Lease {
                token: 7,
                deadline_ms: 100,
                holder: Some(1),
            }),
            stale_until: None,
        };
        assert!(e.live_lease(100).is_some());
        assert!(e.live_lease(101).is_none());
        assert!(!e.is_empty());
        assert!(Entry::default().is_empty());
    }

    #[test]
    fn jitter_stays_in_range() {
        assert_eq!(jitter_from(u64::MAX, 0), 0);
        for r in [0, 1, 99, 100, 101, u64::MAX] {
            assert!((0..=100).contains(&jitter_from(r, 100)));
        }
        assert_eq!(jitter_from(100, 100), 100);
    }
}
