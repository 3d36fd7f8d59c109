//! The read-write lock: one writer or many readers, each hold with its own
//! lease and token. Pure rules; the time and the token source are arguments.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::lock::state::MAX_HOLDS;

/// Up to this many holds in a delta, owners are found by scanning the
/// readers; beyond it, through an index of them.
const SCAN: usize = 8;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// A hold that changed: granted, re-entered, released, extended or revoked,
/// or the first of the holds that lapsed since the last delta (a replica
/// drops the others from the delta's time: it lists none of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub mode: Mode,
    pub owner: Vec<u8>,
    /// The hold is gone (released or revoked to 0).
    pub gone: bool,
}

/// One hold as a replicated delta carries it: its new state, or `holds` 0
/// when it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaHold {
    pub mode: Mode,
    pub owner: Vec<u8>,
    pub holds: u64,
    pub fence: u64,
    pub deadline_ms: i64,
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
    /// The holds changed since `take_delta` last ran, in order.
    pub changed: Vec<Changed>,
    /// The latest lease end among the holds `prune` dropped since
    /// `take_delta` last ran: a replica told a time at or before it would
    /// keep that hold (the clock went back).
    pub lapsed_until: Option<i64>,
}

impl RwLock {
    /// Drops holds whose lease ended. The first prune that drops any since
    /// `take_delta` last ran records one of them as gone: a command that
    /// changes nothing else then still has a delta to send, and the replica,
    /// told the master's `now_ms`, drops the same holds (it never drops
    /// holds on its own).
    pub fn prune(&mut self, now_ms: i64) {
        let mut lapsed = self.lapsed_until;
        let mut first: Option<(Mode, Vec<u8>)> = None;
        if let Some(w) = self.writer.take_if(|w| !w.is_live(now_ms)) {
            self.ended.extend(w.held_for(now_ms));
            lapsed = lapsed.max(Some(w.deadline_ms));
            first = Some((Mode::Write, w.owner));
        }
        let ended = &mut self.ended;
        self.readers.retain(|r| {
            let live = r.is_live(now_ms);
            if !live {
                ended.extend(r.held_for(now_ms));
                lapsed = lapsed.max(Some(r.deadline_ms));
                if first.is_none() {
                    first = Some((Mode::Read, r.owner.clone()));
                }
            }
            live
        });
        if let (None, Some((mode, owner))) = (self.lapsed_until, first) {
            self.record(mode, &owner, true);
        }
        self.lapsed_until = lapsed;
        self.fit();
    }

    /// Whether holds lapsed since `take_delta` last ran: replicas must hear
    /// of it, even from a command that changed nothing else.
    pub fn lapsed(&self) -> bool {
        self.lapsed_until.is_some()
    }

    fn record(&mut self, mode: Mode, owner: &[u8], gone: bool) {
        self.changed.push(Changed {
            mode,
            owner: owner.to_vec(),
            gone,
        });
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
            let fence = hold.fence;
            self.record(mode, owner, false);
            return Outcome::Reentered { fence };
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
            let fence = hold.fence;
            self.record(mode, owner, false);
            return fence;
        }
        let hold = Hold::new(owner, fence, now_ms, ttl_ms);
        match mode {
            Mode::Read => self.readers.push(hold),
            Mode::Write => self.writer = Some(hold),
        }
        self.fence = self.fence.max(fence);
        self.record(mode, owner, false);
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
            self.record(Mode::Read, owner, false);
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
            let (owner, gone) = (w.owner.clone(), w.holds == 0);
            if gone {
                self.writer = None;
            }
            self.changed.push(Changed {
                mode: Mode::Write,
                owner,
                gone,
            });
            return true;
        }
        let Some(i) = self.readers.iter().position(|r| r.fence == fence) else {
            return false;
        };
        self.readers[i].holds -= 1;
        let gone = self.readers[i].holds == 0;
        let owner = if gone {
            let owner = self.readers.remove(i).owner;
            self.fit();
            owner
        } else {
            self.readers[i].owner.clone()
        };
        self.changed.push(Changed {
            mode: Mode::Read,
            owner,
            gone,
        });
        true
    }

    /// Releases one hold of `owner`: write holds before read holds.
    #[cfg(test)]
    pub fn unlock(&mut self, owner: &[u8], now_ms: i64) -> Unlock {
        self.unlock_in(owner, None, now_ms)
    }

    /// One hold of `owner` in `mode`; with no mode, its write hold first.
    /// A downgraded owner (writing and reading) names the mode it lets go:
    /// a read released first keeps the write hold.
    pub fn unlock_in(&mut self, owner: &[u8], mode: Option<Mode>, now_ms: i64) -> Unlock {
        self.prune(now_ms);
        if mode != Some(Mode::Read) {
            if let Some(w) = self.writer.as_mut().filter(|w| w.owner == owner) {
                w.holds -= 1;
                if w.holds > 0 {
                    self.record(Mode::Write, owner, false);
                    return Unlock::Remaining;
                }
                self.ended.extend(w.held_for(now_ms));
                self.writer = None;
                self.record(Mode::Write, owner, true);
                return Unlock::Gone;
            }
            if mode == Some(Mode::Write) {
                return Unlock::NotHeld;
            }
        }
        let Some(i) = self.readers.iter().position(|r| r.owner == owner) else {
            return Unlock::NotHeld;
        };
        self.readers[i].holds -= 1;
        if self.readers[i].holds > 0 {
            self.record(Mode::Read, owner, false);
            return Unlock::Remaining;
        }
        let gone = self.readers.remove(i);
        self.ended.extend(gone.held_for(now_ms));
        self.fit();
        self.record(Mode::Read, owner, true);
        Unlock::Gone
    }

    /// Resets every lease of `owner`; false if it holds nothing.
    pub fn extend(&mut self, owner: &[u8], now_ms: i64, ttl_ms: i64) -> bool {
        self.prune(now_ms);
        let deadline = now_ms.saturating_add(ttl_ms);
        let writing = self.writer.as_mut().filter(|w| w.owner == owner);
        let writing = writing.map(|w| w.deadline_ms = deadline).is_some();
        let reading = self
            .reader_mut(owner)
            .map(|r| r.deadline_ms = deadline)
            .is_some();
        if writing {
            self.record(Mode::Write, owner, false);
        }
        if reading {
            self.record(Mode::Read, owner, false);
        }
        writing || reading
    }

    /// Takes the changes since the last call as the delta a replica applies
    /// at `now_ms` (`apply_delta`): the holds that went, then the new state
    /// of each changed hold — the writer, then readers in the order they
    /// stand, so that a replica adds new ones in the same order. Holds that
    /// lapsed are left out but the first (`prune`): the replica drops them
    /// from `now_ms`. `None`
    /// when the whole state is no longer (a new key), or when a replica
    /// told `now_ms` would keep a hold dropped here (the clock went back).
    pub fn take_delta(&mut self, now_ms: i64) -> Option<Vec<DeltaHold>> {
        let changed = std::mem::take(&mut self.changed);
        if self.lapsed_until.take().is_some_and(|at| at >= now_ms) {
            return None;
        }
        // Where each hold last went: earlier changes to it are superseded.
        let mut last_gone: FxHashMap<(Mode, &[u8]), usize> = FxHashMap::default();
        for (i, c) in changed.iter().enumerate().filter(|(_, c)| c.gone) {
            last_gone.insert((c.mode, &c.owner[..]), i);
        }
        let mut delta: Vec<DeltaHold> = changed
            .iter()
            .enumerate()
            .filter(|&(i, c)| c.gone && last_gone[&(c.mode, &c.owner[..])] == i)
            .map(|(_, c)| DeltaHold {
                mode: c.mode,
                owner: c.owner.clone(),
                holds: 0,
                fence: 0,
                deadline_ms: 0,
            })
            .collect();
        let mut wanted: FxHashSet<(Mode, &[u8])> = FxHashSet::default();
        for (i, c) in changed.iter().enumerate() {
            let key = (c.mode, &c.owner[..]);
            if !c.gone && last_gone.get(&key).is_none_or(|&g| g < i) {
                wanted.insert(key);
            }
        }
        let writer = self
            .writer
            .iter()
            .filter(|w| wanted.contains(&(Mode::Write, &w.owner[..])));
        let mut at: Vec<usize> = if wanted.len() <= SCAN {
            // A few owners: found by scanning, no hashing of every reader.
            let owners = wanted.iter().filter(|(m, _)| *m == Mode::Read);
            owners
                .filter_map(|(_, o)| self.readers.iter().position(|r| r.owner == *o))
                .collect()
        } else {
            let readers = self.readers.iter().enumerate();
            readers
                .filter(|(_, r)| wanted.contains(&(Mode::Read, &r.owner[..])))
                .map(|(i, _)| i)
                .collect()
        };
        at.sort_unstable();
        let readers = at.iter().map(|&i| (Mode::Read, &self.readers[i]));
        for (mode, h) in writer.map(|w| (Mode::Write, w)).chain(readers) {
            delta.push(DeltaHold {
                mode,
                owner: h.owner.clone(),
                holds: h.holds,
                fence: h.fence,
                deadline_ms: h.deadline_ms,
            });
        }
        let entries = usize::from(self.writer.is_some()) + self.readers.len();
        (!delta.is_empty() && delta.len() < entries).then_some(delta)
    }

    /// Applies a master's delta (`take_delta`): drops the holds whose lease
    /// ended before `now_ms`, sets the key's token to `fence`, then takes
    /// each hold in order — gone (holds 0) if present, updated in place (its
    /// token unchanged) if present, added last if not. False, and nothing
    /// changed, if the result is no state the master could hold: `fence`
    /// below the key's or below a hold's, a lease that already ended, a
    /// writer beside others' readers, too many holds, or none left.
    pub fn apply_delta(&mut self, now_ms: i64, fence: u64, delta: &[DeltaHold]) -> bool {
        if !self.delta_fits(now_ms, fence, delta) {
            return false;
        }
        self.fence = fence;
        self.writer.take_if(|w| !w.is_live(now_ms));
        self.readers.retain(|r| r.is_live(now_ms));
        // A reader that goes keeps its place (holds 0) until the end, so that
        // the index stays right.
        let mut index: Option<FxHashMap<Vec<u8>, usize>> = (delta.len() > SCAN).then(|| {
            let readers = self.readers.iter().enumerate();
            readers.map(|(i, r)| (r.owner.clone(), i)).collect()
        });
        let mut went = false;
        for d in delta {
            let hold = || Hold {
                owner: d.owner.clone(),
                holds: d.holds,
                fence: d.fence,
                deadline_ms: d.deadline_ms,
                granted_ms: 0,
            };
            if d.mode == Mode::Write {
                match self.writer.as_mut().filter(|w| w.owner == d.owner) {
                    Some(_) if d.holds == 0 => self.writer = None,
                    Some(w) => (w.holds, w.deadline_ms) = (d.holds, d.deadline_ms),
                    None if d.holds == 0 => {}
                    None => self.writer = Some(hold()),
                }
                continue;
            }
            let at = match &index {
                Some(index) => index.get(&d.owner).copied(),
                None => self
                    .readers
                    .iter()
                    .position(|r| r.holds > 0 && r.owner == d.owner),
            };
            match at {
                Some(i) if d.holds == 0 => {
                    self.readers[i].holds = 0;
                    went = true;
                    if let Some(index) = &mut index {
                        index.remove(&d.owner);
                    }
                }
                Some(i) => {
                    let r = &mut self.readers[i];
                    (r.holds, r.deadline_ms) = (d.holds, d.deadline_ms);
                }
                None if d.holds == 0 => {}
                None => {
                    if let Some(index) = &mut index {
                        index.insert(d.owner.clone(), self.readers.len());
                    }
                    self.readers.push(hold());
                }
            }
        }
        if went {
            self.readers.retain(|r| r.holds > 0);
        }
        self.fit();
        true
    }

    /// Whether `apply_delta` may apply `delta`: it works the result out
    /// without changing anything.
    fn delta_fits(&self, now_ms: i64, fence: u64, delta: &[DeltaHold]) -> bool {
        if fence < self.fence {
            return false;
        }
        let index: Option<FxHashMap<&[u8], &Hold>> =
            (delta.len() > SCAN).then(|| self.readers.iter().map(|r| (&r.owner[..], r)).collect());
        let before = |mode: Mode, owner: &[u8]| -> Option<&Hold> {
            let hold = match (mode, &index) {
                (Mode::Write, _) => self.writer.as_ref().filter(|w| w.owner == owner),
                (Mode::Read, Some(index)) => index.get(owner).copied(),
                (Mode::Read, None) => self.readers.iter().find(|r| r.owner == owner),
            };
            hold.filter(|h| h.is_live(now_ms))
        };
        // Each touched hold's final state (None: gone).
        let mut touched: FxHashMap<(Mode, &[u8]), Option<&DeltaHold>> = FxHashMap::default();
        for d in delta {
            let key = (d.mode, &d.owner[..]);
            let current = match touched.get(&key) {
                Some(state) => state.map(|d| d.fence),
                None => before(d.mode, &d.owner).map(|h| h.fence),
            };
            if d.holds > 0
                && (d.holds > MAX_HOLDS
                    || d.fence > fence
                    || d.deadline_ms < now_ms
                    || current.is_some_and(|f| f != d.fence))
            {
                return false;
            }
            touched.insert(key, (d.holds > 0).then_some(d));
        }
        let live = self.holds_iter().filter(|h| h.is_live(now_ms));
        let mut entries = 0usize;
        let mut total = 0u64;
        for h in live {
            entries += 1;
            total = total.saturating_add(h.holds);
        }
        let writer = self.writer.as_ref().filter(|w| w.is_live(now_ms));
        let mut writer_owner = writer.map(|w| &w.owner[..]);
        for &(mode, owner) in touched.keys() {
            if let Some(h) = before(mode, owner) {
                entries -= 1;
                total -= h.holds;
                if mode == Mode::Write {
                    writer_owner = None;
                }
            }
        }
        for (&(mode, owner), d) in &touched {
            let Some(d) = d else { continue };
            entries += 1;
            total = total.saturating_add(d.holds);
            if mode == Mode::Write {
                if writer_owner.is_some() {
                    return false;
                }
                writer_owner = Some(owner);
            }
        }
        if entries == 0 || total > MAX_HOLDS {
            return false;
        }
        // Readers beside a writer are only its own (a downgrade in progress).
        let Some(w) = writer_owner else {
            return true;
        };
        let mut readers_now = touched
            .iter()
            .filter(|((m, _), d)| *m == Mode::Read && d.is_some());
        let mut readers_before = self.readers.iter().filter(|r| r.is_live(now_ms));
        readers_now.all(|((_, o), _)| *o == w)
            && readers_before
                .all(|r| r.owner == w || touched.contains_key(&(Mode::Read, &r.owner[..])))
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
    fn a_mode_named_releases_only_a_hold_in_that_mode() {
        // A downgraded owner (writing and reading) lets go of the read first:
        // the write hold stays, and nobody else gets in.
        let mut t = tokens();
        let mut l = RwLock::default();
        req(&mut l, Mode::Write, "w", 0, &mut t);
        req(&mut l, Mode::Read, "w", 0, &mut t);
        assert_eq!(l.unlock_in(b"w", Some(Mode::Read), 0), Unlock::Gone);
        assert!(l.writer.is_some());
        assert!(l.readers.is_empty());
        assert_eq!(l.unlock_in(b"w", Some(Mode::Read), 0), Unlock::NotHeld);
        assert_eq!(req(&mut l, Mode::Read, "other", 0, &mut t), Outcome::Busy);
        assert_eq!(l.unlock_in(b"w", Some(Mode::Write), 0), Unlock::Gone);
        assert_eq!(l.unlock_in(b"w", Some(Mode::Write), 0), Unlock::NotHeld);
        // A reader has no write hold to let go of.
        req(&mut l, Mode::Read, "r", 0, &mut t);
        assert_eq!(l.unlock_in(b"r", Some(Mode::Write), 0), Unlock::NotHeld);
        assert_eq!(l.unlock_in(b"r", Some(Mode::Read), 0), Unlock::Gone);
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

    /// What replicas must agree on: each hold's owner, count, token and
    /// lease, in order, and the key's token.
    fn replicated(l: &RwLock) -> (Vec<DeltaHold>, u64) {
        let writer = l.writer.iter().map(|h| (Mode::Write, h));
        let holds = writer.chain(l.readers.iter().map(|h| (Mode::Read, h)));
        let holds = holds.map(|(mode, h)| DeltaHold {
            mode,
            owner: h.owner.clone(),
            holds: h.holds,
            fence: h.fence,
            deadline_ms: h.deadline_ms,
        });
        (holds.collect(), l.fence)
    }

    /// The master's publish, seen from a replica: nothing left (`DEL`), the
    /// whole state, or the delta (true).
    fn follow(master: &mut RwLock, replica: &mut Option<RwLock>, now: i64) -> bool {
        if master.is_free() {
            master.changed.clear();
            *replica = None;
            return false;
        }
        let delta = master.take_delta(now);
        match &delta {
            Some(delta) => {
                let r = replica.as_mut().expect("a delta follows a whole state");
                assert!(r.apply_delta(now, master.fence, delta), "{delta:?}");
            }
            None => {
                let mut whole = master.clone();
                whole.changed.clear();
                *replica = Some(whole);
            }
        }
        assert_eq!(
            replicated(replica.as_ref().unwrap()),
            replicated(master),
            "at {now}"
        );
        delta.is_some()
    }

    #[test]
    fn a_replica_applying_each_delta_holds_what_the_master_holds() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut next = 0;
        let mut draw = move || {
            next += 1;
            next
        };
        let mut master = RwLock::default();
        let mut replica: Option<RwLock> = None;
        let mut now = 1_000;
        let mut sent = [0; 2];
        for _ in 0..20_000 {
            // Mostly forward; now and then the clock goes back.
            now = if rand(50) == 0 {
                now - rand(100) as i64
            } else {
                now + rand(20) as i64
            };
            let owner = format!("o{}", rand(12)).into_bytes();
            let ttl = 1 + rand(200) as i64;
            let changed = match rand(7) {
                0 | 1 => matches!(
                    master.request(Mode::Read, &owner, now, ttl, Gate::Open, &mut draw),
                    Outcome::Granted { .. } | Outcome::Reentered { .. }
                ),
                2 => matches!(
                    master.request(Mode::Write, &owner, now, ttl, Gate::Open, &mut draw),
                    Outcome::Granted { .. } | Outcome::Reentered { .. }
                ),
                3 => {
                    let gone = master.unlock(&owner, now) == Unlock::Gone;
                    // A hand-off: waiting readers (this owner among them, at times).
                    if gone && rand(2) == 0 && master.writer.is_none() {
                        let waiting: Vec<Vec<u8>> = (0..rand(12))
                            .map(|i| format!("o{}", (i * 5) % 13).into_bytes())
                            .collect();
                        let requests: Vec<(&[u8], i64)> =
                            waiting.iter().map(|o| (&o[..], ttl)).collect();
                        master.grant_reads(&requests, now, &mut draw);
                    }
                    true
                }
                4 => master.extend(&owner, now, ttl),
                5 => {
                    let fences: Vec<u64> = master.holds_iter().map(|h| h.fence).collect();
                    !fences.is_empty()
                        && master.revoke(fences[rand(fences.len() as u64) as usize], now)
                }
                _ => {
                    master.prune(now);
                    false
                }
            };
            if changed || !master.changed.is_empty() {
                sent[usize::from(follow(&mut master, &mut replica, now))] += 1;
            }
        }
        assert!(sent[0] > 1000 && sent[1] > 5000, "whole, delta: {sent:?}");
    }

    #[test]
    fn a_delta_carries_only_the_holds_that_changed() {
        let mut l = RwLock::default();
        for i in 0..2000 {
            l.grant(Mode::Read, format!("r{i}").as_bytes(), 0, 1000, i + 1);
        }
        assert!(l.take_delta(0).is_none(), "a new key travels whole");
        let mut replica = l.clone();
        let mut t = tokens();
        for what in ["unlock", "extend", "re-entry", "new reader"] {
            let done = match what {
                "unlock" => l.unlock(b"r7", 10) == Unlock::Gone,
                "extend" => l.extend(b"r8", 10, 5000),
                "re-entry" => matches!(
                    l.request(Mode::Read, b"r9", 10, 100, Gate::Open, &mut t),
                    Outcome::Reentered { .. }
                ),
                _ => matches!(
                    l.request(Mode::Read, b"new", 10, 100, Gate::Open, &mut t),
                    Outcome::Granted { .. }
                ),
            };
            assert!(done, "{what}");
            let delta = l.take_delta(10).unwrap();
            assert_eq!(delta.len(), 1, "{what}: {delta:?}");
            assert!(replica.apply_delta(10, l.fence, &delta), "{what}");
            assert_eq!(replicated(&replica), replicated(&l), "{what}");
        }
        let delta = l.take_delta(10);
        assert_eq!(delta, None, "nothing changed: nothing to send as a delta");
    }

    #[test]
    fn extend_changes_the_writers_hold_and_its_own_read_hold() {
        let mut l = RwLock::default();
        l.grant(Mode::Write, b"w", 0, 100, 5);
        l.grant(Mode::Read, b"w", 0, 100, 6);
        l.changed.clear();
        assert!(l.extend(b"w", 50, 500));
        let changed: Vec<(Mode, &[u8])> =
            l.changed.iter().map(|c| (c.mode, &c.owner[..])).collect();
        assert_eq!(changed, [(Mode::Write, &b"w"[..]), (Mode::Read, b"w")]);
        assert_eq!(
            l.take_delta(50),
            None,
            "two holds: the whole state is as short"
        );
    }

    #[test]
    fn an_owner_released_and_granted_again_in_one_command_stands_last() {
        let mut l = RwLock::default();
        for (i, o) in ["a", "b", "c", "d"].iter().enumerate() {
            l.grant(Mode::Read, o.as_bytes(), 0, 100, i as u64 + 1);
        }
        l.take_delta(0);
        let mut replica = l.clone();
        assert_eq!(l.unlock(b"a", 10), Unlock::Gone);
        let mut next = 10;
        l.grant_reads(&[(b"e", 100), (b"a", 100)], 10, &mut || {
            next += 1;
            next
        });
        let owners: Vec<&[u8]> = l.readers.iter().map(|r| &r.owner[..]).collect();
        assert_eq!(owners, [&b"b"[..], b"c", b"d", b"e", b"a"]);
        let delta = l.take_delta(10).unwrap();
        assert_eq!((delta[0].owner.as_slice(), delta[0].holds), (&b"a"[..], 0));
        assert!(replica.apply_delta(10, l.fence, &delta));
        assert_eq!(replicated(&replica), replicated(&l));
    }

    #[test]
    fn lapsed_holds_are_left_to_the_replica_unless_the_clock_went_back() {
        let mut l = RwLock::default();
        l.grant(Mode::Read, b"short", 0, 10, 1);
        l.grant(Mode::Read, b"shorter", 0, 5, 2);
        for i in 0..4 {
            l.grant(Mode::Read, format!("r{i}").as_bytes(), 0, 1000, i + 3);
        }
        l.take_delta(0);
        let mut replica = l.clone();
        assert!(l.extend(b"r0", 50, 1000));
        let delta = l.take_delta(50).unwrap();
        let named: Vec<(&[u8], u64)> = delta.iter().map(|d| (&d.owner[..], d.holds)).collect();
        assert_eq!(
            named,
            [(&b"short"[..], 0), (b"r0", 1)],
            "the first lapsed reader is named gone, the other implied"
        );
        assert!(replica.apply_delta(50, l.fence, &delta));
        assert_eq!(replicated(&replica), replicated(&l));
        // Dropped at 100 (lease end 90), then a command at 80: a replica
        // told 80 would keep that hold, so the whole state goes.
        l.grant(Mode::Read, b"brief", 50, 40, 9);
        l.take_delta(50);
        l.prune(100);
        assert!(l.extend(b"r1", 80, 1000));
        assert_eq!(l.take_delta(80), None);
    }

    /// A command that changes nothing (a busy writer, a release by no
    /// holder) still sends the lapse: the replica keeps no reader the
    /// master dropped, however many lapsed.
    #[test]
    fn a_prune_alone_sends_a_delta_that_drops_the_same_holds_on_a_replica() {
        let mut l = RwLock::default();
        for i in 0..100 {
            l.grant(Mode::Read, format!("r{i}").as_bytes(), 0, 10, i + 1);
        }
        l.grant(Mode::Read, b"long", 0, 1000, 200);
        l.grant(Mode::Read, b"long too", 0, 1000, 201);
        l.take_delta(0);
        let mut replica = l.clone();
        let mut t = tokens();
        let busy = l.request(Mode::Write, b"w", 50, 100, Gate::Open, &mut t);
        assert_eq!(busy, Outcome::Busy);
        assert!(l.lapsed());
        let delta = l.take_delta(50).expect("a delta, not the whole state");
        assert_eq!(delta.len(), 1, "{delta:?}");
        assert!(replica.apply_delta(50, l.fence, &delta));
        assert_eq!(replicated(&replica), replicated(&l));
        assert_eq!(replica.readers.len(), 2);
        assert!(!l.lapsed());
        // Nothing lapsed since: nothing to send.
        assert_eq!(l.unlock(b"nobody", 60), Unlock::NotHeld);
        assert!(!l.lapsed() && l.changed.is_empty());
    }

    #[test]
    fn a_delta_no_master_could_send_changes_nothing() {
        let mut l = RwLock::default();
        l.grant(Mode::Read, b"a", 0, 1000, 5);
        l.grant(Mode::Read, b"b", 0, 1000, 6);
        let hold = |mode, owner: &str, holds, fence, deadline_ms| DeltaHold {
            mode,
            owner: owner.as_bytes().to_vec(),
            holds,
            fence,
            deadline_ms,
        };
        let cases: &[(&str, u64, Vec<DeltaHold>)] = &[
            (
                "a writer beside others' readers",
                7,
                vec![hold(Mode::Write, "w", 1, 7, 500)],
            ),
            (
                "a writer beside a reader left",
                7,
                vec![
                    hold(Mode::Read, "a", 0, 0, 0),
                    hold(Mode::Write, "a", 1, 7, 500),
                ],
            ),
            (
                "two writers",
                8,
                vec![
                    hold(Mode::Read, "a", 0, 0, 0),
                    hold(Mode::Read, "b", 0, 0, 0),
                    hold(Mode::Write, "x", 1, 7, 500),
                    hold(Mode::Write, "y", 1, 8, 500),
                ],
            ),
            (
                "a key token going back",
                5,
                vec![hold(Mode::Read, "c", 1, 5, 500)],
            ),
            (
                "a hold token above the key's",
                7,
                vec![hold(Mode::Read, "c", 1, 8, 500)],
            ),
            (
                "a lease already ended",
                7,
                vec![hold(Mode::Read, "c", 1, 7, 9)],
            ),
            (
                "a hold changing its token",
                7,
                vec![hold(Mode::Read, "a", 1, 7, 500)],
            ),
            (
                "no hold left",
                6,
                vec![
                    hold(Mode::Read, "a", 0, 0, 0),
                    hold(Mode::Read, "b", 0, 0, 0),
                ],
            ),
            (
                "too many holds",
                6,
                vec![hold(Mode::Read, "a", MAX_HOLDS, 5, 500)],
            ),
        ];
        for (what, fence, delta) in cases {
            let before = l.clone();
            assert!(!l.apply_delta(10, *fence, delta), "{what}");
            assert_eq!(l, before, "{what}: changed");
        }
        // What a master does send: a hand-over to a writer once both readers went.
        let delta = [
            hold(Mode::Read, "a", 0, 0, 0),
            hold(Mode::Read, "b", 0, 0, 0),
            hold(Mode::Write, "w", 1, 7, 500),
        ];
        assert!(l.apply_delta(10, 7, &delta));
        assert_eq!(l.writer.as_ref().unwrap().owner, b"w");
        assert!(l.readers.is_empty());
        // The same with many holds, through the index of readers.
        let mut many = RwLock::default();
        for i in 0..20 {
            many.grant(Mode::Read, format!("r{i}").as_bytes(), 0, 1000, i + 1);
        }
        let mut delta: Vec<DeltaHold> = (0..20)
            .map(|i| hold(Mode::Read, &format!("r{i}"), 0, 0, 0))
            .collect();
        delta.push(hold(Mode::Write, "r3", 1, 20, 500));
        delta.push(hold(Mode::Read, "r4", 1, 20, 500));
        let before = many.clone();
        assert!(
            !many.apply_delta(10, 20, &delta),
            "a writer beside another's reader"
        );
        assert_eq!(many, before);
        delta.pop();
        assert!(many.apply_delta(10, 20, &delta));
        assert_eq!(replicated(&many).0, [hold(Mode::Write, "r3", 1, 20, 500)]);
    }
}
