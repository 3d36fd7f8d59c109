//! The semaphore: at most `limit` permits held at once, each hold with its
//! own lease and token. Pure rules; the time and the token source are
//! arguments.
//!
//! Invariant — the bound: `used` (the sum of the holds' permits) never
//! exceeds `limit` through a grant: [`Semaphore::grant`] is only called for a
//! request that [`Semaphore::fits`]. A lowered limit leaves holds above it to
//! end by themselves; nothing new is granted until they have.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use crate::args::SemRequest;

/// Largest limit (and so largest request), 2^31.
pub const MAX_LIMIT: u64 = 1 << 31;

/// One owner's hold: its permits, token and lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub permits: u64,
    pub fence: u64,
    /// Absolute unix ms at which the lease ends (live while now <= deadline).
    pub deadline_ms: i64,
    /// When this server granted it (unix ms); 0: not known here.
    pub granted_ms: i64,
}

impl Hold {
    /// How long the hold lasted if it ends at `now_ms` (its lease's end, if
    /// earlier); `None` if its grant time is not known.
    pub fn held_for(&self, now_ms: i64) -> Option<i64> {
        (self.granted_ms > 0).then(|| now_ms.min(self.deadline_ms) - self.granted_ms)
    }
}

/// Who may be granted now, besides the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Anyone who fits.
    Open,
    /// Waiters are queued ahead: nobody overtakes them, however few permits
    /// it asks for.
    Queued,
    /// A grace window: nobody gets a new hold.
    Closed,
}

/// What an acquire did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Granted {
        fence: u64,
    },
    /// Not enough permits free, waiters ahead, or a grace window.
    Busy,
    /// The owner holds permits already: one hold per owner.
    AlreadyHeld,
    /// The request stated another limit than the semaphore's.
    OtherLimit(u64),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Semaphore {
    pub limit: u64,
    /// The last token issued on this key.
    pub fence: u64,
    used: u64,
    holds: FxHashMap<Vec<u8>, Hold>,
    /// Every hold by (lease end, token, owner): the next lease to end is the
    /// first. The owner makes each entry unique whatever the tokens (a
    /// restored payload may repeat one).
    leases: BTreeSet<(i64, u64, Vec<u8>)>,
    /// The latest time holds were dropped at (the replicas drop at it too).
    pub pruned_at: i64,
    /// Owners whose hold changed since the caller last took them (the
    /// effect carries only those).
    changed: Vec<Vec<u8>>,
    /// How long each hold lasted that ended since the caller last took them
    /// (released or lapsed; not a revoked grant, which no client ever held).
    pub ended: Vec<i64>,
}

impl Semaphore {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Permits held.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Owners holding permits.
    pub fn holders(&self) -> usize {
        self.holds.len()
    }

    pub fn is_free(&self) -> bool {
        self.holds.is_empty()
    }

    pub fn hold(&self, owner: &[u8]) -> Option<&Hold> {
        self.holds.get(owner)
    }

    /// Every hold, in no particular order.
    pub fn holds(&self) -> impl Iterator<Item = (&Vec<u8>, &Hold)> {
        self.holds.iter()
    }

    /// Whether `permits` more fit under the limit now.
    pub fn fits(&self, permits: u64) -> bool {
        self.used
            .checked_add(permits)
            .is_some_and(|total| total <= self.limit)
    }

    /// This key's clock: the server's, never behind a time holds were
    /// already dropped at. A clock stepped back then makes leases longer,
    /// never shorter (a lease drawn from the stepped-back clock would end
    /// before a time the replicas already dropped holds at).
    fn clock(&self, now_ms: i64) -> i64 {
        self.pruned_at.max(now_ms)
    }

    /// Drops the holds whose lease ended before `now_ms` (or before a later
    /// time they were dropped at already): O(ended · log n).
    pub fn prune(&mut self, now_ms: i64) {
        self.pruned_at = self.clock(now_ms);
        while self
            .leases
            .first()
            .is_some_and(|(deadline, _, _)| *deadline < self.pruned_at)
        {
            let Some((_, _, owner)) = self.leases.pop_first() else {
                break;
            };
            if let Some(hold) = self.holds.remove(&owner) {
                self.used -= hold.permits;
                self.ended.extend(hold.held_for(now_ms));
            }
        }
        self.fit();
    }

    /// Gives memory back once most holds of a burst are gone.
    fn fit(&mut self) {
        if self.holds.capacity() > 64 && self.holds.len() * 4 < self.holds.capacity() {
            self.holds.shrink_to_fit();
        }
    }

    /// An acquire (the request states the limit, the permits, the lease).
    pub fn request(
        &mut self,
        req: &SemRequest,
        now_ms: i64,
        gate: Gate,
        draw: &mut dyn FnMut() -> u64,
    ) -> Outcome {
        self.prune(now_ms);
        if req.limit != self.limit {
            return Outcome::OtherLimit(self.limit);
        }
        if self.holds.contains_key(req.owner) {
            return Outcome::AlreadyHeld;
        }
        if gate != Gate::Open || !self.fits(req.permits) {
            return Outcome::Busy;
        }
        Outcome::Granted {
            fence: self.grant(req.owner, req.permits, now_ms, req.ttl_ms, draw()),
        }
    }

    /// Records a new hold (the caller checked `fits` and that `owner` holds
    /// nothing here).
    pub fn grant(
        &mut self,
        owner: &[u8],
        permits: u64,
        now_ms: i64,
        ttl_ms: i64,
        fence: u64,
    ) -> u64 {
        let hold = Hold {
            permits,
            fence,
            deadline_ms: self.clock(now_ms).saturating_add(ttl_ms),
            granted_ms: now_ms,
        };
        self.insert(owner.to_vec(), hold);
        self.fence = self.fence.max(fence);
        fence
    }

    /// Puts a hold in (replacing the owner's, if any).
    pub fn insert(&mut self, owner: Vec<u8>, hold: Hold) {
        self.remove(&owner);
        self.used += hold.permits;
        self.leases
            .insert((hold.deadline_ms, hold.fence, owner.clone()));
        self.changed.push(owner.clone());
        self.holds.insert(owner, hold);
    }

    /// Takes the owner's hold out.
    pub fn remove(&mut self, owner: &[u8]) -> Option<Hold> {
        let hold = self.holds.remove(owner)?;
        self.used -= hold.permits;
        self.leases
            .remove(&(hold.deadline_ms, hold.fence, owner.to_vec()));
        self.changed.push(owner.to_vec());
        self.fit();
        Some(hold)
    }

    /// Gives the owner's permits back; false if it holds none.
    pub fn release(&mut self, owner: &[u8], now_ms: i64) -> bool {
        self.prune(now_ms);
        let Some(hold) = self.remove(owner) else {
            return false;
        };
        self.ended.extend(hold.held_for(now_ms));
        true
    }

    /// Resets the owner's lease; false if it holds nothing.
    pub fn extend(&mut self, owner: &[u8], now_ms: i64, ttl_ms: i64) -> bool {
        self.prune(now_ms);
        let Some(mut hold) = self.remove(owner) else {
            return false;
        };
        hold.deadline_ms = self.clock(now_ms).saturating_add(ttl_ms);
        self.insert(owner.to_vec(), hold);
        true
    }

    /// Drops the hold made under `fence` (it never reached its client); false
    /// if no live hold carries that token.
    pub fn revoke(&mut self, fence: u64, now_ms: i64) -> bool {
        self.prune(now_ms);
        let owner = self
            .holds
            .iter()
            .find(|(_, h)| h.fence == fence)
            .map(|(o, _)| o.clone());
        owner.is_some_and(|o| self.remove(&o).is_some())
    }

    /// The latest lease end: the key's expiry.
    pub fn deadline(&self) -> Option<i64> {
        self.leases.last().map(|(at, _, _)| *at)
    }

    /// The earliest lease end: when waiters may next be served.
    pub fn next_lease_end(&self) -> Option<i64> {
        self.leases.first().map(|(at, _, _)| *at)
    }

    /// The owners whose hold changed since the last call.
    pub fn take_changed(&mut self) -> Vec<Vec<u8>> {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    /// Forgets which holds changed (the whole state is being sent).
    pub fn clear_changed(&mut self) {
        self.changed = Vec::new();
    }

    pub fn memory(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .holds
                .keys()
                .map(|o| 2 * o.capacity() + std::mem::size_of::<Hold>() + 64)
                .sum::<usize>()
    }

    /// A copy whose holds this server did not grant (`COPY`, a forgotten
    /// change list).
    pub fn copied(&self) -> Self {
        let mut copy = self.clone();
        copy.changed.clear();
        copy.ended.clear();
        for hold in copy.holds.values_mut() {
            hold.granted_ms = 0;
        }
        copy
    }

    /// Applies `f` to every lease end (capping them), keeping the index right.
    pub fn map_deadlines(&mut self, f: impl Fn(i64) -> i64) {
        let holds: Vec<(Vec<u8>, Hold)> = self.holds.drain().collect();
        self.leases.clear();
        self.used = 0;
        for (owner, mut hold) in holds {
            hold.deadline_ms = f(hold.deadline_ms);
            self.used += hold.permits;
            self.leases
                .insert((hold.deadline_ms, hold.fence, owner.clone()));
            self.holds.insert(owner, hold);
        }
    }

    /// `(used, holders)` as they are at `now_ms`, without dropping anything
    /// (a read): O(holds whose lease ended but are not dropped yet).
    pub fn live_counts(&self, now_ms: i64) -> (u64, usize) {
        let at = self.clock(now_ms);
        let mut counts = (self.used, self.holds.len());
        for (deadline, _, owner) in &self.leases {
            if *deadline >= at {
                break;
            }
            if let Some(hold) = self.holds.get(owner) {
                counts.0 -= hold.permits;
                counts.1 -= 1;
            }
        }
        counts
    }

    /// The owner's hold if its lease has not ended at `now_ms`.
    pub fn live_hold(&self, owner: &[u8], now_ms: i64) -> Option<&Hold> {
        let at = self.clock(now_ms);
        self.holds.get(owner).filter(|h| h.deadline_ms >= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> impl FnMut() -> u64 {
        let mut n = 0;
        move || {
            n += 1;
            n
        }
    }

    fn req(owner: &str, permits: u64, limit: u64, ttl_ms: i64) -> SemRequest<'_> {
        SemRequest {
            owner: owner.as_bytes(),
            ttl_ms,
            limit,
            permits,
            wait_ms: None,
        }
    }

    fn acquire(
        s: &mut Semaphore,
        owner: &str,
        permits: u64,
        now: i64,
        draw: &mut dyn FnMut() -> u64,
    ) -> Outcome {
        let limit = s.limit;
        s.request(&req(owner, permits, limit, 1000), now, Gate::Open, draw)
    }

    #[test]
    fn grants_until_the_limit_then_busy() {
        let mut draw = counter();
        let mut s = Semaphore::new(3);
        assert_eq!(
            acquire(&mut s, "a", 2, 0, &mut draw),
            Outcome::Granted { fence: 1 }
        );
        assert_eq!(acquire(&mut s, "b", 2, 0, &mut draw), Outcome::Busy);
        assert_eq!(
            acquire(&mut s, "b", 1, 0, &mut draw),
            Outcome::Granted { fence: 2 }
        );
        assert_eq!(s.used(), 3);
        assert_eq!(acquire(&mut s, "c", 1, 0, &mut draw), Outcome::Busy);
    }

    #[test]
    fn one_hold_per_owner() {
        let mut draw = counter();
        let mut s = Semaphore::new(5);
        acquire(&mut s, "a", 1, 0, &mut draw);
        assert_eq!(acquire(&mut s, "a", 1, 0, &mut draw), Outcome::AlreadyHeld);
        assert_eq!(s.used(), 1);
    }

    #[test]
    fn another_limit_is_refused() {
        let mut s = Semaphore::new(10);
        let out = s.request(&req("a", 1, 20, 1000), 0, Gate::Open, &mut counter());
        assert_eq!(out, Outcome::OtherLimit(10));
        assert!(s.is_free());
    }

    #[test]
    fn nobody_overtakes_the_queue_or_passes_a_closed_gate() {
        let mut s = Semaphore::new(5);
        for gate in [Gate::Queued, Gate::Closed] {
            assert_eq!(
                s.request(&req("a", 1, 5, 1000), 0, gate, &mut counter()),
                Outcome::Busy
            );
        }
        assert!(s.is_free());
    }

    #[test]
    fn a_lease_end_returns_its_permits() {
        let mut draw = counter();
        let mut s = Semaphore::new(2);
        s.request(&req("a", 2, 2, 100), 0, Gate::Open, &mut draw);
        assert!(!s.fits(1));
        s.prune(100);
        assert_eq!(s.used(), 2, "live through its deadline");
        s.prune(101);
        assert_eq!(s.used(), 0);
        assert!(s.is_free());
        assert_eq!(s.deadline(), None);
    }

    #[test]
    fn release_extend_and_revoke_keep_the_index() {
        let mut draw = counter();
        let mut s = Semaphore::new(4);
        acquire(&mut s, "a", 1, 0, &mut draw);
        acquire(&mut s, "b", 1, 0, &mut draw);
        assert!(s.extend(b"a", 500, 1000));
        assert_eq!(s.deadline(), Some(1500));
        assert_eq!(s.next_lease_end(), Some(1000));
        assert!(s.release(b"b", 600));
        assert!(!s.release(b"b", 600));
        assert_eq!(s.next_lease_end(), Some(1500));
        assert!(s.revoke(1, 700));
        assert!(s.is_free());
        assert_eq!(s.used(), 0);
    }

    #[test]
    fn changed_names_each_touched_owner_once() {
        let mut draw = counter();
        let mut s = Semaphore::new(4);
        acquire(&mut s, "a", 1, 0, &mut draw);
        acquire(&mut s, "b", 1, 0, &mut draw);
        s.take_changed();
        s.extend(b"a", 10, 100);
        s.extend(b"a", 10, 200);
        assert_eq!(s.take_changed(), vec![b"a".to_vec()]);
        assert!(s.take_changed().is_empty());
    }

    #[test]
    fn a_clock_stepped_back_makes_leases_longer_never_shorter() {
        let mut draw = counter();
        let mut s = Semaphore::new(4);
        acquire(&mut s, "a", 1, 10_000, &mut draw);
        // The clock steps back 5 s: a new 1 s lease still ends after the
        // time holds were already dropped at.
        s.grant(b"b", 1, 5_000, 1_000, draw());
        assert_eq!(s.hold(b"b").unwrap().deadline_ms, 11_000);
        s.prune(5_500);
        assert!(s.hold(b"b").is_some());
        assert!(s.extend(b"b", 6_000, 1_000));
        assert_eq!(s.hold(b"b").unwrap().deadline_ms, 11_000);
    }

    #[test]
    fn holds_sharing_a_token_and_a_lease_end_stay_apart() {
        let mut s = Semaphore::new(3);
        let hold = |permits| Hold {
            permits,
            fence: 7,
            deadline_ms: 100,
            granted_ms: 0,
        };
        s.insert(b"alice".to_vec(), hold(1));
        s.insert(b"bob".to_vec(), hold(2));
        assert!(s.release(b"alice", 0));
        assert_eq!((s.used(), s.holders()), (2, 1));
        assert_eq!(s.live_counts(50), (2, 1));
        assert_eq!(s.live_counts(101), (0, 0));
        assert!(s.live_hold(b"bob", 100).is_some());
        assert!(s.live_hold(b"bob", 101).is_none());
    }

    #[test]
    fn capped_deadlines_keep_the_index() {
        let mut draw = counter();
        let mut s = Semaphore::new(4);
        acquire(&mut s, "a", 3, 0, &mut draw);
        s.map_deadlines(|d| d.min(10));
        assert_eq!(s.deadline(), Some(10));
        s.prune(11);
        assert!(s.is_free());
        assert_eq!(s.used(), 0);
    }
}
