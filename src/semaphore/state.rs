//! The semaphore: at most `limit` permits held at once, each hold with its
//! own lease and token. Pure rules; the time and the token source are
//! arguments.
//!
//! Invariant — the bound: `used` (the sum of the holds' permits) never
//! exceeds `limit` through a grant: [`Semaphore::grant`] is only called for a
//! request that [`Semaphore::fits`]. A lowered limit leaves holds above it to
//! end by themselves; nothing new is granted until they have.

use crate::args::SemRequest;
use crate::memory::block_size;

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

/// No slot (an empty place in the index).
const EMPTY: u32 = u32::MAX;

/// A hold with its owner and its places in the two heaps.
#[derive(Debug, Clone)]
struct Slot {
    owner: Box<[u8]>,
    hold: Hold,
    /// Positions in the heaps (`Heap::EARLIEST`, `Heap::LATEST`).
    at: [u32; 2],
}

impl Slot {
    fn end(&self) -> (i64, u64) {
        (self.hold.deadline_ms, self.hold.fence)
    }
}

/// A binary heap of slot numbers by lease end: `Heap::EARLIEST` puts the
/// first lease to end on top, `Heap::LATEST` the last. Each slot records its
/// position, so that any hold can be taken out in O(log n).
#[derive(Debug, Clone, Default)]
struct Heap {
    items: Vec<u32>,
}

impl Heap {
    const EARLIEST: usize = 0;
    const LATEST: usize = 1;

    fn before(which: usize, slots: &[Slot], a: u32, b: u32) -> bool {
        let (a, b) = (slots[a as usize].end(), slots[b as usize].end());
        if which == Self::EARLIEST {
            a < b
        } else {
            a > b
        }
    }

    fn place(&mut self, which: usize, slots: &mut [Slot], pos: usize, slot: u32) {
        self.items[pos] = slot;
        slots[slot as usize].at[which] = pos as u32;
    }

    fn top(&self) -> Option<u32> {
        self.items.first().copied()
    }

    fn push(&mut self, which: usize, slots: &mut [Slot], slot: u32) {
        self.items.push(slot);
        self.up(which, slots, self.items.len() - 1);
    }

    fn remove(&mut self, which: usize, slots: &mut [Slot], pos: usize) {
        let Some(last) = self.items.pop() else {
            return;
        };
        if pos < self.items.len() {
            self.place(which, slots, pos, last);
            self.down(which, slots, pos);
            self.up(which, slots, slots[last as usize].at[which] as usize);
        }
    }

    fn up(&mut self, which: usize, slots: &mut [Slot], mut pos: usize) {
        let slot = self.items[pos];
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if !Self::before(which, slots, slot, self.items[parent]) {
                break;
            }
            self.place(which, slots, pos, self.items[parent]);
            pos = parent;
        }
        self.place(which, slots, pos, slot);
    }

    fn down(&mut self, which: usize, slots: &mut [Slot], mut pos: usize) {
        let slot = self.items[pos];
        loop {
            let left = 2 * pos + 1;
            if left >= self.items.len() {
                break;
            }
            let right = left + 1;
            let child = if right < self.items.len()
                && Self::before(which, slots, self.items[right], self.items[left])
            {
                right
            } else {
                left
            };
            if !Self::before(which, slots, self.items[child], slot) {
                break;
            }
            self.place(which, slots, pos, self.items[child]);
            pos = child;
        }
        self.place(which, slots, pos, slot);
    }

    /// Orders every slot anew (after many lease ends changed at once): O(n).
    fn rebuild(&mut self, which: usize, slots: &mut [Slot]) {
        self.items.clear();
        self.items.extend(0..slots.len() as u32);
        for (pos, slot) in slots.iter_mut().enumerate() {
            slot.at[which] = pos as u32;
        }
        for pos in (0..self.items.len() / 2).rev() {
            self.down(which, slots, pos);
        }
    }
}

/// Bytes the allocator holds for a vector's buffer.
fn vec_bytes<T>(v: &Vec<T>) -> usize {
    block_size(v.as_ptr().cast(), v.capacity() * std::mem::size_of::<T>())
}

/// Where an owner's slot number belongs in an index of `len` places (a
/// power of two). Seeded per process: clients choose owners, and must not be
/// able to choose ones that collide.
fn home(owner: &[u8], len: usize) -> usize {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let here = std::ptr::from_ref(&SEED) as u64;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        xxhash_rust::xxh3::xxh3_64(&[here.to_le_bytes(), now.to_le_bytes()].concat())
    });
    xxhash_rust::xxh3::xxh3_64_with_seed(owner, seed) as usize & (len - 1)
}

#[derive(Debug, Clone, Default)]
pub struct Semaphore {
    pub limit: u64,
    /// The last token issued on this key.
    pub fence: u64,
    used: u64,
    /// Every hold, in no order.
    slots: Vec<Slot>,
    /// Owner → slot: open addressing with linear probing, `EMPTY` where
    /// free; a power of two long and at most half full (empty without holds).
    index: Vec<u32>,
    /// Slot numbers by lease end: `[earliest first, latest first]`.
    heaps: [Heap; 2],
    /// Bytes the allocator holds for the owners.
    owner_bytes: usize,
    /// The latest time holds were dropped at (the replicas drop at it too).
    pub pruned_at: i64,
    /// Owners whose hold changed since the caller last took them (the
    /// effect carries only those).
    changed: Vec<Vec<u8>>,
    /// Whether `prune` dropped holds since the caller last took the changes:
    /// replicas must hear of it even when no hold changed.
    lapsed: bool,
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
        self.slots.len()
    }

    pub fn is_free(&self) -> bool {
        self.slots.is_empty()
    }

    /// The index place and slot of `owner`'s hold.
    fn find(&self, owner: &[u8]) -> Option<(usize, u32)> {
        if self.index.is_empty() {
            return None;
        }
        let mask = self.index.len() - 1;
        let mut place = home(owner, self.index.len());
        loop {
            let slot = self.index[place];
            if slot == EMPTY {
                return None;
            }
            if *self.slots[slot as usize].owner == *owner {
                return Some((place, slot));
            }
            place = (place + 1) & mask;
        }
    }

    pub fn hold(&self, owner: &[u8]) -> Option<&Hold> {
        self.find(owner)
            .map(|(_, slot)| &self.slots[slot as usize].hold)
    }

    /// Every hold, in no particular order.
    pub fn holds(&self) -> impl Iterator<Item = (&[u8], &Hold)> {
        self.slots.iter().map(|s| (&*s.owner, &s.hold))
    }

    /// Puts `slot` in the index (which has room for it).
    fn index_slot(&mut self, slot: u32) {
        let mask = self.index.len() - 1;
        let mut place = home(&self.slots[slot as usize].owner, self.index.len());
        while self.index[place] != EMPTY {
            place = (place + 1) & mask;
        }
        self.index[place] = slot;
    }

    /// Sizes the index for the slots there are (at most 1/2 full: short
    /// probes; at least 1/8 once it has more than 64 places), refilling it
    /// when it changes size. True if it did (every slot is indexed then).
    fn size_index(&mut self) -> bool {
        let holds = self.slots.len();
        let fits = |len: usize| holds * 2 <= len;
        let roomy = |len: usize| len <= 64 || holds * 8 >= len;
        let len = self.index.len();
        if holds == 0 {
            self.index = Vec::new();
            return true;
        }
        if len > 0 && fits(len) && roomy(len) {
            return false;
        }
        let mut len = 8;
        while !fits(len) {
            len *= 2;
        }
        self.index = vec![EMPTY; len];
        for slot in 0..holds as u32 {
            self.index_slot(slot);
        }
        true
    }

    /// Empties index place `place`, moving back the entries that probed
    /// past it (no tombstones: lookups stay as short as the table is full).
    fn unindex(&mut self, mut place: usize) {
        let mask = self.index.len() - 1;
        self.index[place] = EMPTY;
        let mut next = place;
        loop {
            next = (next + 1) & mask;
            let slot = self.index[next];
            if slot == EMPTY {
                return;
            }
            let at = home(&self.slots[slot as usize].owner, self.index.len());
            // The entry stays unless its home lies cyclically outside
            // (place, next]: then a lookup from its home would stop at `place`.
            let stays = if place <= next {
                place < at && at <= next
            } else {
                place < at || at <= next
            };
            if !stays {
                self.index[place] = slot;
                self.index[next] = EMPTY;
                place = next;
            }
        }
    }

    /// Adds a hold for an owner that holds nothing here.
    fn add(&mut self, owner: Box<[u8]>, hold: Hold) {
        self.used += hold.permits;
        self.owner_bytes += block_size(owner.as_ptr(), owner.len());
        let slot = self.slots.len() as u32;
        self.slots.push(Slot {
            owner,
            hold,
            at: [0, 0],
        });
        if !self.size_index() {
            self.index_slot(slot);
        }
        for which in [Heap::EARLIEST, Heap::LATEST] {
            self.heaps[which].push(which, &mut self.slots, slot);
        }
    }

    /// The index place of `slot` (every slot is indexed).
    fn place_of(&self, slot: u32) -> usize {
        let mask = self.index.len() - 1;
        let mut place = home(&self.slots[slot as usize].owner, self.index.len());
        while self.index[place] != slot {
            place = (place + 1) & mask;
        }
        place
    }

    /// Takes out the hold in `slot` (at index place `place`); the last slot
    /// moves into its place.
    fn take(&mut self, place: usize, slot: u32) -> Hold {
        self.unindex(place);
        for which in [Heap::EARLIEST, Heap::LATEST] {
            let pos = self.slots[slot as usize].at[which] as usize;
            self.heaps[which].remove(which, &mut self.slots, pos);
        }
        let last = self.slots.len() as u32 - 1;
        if slot != last {
            // The last slot becomes `slot`: its index entry and heap
            // positions follow it.
            let at = self.place_of(last);
            self.index[at] = slot;
            let moved = &self.slots[last as usize];
            for which in [Heap::EARLIEST, Heap::LATEST] {
                let pos = moved.at[which] as usize;
                self.heaps[which].items[pos] = slot;
            }
        }
        let taken = self.slots.swap_remove(slot as usize);
        self.used -= taken.hold.permits;
        self.owner_bytes -= block_size(taken.owner.as_ptr(), taken.owner.len());
        taken.hold
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

    /// The slot whose lease ends first (`Heap::EARLIEST`) or last.
    fn top(&self, which: usize) -> Option<&Slot> {
        self.heaps[which].top().map(|s| &self.slots[s as usize])
    }

    /// Drops the holds whose lease ended before `now_ms` (or before a later
    /// time they were dropped at already): O(ended · log n). A replica,
    /// told `pruned_at`, drops the same ones (it never drops holds on its
    /// own), so a command that drops some must send an effect ([`lapsed`]).
    ///
    /// [`lapsed`]: Semaphore::lapsed
    pub fn prune(&mut self, now_ms: i64) {
        self.pruned_at = self.clock(now_ms);
        while let Some(slot) = self.heaps[Heap::EARLIEST].top() {
            if self.slots[slot as usize].hold.deadline_ms >= self.pruned_at {
                break;
            }
            let place = self.place_of(slot);
            let hold = self.take(place, slot);
            self.ended.extend(hold.held_for(now_ms));
            self.lapsed = true;
        }
        self.fit();
    }

    /// Whether holds lapsed since the changes were last taken: replicas must
    /// hear of it, even from a command that changed nothing else (an effect
    /// naming no hold carries the time to drop them at).
    pub fn lapsed(&self) -> bool {
        self.lapsed
    }

    /// Gives memory back once most holds of a burst are gone.
    fn fit(&mut self) {
        if self.slots.capacity() > 64 && self.slots.len() * 4 < self.slots.capacity() {
            self.slots.shrink_to_fit();
            for heap in &mut self.heaps {
                heap.items.shrink_to_fit();
            }
        }
        self.size_index();
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
        if self.find(req.owner).is_some() {
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
        self.changed.push(owner.clone());
        self.add(owner.into_boxed_slice(), hold);
    }

    /// Puts in a hold read from outside (a load), not yet findable: holds
    /// are indexed and ordered once, by [`Semaphore::loaded`], when all are
    /// in. Not a change to send anywhere.
    pub fn push_loaded(&mut self, owner: &[u8], hold: Hold) {
        let owner: Box<[u8]> = owner.into();
        self.used = self.used.saturating_add(hold.permits);
        self.owner_bytes += block_size(owner.as_ptr(), owner.len());
        self.slots.push(Slot {
            owner,
            hold,
            at: [0, 0],
        });
    }

    /// Room for `more` holds to be pushed (a bound read from the payload).
    pub fn reserve_loaded(&mut self, more: usize) {
        self.slots.reserve(more);
    }

    /// Indexes and orders the holds pushed by [`Semaphore::push_loaded`]:
    /// O(n). False if an owner holds twice (the semaphore is then unusable).
    pub fn loaded(&mut self) -> bool {
        self.slots.shrink_to_fit();
        self.index = Vec::new();
        if self.slots.is_empty() {
            return true;
        }
        let mut len = 8;
        while self.slots.len() * 2 > len {
            len *= 2;
        }
        self.index = vec![EMPTY; len];
        let mask = len - 1;
        for slot in 0..self.slots.len() as u32 {
            let owner = &self.slots[slot as usize].owner;
            let mut place = home(owner, len);
            while self.index[place] != EMPTY {
                if self.slots[self.index[place] as usize].owner == *owner {
                    return false;
                }
                place = (place + 1) & mask;
            }
            self.index[place] = slot;
        }
        for which in [Heap::EARLIEST, Heap::LATEST] {
            self.heaps[which].rebuild(which, &mut self.slots);
        }
        true
    }

    /// Takes the owner's hold out.
    pub fn remove(&mut self, owner: &[u8]) -> Option<Hold> {
        let (place, slot) = self.find(owner)?;
        let hold = self.take(place, slot);
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
            .slots
            .iter()
            .find(|s| s.hold.fence == fence)
            .map(|s| s.owner.to_vec());
        owner.is_some_and(|o| self.remove(&o).is_some())
    }

    /// The latest lease end: the key's expiry.
    pub fn deadline(&self) -> Option<i64> {
        self.top(Heap::LATEST).map(|s| s.hold.deadline_ms)
    }

    /// The earliest lease end: when waiters may next be served.
    pub fn next_lease_end(&self) -> Option<i64> {
        self.top(Heap::EARLIEST).map(|s| s.hold.deadline_ms)
    }

    /// The owners whose hold changed since the last call (and forgets that
    /// holds lapsed: the effect sent with them carries `pruned_at`).
    pub fn take_changed(&mut self) -> Vec<Vec<u8>> {
        self.lapsed = false;
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    /// Forgets which holds changed and that holds lapsed (the whole state is
    /// being sent, or nobody listens).
    pub fn clear_changed(&mut self) {
        self.lapsed = false;
        self.changed = Vec::new();
    }

    /// Bytes the allocator holds for this semaphore, its own block (at
    /// `self`, boxed by the type) included: O(1) but for the list of changed
    /// owners, empty between commands.
    pub fn memory(&self) -> usize {
        let changed: usize = self
            .changed
            .iter()
            .map(|o| block_size(o.as_ptr(), o.capacity()))
            .sum();
        let heaps: usize = self.heaps.iter().map(|h| vec_bytes(&h.items)).sum();
        let this = std::ptr::from_ref(self).cast::<u8>();
        block_size(this, std::mem::size_of::<Self>())
            + vec_bytes(&self.slots)
            + vec_bytes(&self.index)
            + heaps
            + self.owner_bytes
            + vec_bytes(&self.changed)
            + changed
            + vec_bytes(&self.ended)
    }

    /// A copy whose holds this server did not grant (`COPY`, a forgotten
    /// change list): one allocation per owner, the rest copied whole.
    pub fn copied(&self) -> Self {
        let mut slots = Vec::with_capacity(self.slots.len());
        slots.extend(self.slots.iter().map(|s| Slot {
            owner: s.owner.clone(),
            hold: Hold {
                granted_ms: 0,
                ..s.hold
            },
            at: s.at,
        }));
        Self {
            limit: self.limit,
            fence: self.fence,
            used: self.used,
            slots,
            index: self.index.clone(),
            heaps: self.heaps.clone(),
            owner_bytes: self.owner_bytes,
            pruned_at: self.pruned_at,
            changed: Vec::new(),
            lapsed: false,
            ended: Vec::new(),
        }
    }

    /// Applies `f` to every lease end (capping them), keeping the order
    /// right: O(n), and nothing reordered when no lease end moved.
    pub fn map_deadlines(&mut self, f: impl Fn(i64) -> i64) {
        let mut moved = false;
        for slot in &mut self.slots {
            let at = f(slot.hold.deadline_ms);
            moved |= at != slot.hold.deadline_ms;
            slot.hold.deadline_ms = at;
        }
        if moved {
            for which in [Heap::EARLIEST, Heap::LATEST] {
                self.heaps[which].rebuild(which, &mut self.slots);
            }
        }
    }

    /// `(used, holders)` as they are at `now_ms`, without dropping anything
    /// (a read): O(holds whose lease ended but are not dropped yet), the
    /// subtree at the top of the earliest-first heap.
    pub fn live_counts(&self, now_ms: i64) -> (u64, usize) {
        let at = self.clock(now_ms);
        let mut counts = (self.used, self.slots.len());
        let items = &self.heaps[Heap::EARLIEST].items;
        let mut stack = vec![0usize];
        while let Some(pos) = stack.pop() {
            let Some(&slot) = items.get(pos) else {
                continue;
            };
            let hold = &self.slots[slot as usize].hold;
            if hold.deadline_ms >= at {
                continue;
            }
            counts.0 -= hold.permits;
            counts.1 -= 1;
            stack.extend([2 * pos + 1, 2 * pos + 2]);
        }
        counts
    }

    /// The owner's hold if its lease has not ended at `now_ms`.
    pub fn live_hold(&self, owner: &[u8], now_ms: i64) -> Option<&Hold> {
        let at = self.clock(now_ms);
        self.hold(owner).filter(|h| h.deadline_ms >= at)
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
            queue: None,
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

    /// A command that changes no hold (a busy acquire, a release by no
    /// holder) still has the lapse to send: a replica told `pruned_at` alone
    /// keeps no hold the master dropped, however many lapsed.
    #[test]
    fn a_prune_alone_is_a_lapse_to_send_that_drops_the_same_holds_on_a_replica() {
        let mut draw = counter();
        let mut s = Semaphore::new(200);
        for i in 0..100 {
            s.grant(format!("h{i}").as_bytes(), 1, 0, 10, draw());
        }
        s.grant(b"long", 50, 0, 1000, draw());
        s.grant(b"long too", 50, 0, 1000, draw());
        s.take_changed();
        assert!(!s.lapsed());
        let mut replica = s.clone();
        let busy = s.request(&req("new", 101, 200, 1000), 50, Gate::Open, &mut draw);
        assert_eq!(busy, Outcome::Busy);
        assert!(s.lapsed());
        assert!(s.take_changed().is_empty(), "no hold to name");
        assert!(!s.lapsed());
        replica.prune(s.pruned_at);
        let holds = |s: &Semaphore| {
            let mut h: Vec<_> = s.holds().map(|(o, h)| (o.to_vec(), h.clone())).collect();
            h.sort_by(|a, b| a.0.cmp(&b.0));
            h
        };
        assert_eq!(holds(&replica), holds(&s));
        assert_eq!(replica.holders(), 2);
        // Nothing lapsed since: nothing to send.
        assert!(!s.release(b"nobody", 60));
        assert!(!s.lapsed());
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

    /// The slots, the index and the heaps agree after any sequence of
    /// changes: the semaphore answers as a plain list of holds would.
    #[test]
    fn the_index_and_heaps_agree_with_a_plain_list() {
        use proptest::prelude::*;
        let op = (0u8..5, 0u16..300, 0i64..50, 1u64..4);
        proptest!(|(ops in proptest::collection::vec(op, 1..1500))| {
            let mut s = Semaphore::new(1 << 20);
            let mut model: Vec<(Vec<u8>, Hold)> = Vec::new();
            let mut now = 0;
            let mut fence = 0;
            for (kind, who, at, permits) in ops {
                let owner = format!("owner-{who}").into_bytes();
                match kind {
                    0 | 1 => {
                        fence += 1;
                        let hold = Hold { permits, fence, deadline_ms: now + at, granted_ms: 0 };
                        model.retain(|(o, _)| *o != owner);
                        model.push((owner.clone(), hold.clone()));
                        s.insert(owner, hold);
                    }
                    2 => {
                        let had = model.iter().position(|(o, _)| *o == owner);
                        prop_assert_eq!(s.remove(&owner).is_some(), had.is_some());
                        if let Some(i) = had { model.remove(i); }
                    }
                    3 => {
                        now += at / 10;
                        s.prune(now);
                        model.retain(|(_, h)| h.deadline_ms >= now);
                    }
                    _ => {
                        let cap = now + at;
                        s.map_deadlines(|d| d.min(cap));
                        for (_, h) in &mut model { h.deadline_ms = h.deadline_ms.min(cap); }
                    }
                }
                prop_assert_eq!(s.holders(), model.len());
                for (o, h) in &model {
                    prop_assert_eq!(s.hold(o), Some(h));
                }
                let ends = model.iter().map(|(_, h)| h.deadline_ms);
                prop_assert_eq!(s.deadline(), ends.clone().max());
                prop_assert_eq!(s.next_lease_end(), ends.min());
                let later = now + 5;
                let live: Vec<_> = model.iter().filter(|(_, h)| h.deadline_ms >= later).collect();
                let counts = (live.iter().map(|(_, h)| h.permits).sum(), live.len());
                prop_assert_eq!(s.live_counts(later), counts);
                prop_assert_eq!(s.copied().holds().count(), model.len());
            }
        });
    }
}
