//! The read-write lock: one writer or many readers, each hold with its own
//! lease and token. Pure rules; the time and the token source are arguments.

use rustc_hash::FxHashMap;

use crate::lock::state::MAX_HOLDS;

/// One owner's hold in one mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub owner: Vec<u8>,
    pub holds: u64,
    pub fence: u64,
    /// Absolute unix ms at which this hold's lease ends.
    pub deadline_ms: i64,
    /// When this server granted it (unix ms); 0: not known here.
    pub granted_ms: i64,
}

impl Hold {
    fn new(owner: &[u8], fence: u64, now_ms: i64, ttl_ms: i64) -> Self {
        Self {
            owner: owner.to_vec(),
            holds: 1,
            fence,
            deadline_ms: now_ms.saturating_add(ttl_ms),
            granted_ms: now_ms,
        }
    }

    fn is_live(&self, now_ms: i64) -> bool {
        now_ms <= self.deadline_ms
    }

    /// How long the hold lasted if it ends at `now_ms` (its lease's end, if
    /// earlier); `None` if its grant time is not known.
    pub fn held_for(&self, now_ms: i64) -> Option<i64> {
        (self.granted_ms > 0).then(|| now_ms.min(self.deadline_ms) - self.granted_ms)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

/// What a request did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A new hold, with a new token.
    Granted { fence: u64 },
    /// The owner already held this mode: one more hold, lease reset, same token.
    Reentered { fence: u64 },
    /// Someone else holds it (or waiters are queued ahead).
    Busy,
    /// A reader asked for the write lock.
    Upgrade,
    /// The hold count cannot go higher.
    Overflow,
}

/// Who may get a hold now, besides the rules between the holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Anyone the holders admit.
    Open,
    /// Waiters are queued ahead: new holds wait; re-entry and the writer's
    /// own read hold do not.
    Queued,
    /// A grace window: every hold waits, re-entry included (the owner's
    /// release may have been lost with the old master).
    Closed,
}

/// What an unlock did.
#[derive(Debug, PartialEq, Eq)]
pub enum Unlock {
    /// The owner's hold in that mode is gone.
    Gone,
    /// Re-entrant holds in that mode remain.
    Remaining,
    /// The owner holds nothing.
    NotHeld,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RwLock {
    pub writer: Option<Hold>,
    pub readers: Vec<Hold>,
    /// The last token issued on this key.
    pub fence: u64,
    /// How long each hold lasted that ended since the caller last took them
    /// (unlocked or lapsed; not a revoked grant, which no client ever held).
    pub ended: Vec<i64>,
}

impl RwLock {
    /// Drops holds whose lease ended.
    pub fn prune(&mut self, now_ms: i64) {
        if let Some(w) = self.writer.take_if(|w| !w.is_live(now_ms)) {
            self.ended.extend(w.held_for(now_ms));
        }
        let ended = &mut self.ended;
        self.readers.retain(|r| {
            let live = r.is_live(now_ms);
            if !live {
                ended.extend(r.held_for(now_ms));
            }
            live
        });
        self.fit();
    }

    /// Gives memory back once most readers of a burst are gone (a key that
    /// once had 20k readers must not keep room for them while it lives).
    fn fit(&mut self) {
        if self.readers.capacity() > 16 && self.readers.len() * 4 < self.readers.capacity() {
            self.readers.shrink_to_fit();
        }
    }

    pub fn is_free(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }

    fn reader_mut(&mut self, owner: &[u8]) -> Option<&mut Hold> {
        self.readers.iter_mut().find(|r| r.owner == owner)
    }

    fn is_writer(&self, owner: &[u8]) -> bool {
        self.writer.as_ref().is_some_and(|w| w.owner == owner)
    }

    /// Whether a hold in `mode` by `owner` fits the current holders (the
    /// writer's own re-entry, from the queue, included).
    pub fn admits(&self, mode: Mode, owner: &[u8]) -> bool {
        match mode {
            Mode::Read => self.writer.is_none() || self.is_writer(owner),
            Mode::Write => self.is_free() || self.is_writer(owner),
        }
    }

    /// A request; `gate` says whether waiters are ahead or a grace window
    /// is open.
    pub fn request(
        &mut self,
        mode: Mode,
        owner: &[u8],
        now_ms: i64,
        ttl_ms: i64,
        gate: Gate,
        draw: &mut dyn FnMut() -> u64,
    ) -> Outcome {
        self.prune(now_ms);
        let deadline = now_ms.saturating_add(ttl_ms);
        let existing = match mode {
            Mode::Read => self.readers.iter_mut().find(|r| r.owner == owner),
            Mode::Write => self.writer.as_mut().filter(|w| w.owner == owner),
        };
        if let Some(hold) = existing {
            if gate == Gate::Closed {
                return Outcome::Busy;
            }
            if hold.holds >= MAX_HOLDS {
                return Outcome::Overflow;
            }
            hold.holds += 1;
            hold.deadline_ms = deadline;
            return Outcome::Reentered { fence: hold.fence };
        }
        if mode == Mode::Write && self.reader_mut(owner).is_some() {
            return Outcome::Upgrade;
        }
        let own_downgrade = mode == Mode::Read && self.is_writer(owner);
        let passes = match gate {
            Gate::Open => true,
            Gate::Queued => own_downgrade,
            Gate::Closed => false,
        };
        if !self.admits(mode, owner) || !passes {
            return Outcome::Busy;
        }
        Outcome::Granted {
            fence: self.grant(mode, owner, now_ms, ttl_ms, draw()),
        }
    }

    /// Records a new hold (the caller checked `admits`). An owner already
    /// reading that is granted a read again (two of its requests waited
    /// together) gets one more hold on its existing entry: one entry per owner.
    pub fn grant(&mut self, mode: Mode, owner: &[u8], now_ms: i64, ttl_ms: i64, fence: u64) -> u64 {
        // A re-entry that waited (a grace window) joins the owner's hold.
        let own = match mode {
            Mode::Read => self.reader_mut(owner),
            Mode::Write => self.writer.as_mut().filter(|w| w.owner == owner),
        };
        if let Some(hold) = own {
            hold.holds = hold.holds.saturating_add(1).min(MAX_HOLDS);
            hold.deadline_ms = hold.deadline_ms.max(now_ms.saturating_add(ttl_ms));
            return hold.fence;
        }
        let hold = Hold::new(owner, fence, now_ms, ttl_ms);
        match mode {
            Mode::Read => self.readers.push(hold),
            Mode::Write => self.writer = Some(hold),
        }
        self.fence = self.fence.max(fence);
        fence
    }

    /// Records read holds for a run of waiting readers at once (the caller
    /// checked `admits`): linear in the readers, whatever their number. Returns
    /// each request's token, in order.
    pub fn grant_reads(
        &mut self,
        requests: &[(&[u8], i64)],
        now_ms: i64,
        draw: &mut dyn FnMut() -> u64,
    ) -> Vec<u64> {
        let mut index: FxHashMap<Vec<u8>, usize> = self
            .readers
            .iter()
            .enumerate()
            .map(|(i, r)| (r.owner.clone(), i))
            .collect();
        let mut fences = Vec::with_capacity(requests.len());
        for &(owner, ttl_ms) in requests {
            if let Some(&i) = index.get(owner) {
                let hold = &mut self.readers[i];
                hold.holds = hold.holds.saturating_add(1).min(MAX_HOLDS);
                hold.deadline_ms = hold.deadline_ms.max(now_ms.saturating_add(ttl_ms));
                fences.push(hold.fence);
                continue;
            }
            let fence = draw();
            index.insert(owner.to_vec(), self.readers.len());
            self.readers.push(Hold::new(owner, fence, now_ms, ttl_ms));
            self.fence = self.fence.max(fence);
            fences.push(fence);
        }
        fences
    }

    /// Drops one hold of the grant made under `fence` (it never reached its
    /// client); false if no live hold carries that token.
    pub fn revoke(&mut self, fence: u64, now_ms: i64) -> bool {
        self.prune(now_ms);
        if let Some(w) = self.writer.as_mut().filter(|w| w.fence == fence) {
            w.holds -= 1;
            if w.holds == 0 {
                self.writer = None;
            }
            return true;
        }
        let Some(i) = self.readers.iter().position(|r| r.fence == fence) else {
            return false;
        };
        self.readers[i].holds -= 1;
        if self.readers[i].holds == 0 {
            self.readers.remove(i);
            self.fit();
        }
        true
    }

    /// Releases one hold of `owner`: write holds before read holds.
    pub fn unlock(&mut self, owner: &[u8], now_ms: i64) -> Unlock {
        self.prune(now_ms);
        if let Some(w) = self.writer.as_mut().filter(|w| w.owner == owner) {
            w.holds -= 1;
            if w.holds > 0 {
                return Unlock::Remaining;
            }
            self.ended.extend(w.held_for(now_ms));
            self.writer = None;
            return Unlock::Gone;
        }
        let Some(i) = self.readers.iter().position(|r| r.owner == owner) else {
            return Unlock::NotHeld;
        };
        self.readers[i].holds -= 1;
        if self.readers[i].holds > 0 {
            return Unlock::Remaining;
        }
        let gone = self.readers.remove(i);
        self.ended.extend(gone.held_for(now_ms));
        self.fit();
        Unlock::Gone
    }

    /// Resets every lease of `owner`; false if it holds nothing.
    pub fn extend(&mut self, owner: &[u8], now_ms: i64, ttl_ms: i64) -> bool {
        self.prune(now_ms);
        let deadline = now_ms.saturating_add(ttl_ms);
        let mut found = false;
        let writer = self.writer.iter_mut().filter(|w| w.owner == owner);
        for hold in writer.chain(self.readers.iter_mut().filter(|r| r.owner == owner)) {
            hold.deadline_ms = deadline;
            found = true;
        }
        found
    }

    fn holds_iter(&self) -> impl Iterator<Item = &Hold> {
        self.writer.iter().chain(self.readers.iter())
    }

    /// The latest lease end: the key's expiry.
    pub fn deadline(&self) -> Option<i64> {
        self.holds_iter().map(|h| h.deadline_ms).max()
    }

    /// The earliest lease end: when waiters may next be served.
    pub fn next_lease_end(&self) -> Option<i64> {
        self.holds_iter().map(|h| h.deadline_ms).min()
    }

    /// Holds in both modes.
    pub fn holds(&self) -> u64 {
        self.holds_iter()
            .fold(0u64, |total, h| total.saturating_add(h.holds))
    }

    pub fn memory(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .holds_iter()
                .map(|h| std::mem::size_of::<Hold>() + h.owner.capacity())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> impl FnMut() -> u64 {
        let mut next = 10;
        move || {
            next += 1;
            next
        }
    }

    fn req(
        l: &mut RwLock,
        mode: Mode,
        owner: &str,
        now: i64,
        draw: &mut dyn FnMut() -> u64,
    ) -> Outcome {
        l.request(mode, owner.as_bytes(), now, 100, Gate::Open, draw)
    }

    #[test]
    fn a_burst_of_readers_gives_its_room_back_as_they_leave() {
        let mut l = RwLock::default();
        for i in 0..1000 {
            l.grant(Mode::Read, format!("r{i}").as_bytes(), 1, 100, i + 1);
        }
        for i in 1..1000 {
            assert_eq!(l.unlock(format!("r{i}").as_bytes(), 50), Unlock::Gone);
        }
        assert_eq!(l.ended.len(), 999);
        assert!(l.readers.capacity() <= 16, "{}", l.readers.capacity());
        l.prune(200);
        assert!(l.is_free());
        assert_eq!(l.ended.len(), 1000, "the last reader's lease ended");
    }

    #[test]
    fn readers_share_and_each_gets_a_token() {
        let mut t = tokens();
        let mut l = RwLock::default();
        assert_eq!(
            req(&mut l, Mode::Read, "a", 0, &mut t),
            Outcome::Granted { fence: 11 }
        );
        assert_eq!(
            req(&mut l, Mode::Read, "b", 0, &mut t),
            Outcome::Granted { fence: 12 }
        );
        assert_eq!(l.readers.len(), 2);
        assert_eq!(l.fence, 12);
    }

    #[test]
    fn a_writer_excludes_everyone_else() {
        let mut t = tokens();
        let mut l = RwLock::default();
        req(&mut l, Mode::Write, "w", 0, &mut t);
        assert_eq!(req(&mut l, Mode::Read, "r", 0, &mut t), Outcome::Busy);
        assert_eq!(req(&mut l, Mode::Write, "x", 0, &mut t), Outcome::Busy);
        let mut l = RwLock::default();
        req(&mut l, Mode::Read, "r", 0, &mut t);
        assert_eq!(req(&mut l, Mode::Write, "w", 0, &mut t), Outcome::Busy);
    }

    #[test]
    fn both_modes_are_reentrant_with_the_same_token() {
        let mut t = tokens();
        let mut l = RwLock::default();
        let Outcome::Granted { fence } = req(&mut l, Mode::Write, "w", 0, &mut t) else {
            panic!()
        };
        assert_eq!(
            req(&mut l, Mode::Write, "w", 50, &mut t),
            Outcome::Reentered { fence }
        );
        assert_eq!(l.writer.as_ref().unwrap().holds, 2);
        assert_eq!(l.writer.as_ref().unwrap().deadline_ms, 150);
        let mut l = RwLock::default();
        let Outcome::Granted { fence } = req(&mut l, Mode::Read, "r", 0, &mut t) else {
            panic!()
        };
        assert_eq!(
            req(&mut l, Mode::Read, "r", 0, &mut t),
            Outcome::Reentered { fence }
        );
    }

    #[test]
    fn upgrade_is_refused() {
        let mut t = tokens();
        let mut l = RwLock::default();
        req(&mut l, Mode::Read, "r", 0, &mut t);
        assert_eq!(req(&mut l, Mode::Write, "r", 0, &mut t), Outcome::Upgrade);
        assert!(l.writer.is_none());
    }

    #[test]
    fn downgrade_keeps_reading_after_the_write_hold_goes() {
        let mut t = tokens();
        let mut l = RwLock::default();
        req(&mut l, Mode::Write, "w", 0, &mut t);
        assert!(matches!(
            req(&mut l, Mode::Read, "w", 0, &mut t),
            Outcome::Granted { .. }
        ));
        assert_eq!(l.unlock(b"w", 0), Unlock::Gone);
        assert!(l.writer.is_none());
        assert_eq!(l.readers.len(), 1);
        assert!(matches!(
            req(&mut l, Mode::Read, "other", 0, &mut t),
            Outcome::Granted { .. }
        ));
        assert_eq!(l.unlock(b"w", 0), Unlock::Gone);
        assert_eq!(l.unlock(b"w", 0), Unlock::NotHeld);
    }

    #[test]
    fn unlock_counts_down_reentrant_holds() {
        let mut t = tokens();
        let mut l = RwLock::default();
        req(&mut l, Mode::Read, "r", 0, &mut t);
        req(&mut l, Mode::Read, "r", 0, &mut t);
        assert_eq!(l.unlock(b"r", 0), Unlock::Remaining);
        assert_eq!(l.unlock(b"r", 0), Unlock::Gone);
        assert!(l.is_free());
    }

    #[test]
    fn each_reader_has_its_own_lease() {
        let mut t = tokens();
        let mut l = RwLock::default();
        l.request(Mode::Read, b"short", 0, 10, Gate::Open, &mut t);
        l.request(Mode::Read, b"long", 0, 1000, Gate::Open, &mut t);
        assert_eq!(l.deadline(), Some(1000));
        assert_eq!(l.next_lease_end(), Some(10));
        l.prune(11);
        assert_eq!(l.readers.len(), 1);
        assert_eq!(l.readers[0].owner, b"long");
    }

    #[test]
    fn waiters_ahead_make_new_readers_wait_but_not_reentry_or_downgrade() {
        let mut t = tokens();
        let mut l = RwLock::default();
        l.request(Mode::Read, b"r", 0, 100, Gate::Open, &mut t);
        assert_eq!(
            l.request(Mode::Read, b"new", 0, 100, Gate::Queued, &mut t),
            Outcome::Busy
        );
        assert!(matches!(
            l.request(Mode::Read, b"r", 0, 100, Gate::Queued, &mut t),
            Outcome::Reentered { .. }
        ));
        let mut w = RwLock::default();
        w.request(Mode::Write, b"w", 0, 100, Gate::Open, &mut t);
        assert!(matches!(
            w.request(Mode::Read, b"w", 0, 100, Gate::Queued, &mut t),
            Outcome::Granted { .. }
        ));
    }

    #[test]
    fn a_closed_gate_makes_every_hold_wait_reentry_and_downgrade_included() {
        let mut t = tokens();
        let mut w = RwLock::default();
        let fence = match w.request(Mode::Write, b"w", 0, 100, Gate::Open, &mut t) {
            Outcome::Granted { fence } => fence,
            other => panic!("{other:?}"),
        };
        let before = w.clone();
        for mode in [Mode::Write, Mode::Read] {
            assert_eq!(
                w.request(mode, b"w", 0, 100, Gate::Closed, &mut t),
                Outcome::Busy
            );
        }
        assert_eq!(w, before, "a refused request changes nothing");
        // Once the window ends, the waiting re-entry joins the writer's hold.
        assert!(w.admits(Mode::Write, b"w"));
        assert!(!w.admits(Mode::Write, b"other"));
        assert_eq!(w.grant(Mode::Write, b"w", 50, 100, 99), fence);
        let writer = w.writer.as_ref().unwrap();
        assert_eq!((writer.holds, writer.deadline_ms), (2, 150));
        assert_eq!(w.fence, fence, "no new token for a re-entry");
    }

    #[test]
    fn extend_resets_every_lease_of_the_owner() {
        let mut t = tokens();
        let mut l = RwLock::default();
        l.request(Mode::Write, b"w", 0, 10, Gate::Open, &mut t);
        l.request(Mode::Read, b"w", 0, 20, Gate::Open, &mut t);
        assert!(l.extend(b"w", 5, 500));
        assert_eq!(l.writer.as_ref().unwrap().deadline_ms, 505);
        assert_eq!(l.readers[0].deadline_ms, 505);
        assert!(!l.extend(b"nobody", 5, 500));
    }

    #[test]
    fn expired_writer_frees_the_lock() {
        let mut t = tokens();
        let mut l = RwLock::default();
        l.request(Mode::Write, b"w", 0, 10, Gate::Open, &mut t);
        assert!(matches!(
            l.request(Mode::Read, b"r", 11, 10, Gate::Open, &mut t),
            Outcome::Granted { .. }
        ));
        assert_eq!(l.unlock(b"w", 11), Unlock::NotHeld);
    }

    #[test]
    fn one_owner_granted_twice_from_the_queue_has_one_entry() {
        let mut l = RwLock::default();
        let a = l.grant(Mode::Read, b"same", 0, 100, 7);
        let b = l.grant(Mode::Read, b"same", 0, 200, 8);
        assert_eq!((a, b), (7, 7));
        assert_eq!(l.readers.len(), 1);
        assert_eq!(l.holds(), 2);
        assert_eq!(l.deadline(), Some(200));
    }

    #[test]
    fn a_run_of_readers_is_granted_in_one_pass_with_one_entry_per_owner() {
        let mut l = RwLock::default();
        l.grant(Mode::Read, b"r1", 0, 100, 5);
        let mut next = 10;
        let fences = l.grant_reads(
            &[(b"r1", 300), (b"r2", 100), (b"r3", 100), (b"r2", 50)],
            0,
            &mut || {
                next += 1;
                next
            },
        );
        // r1 was reading: one more hold, its own token; r2's second request joins its first.
        assert_eq!(fences, vec![5, 11, 12, 11]);
        assert_eq!(l.readers.len(), 3);
        assert_eq!(l.holds(), 5);
        assert_eq!(l.fence, 12);
        assert_eq!(l.deadline(), Some(300));
    }

    #[test]
    fn ten_thousand_readers_are_granted_in_linear_time() {
        let owners: Vec<Vec<u8>> = (0..10_000).map(|i| format!("r{i}").into_bytes()).collect();
        let requests: Vec<(&[u8], i64)> = owners.iter().map(|o| (&o[..], 100)).collect();
        let mut l = RwLock::default();
        let mut next = 0;
        let fences = l.grant_reads(&requests, 0, &mut || {
            next += 1;
            next
        });
        assert_eq!(fences.len(), 10_000);
        assert_eq!(l.readers.len(), 10_000);
    }

    #[test]
    fn a_revoked_grant_drops_one_hold_of_its_token_only() {
        let mut l = RwLock::default();
        l.grant(Mode::Read, b"a", 0, 100, 5);
        l.grant(Mode::Read, b"a", 0, 100, 6);
        l.grant(Mode::Read, b"b", 0, 100, 7);
        assert!(l.revoke(5, 10));
        assert_eq!(l.holds(), 2);
        assert!(!l.revoke(99, 10), "no hold carries that token");
        assert!(l.revoke(7, 10));
        assert!(l.revoke(5, 10));
        assert!(l.is_free());
        let mut w = RwLock::default();
        w.grant(Mode::Write, b"w", 0, 100, 9);
        assert!(w.revoke(9, 10));
        assert!(w.is_free());
    }
}
