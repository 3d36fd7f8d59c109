//! The exclusive lock: owner, hold count, fencing token and lease deadline.
//! Pure rules; the time is always an argument.

/// Most holds one owner may stack (they travel as signed 64-bit integers).
pub const MAX_HOLDS: u64 = i64::MAX as u64;

/// Which owner holds a lock, how often, under which token, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub owner: Vec<u8>,
    pub holds: u64,
    pub fence: u64,
    /// Absolute unix time in ms at which the lease ends (the key's expiry).
    pub deadline_ms: i64,
    /// When this server granted the hold (unix ms); 0: not known here (loaded,
    /// copied or replicated), and then no hold time is recorded for it.
    pub granted_ms: i64,
    /// The key's expiry came from a `RESTORE`'s ttl, not from warden: it may
    /// shorten the saved lease, never lengthen it, until warden sets it.
    pub foreign_expiry: bool,
}

/// What a request by an owner did to an existing lock.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// The owner already held it: one more hold, lease reset, same token.
    Reentered { fence: u64 },
    /// Someone else holds it.
    Busy,
    /// The hold count cannot go higher.
    Overflow,
}

/// What a release did.
#[derive(Debug, PartialEq, Eq)]
pub enum Release {
    /// The last hold is gone: the lock is free (or goes to the next waiter).
    Freed,
    /// Re-entrant holds remain.
    StillHeld,
    /// The owner does not hold the lock: nothing changed.
    NotOwner,
}

impl Lock {
    /// A fresh grant to `owner` with token `fence`, leased for `ttl_ms` from `now_ms`.
    pub fn grant(owner: &[u8], fence: u64, now_ms: i64, ttl_ms: i64) -> Self {
        Self {
            owner: owner.to_vec(),
            holds: 1,
            fence,
            deadline_ms: now_ms.saturating_add(ttl_ms),
            granted_ms: now_ms,
            foreign_expiry: false,
        }
    }

    /// How long the hold lasted if it ends at `now_ms` (its lease's end, if
    /// earlier); `None` if its grant time is not known.
    pub fn held_for(&self, now_ms: i64) -> Option<i64> {
        (self.granted_ms > 0).then(|| now_ms.min(self.deadline_ms) - self.granted_ms)
    }

    /// Redis' own rule: a key expires once the clock is past its deadline.
    pub fn is_live(&self, now_ms: i64) -> bool {
        now_ms <= self.deadline_ms
    }

    pub fn is_held_by(&self, owner: &[u8], now_ms: i64) -> bool {
        self.is_live(now_ms) && self.owner == owner
    }

    /// A request by `owner` on this (live) lock.
    pub fn enter(&mut self, owner: &[u8], now_ms: i64, ttl_ms: i64) -> Entry {
        if !self.is_held_by(owner, now_ms) {
            return Entry::Busy;
        }
        if self.holds >= MAX_HOLDS {
            return Entry::Overflow;
        }
        self.holds += 1;
        self.deadline_ms = now_ms.saturating_add(ttl_ms);
        Entry::Reentered { fence: self.fence }
    }

    pub fn release(&mut self, owner: &[u8], now_ms: i64) -> Release {
        if !self.is_held_by(owner, now_ms) {
            return Release::NotOwner;
        }
        self.holds -= 1;
        if self.holds == 0 {
            Release::Freed
        } else {
            Release::StillHeld
        }
    }

    /// Resets the lease to `ttl_ms` from now; false if `owner` does not hold it.
    pub fn extend(&mut self, owner: &[u8], now_ms: i64, ttl_ms: i64) -> bool {
        if !self.is_held_by(owner, now_ms) {
            return false;
        }
        self.deadline_ms = now_ms.saturating_add(ttl_ms);
        true
    }

    /// Milliseconds of lease left (0 once it ended).
    pub fn ttl_left(&self, now_ms: i64) -> i64 {
        (self.deadline_ms - now_ms).max(0)
    }

    /// Bytes of memory the value uses.
    pub fn memory(&self) -> usize {
        std::mem::size_of::<Self>() + self.owner.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(owner: &str) -> Lock {
        Lock::grant(owner.as_bytes(), 7, 1_000, 100)
    }

    #[test]
    fn grant_holds_once_with_lease_from_now() {
        let l = held("a");
        assert_eq!((l.holds, l.fence, l.deadline_ms), (1, 7, 1_100));
        assert_eq!(l.ttl_left(1_040), 60);
    }

    #[test]
    fn reentry_counts_holds_resets_lease_and_keeps_fence() {
        let mut l = held("a");
        assert_eq!(l.enter(b"a", 1_050, 500), Entry::Reentered { fence: 7 });
        assert_eq!((l.holds, l.deadline_ms), (2, 1_550));
    }

    #[test]
    fn other_owner_is_busy_and_changes_nothing() {
        let mut l = held("a");
        let before = l.clone();
        assert_eq!(l.enter(b"b", 1_050, 500), Entry::Busy);
        assert_eq!(l, before);
    }

    #[test]
    fn each_hold_needs_its_own_release() {
        let mut l = held("a");
        l.enter(b"a", 1_010, 100);
        assert_eq!(l.release(b"a", 1_020), Release::StillHeld);
        assert_eq!(l.release(b"a", 1_030), Release::Freed);
    }

    #[test]
    fn only_the_owner_releases_or_extends() {
        let mut l = held("a");
        assert_eq!(l.release(b"b", 1_010), Release::NotOwner);
        assert!(!l.extend(b"b", 1_010, 999));
        assert_eq!(l.holds, 1);
        assert!(l.extend(b"a", 1_010, 999));
        assert_eq!(l.deadline_ms, 2_009);
    }

    #[test]
    fn lease_ends_after_the_deadline_not_at_it() {
        let mut l = held("a");
        assert!(l.is_live(1_100));
        assert!(!l.is_live(1_101));
        assert_eq!(l.release(b"a", 1_101), Release::NotOwner);
        assert!(!l.extend(b"a", 1_101, 10));
        assert_eq!(l.enter(b"a", 1_101, 10), Entry::Busy);
    }

    #[test]
    fn a_hold_lasts_until_now_or_its_lease_end_when_its_grant_is_known() {
        let mut l = held("a");
        assert_eq!(l.held_for(1_040), Some(40));
        assert_eq!(l.held_for(5_000), Some(100));
        l.granted_ms = 0;
        assert_eq!(l.held_for(1_040), None);
    }

    #[test]
    fn hold_count_overflow_is_refused() {
        let mut l = held("a");
        l.holds = MAX_HOLDS;
        assert_eq!(l.enter(b"a", 1_010, 10), Entry::Overflow);
        assert_eq!(l.holds, MAX_HOLDS);
    }
}
