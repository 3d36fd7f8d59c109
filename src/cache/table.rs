//! The lease table: per database, each key's entry, plus two indices — leases
//! by deadline and by holder — so that every way a lease ends costs O(log n),
//! and bulk endings (a burst of lapses, a holder with 100,000 leases leaving, a
//! flush) are done a bounded batch at a time. Pure: the time is an argument.
//!
//! Invariants:
//! - every lease in `entries` has exactly one record in `deadlines` and, if it
//!   has a holder, one in `holders` (and no record exists without its lease);
//! - every stale mark has exactly one record in `stale_ends`;
//! - `names` counts, per key name, the databases with an entry of that name,
//!   `by_len` the names of each length and `screen` the names in each slot
//!   of the name screen: the command filter's test of "does this argument
//!   name an entry?" costs a bit test or two for most arguments and one
//!   hash lookup for the rest;
//! - every word of `screen_bits` that changed since `screen_changes` was last
//!   drained is listed in `screen_changed` (the filter's copy follows it);
//! - a database is in `dbs` only while it has an entry;
//! - a lease of a departed holder is never live, even before its batch ends it.

use std::collections::{btree_set, hash_map, BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hasher;
use std::os::raw::c_int;

use rustc_hash::{FxHashMap, FxHasher};

use crate::cache::state::{Entry, Lease};
use crate::waiters::QueueKey;

#[derive(Default)]
struct Db {
    entries: HashMap<Vec<u8>, Entry>,
    /// `(deadline, token, key)` of every lease.
    deadlines: BTreeSet<(i64, u64, Vec<u8>)>,
    /// `(holder, key)` of every lease that has a holder.
    holders: BTreeSet<(u64, Vec<u8>)>,
}

/// A flushed database's table, freed a batch at a time.
struct Burial {
    entries: hash_map::IntoIter<Vec<u8>, Entry>,
    deadlines: btree_set::IntoIter<(i64, u64, Vec<u8>)>,
    holders: btree_set::IntoIter<(u64, Vec<u8>)>,
}

impl Burial {
    /// Frees up to `budget` records; how many it freed.
    fn free(&mut self, budget: usize) -> usize {
        let mut n = 0;
        while n < budget && self.entries.next().is_some() {
            n += 1;
        }
        while n < budget && self.deadlines.next().is_some() {
            n += 1;
        }
        while n < budget && self.holders.next().is_some() {
            n += 1;
        }
        n
    }
}

pub struct Table {
    dbs: BTreeMap<c_int, Db>,
    /// Holders that disconnected with leases, oldest first; their leases end
    /// a batch at a time and are not live meanwhile.
    departed: VecDeque<u64>,
    departed_set: HashSet<u64>,
    graveyard: Vec<Burial>,
    /// Keys whose lease was revoked where waiters could not be served (the
    /// command filter): the next batch serves them.
    revoked: Vec<QueueKey>,
    /// `(until, db, key)` of every stale mark: it ends by itself.
    stale_ends: BTreeSet<(i64, c_int, Vec<u8>)>,
    names: FxHashMap<Vec<u8>, u32>,
    by_len: [u32; NAME_LENGTHS],
    /// Bit `min(len, 63)` set while a name of that length has an entry.
    len_mask: u64,
    /// Names by their slot of the name screen (`screen_slot`; allocated at
    /// the first name), the slots counted as bits, and the words of bits
    /// changed since the filter last took them.
    screen: Vec<u32>,
    screen_bits: [u64; SCREEN_WORDS],
    screen_changed: Vec<usize>,
}

/// Words in the name screen: 16,384 slots, so that 1,000 names leave about
/// 94 % of other arguments to the bit test alone.
pub const SCREEN_WORDS: usize = 256;

const SCREEN_SLOTS: usize = SCREEN_WORDS * 64;

/// A name's slot in the name screen: a hash of its length and bytes (of a
/// long name, its first and last 16 bytes: a long value costs the filter no
/// more than a short one).
#[inline]
pub fn screen_slot(name: &[u8]) -> usize {
    let mut h = FxHasher::default();
    let n = name.len();
    if n <= 32 {
        h.write(name);
    } else {
        h.write(&name[..16]);
        h.write(&name[n - 16..]);
    }
    h.write_usize(n);
    h.finish() as usize % SCREEN_SLOTS
}

/// The bit of `len_mask` for a name of `len` bytes.
pub fn len_bit(len: usize) -> u64 {
    1 << len.min(63)
}

/// Names are counted by length up to this, longer ones in the last slot.
const NAME_LENGTHS: usize = 65;

fn len_slot(name: &[u8]) -> usize {
    name.len().min(NAME_LENGTHS - 1)
}

/// What a batch did: the keys whose lease ended (their waiters may go), how
/// many steps it took, and whether work is left for another batch now.
#[derive(Debug, Default)]
pub struct Batch {
    pub ended: Vec<QueueKey>,
    pub steps: usize,
    pub more: bool,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            dbs: BTreeMap::new(),
            departed: VecDeque::new(),
            departed_set: HashSet::new(),
            graveyard: Vec::new(),
            revoked: Vec::new(),
            stale_ends: BTreeSet::new(),
            names: FxHashMap::default(),
            by_len: [0; NAME_LENGTHS],
            len_mask: 0,
            screen: Vec::new(),
            screen_bits: [0; SCREEN_WORDS],
            screen_changed: Vec::new(),
        }
    }
}

impl Table {
    pub fn is_empty(&self) -> bool {
        self.dbs.is_empty()
    }

    /// Whether `name` has an entry in some database (the command filter's test).
    pub fn names(&self, name: &[u8]) -> bool {
        self.by_len[len_slot(name)] != 0 && self.names.contains_key(name)
    }

    /// The lengths of the names with entries, as bits: most arguments of
    /// other commands are ruled out by this one word.
    pub fn len_mask(&self) -> u64 {
        self.len_mask
    }

    /// The words of the name screen changed since the last call, with their
    /// bits now (bit `screen_slot(name) % 64` of word `screen_slot(name) /
    /// 64` is set while a name of that slot has an entry).
    pub fn screen_changes(&mut self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let bits = &self.screen_bits;
        self.screen_changed.drain(..).map(|w| (w, bits[w]))
    }

    fn count_screen(&mut self, name: &[u8], up: bool) {
        if self.screen.is_empty() {
            self.screen = vec![0; SCREEN_SLOTS];
        }
        let slot = screen_slot(name);
        let n = &mut self.screen[slot];
        if up {
            *n += 1;
        } else {
            *n -= 1;
        }
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        let bits = if *n == 0 {
            self.screen_bits[word] & !bit
        } else {
            self.screen_bits[word] | bit
        };
        if bits != self.screen_bits[word] {
            self.screen_bits[word] = bits;
            // At most one record a word: past that many, every word is listed.
            match self.screen_changed.len() {
                n if n + 1 < SCREEN_WORDS => self.screen_changed.push(word),
                n if n < SCREEN_WORDS => self.screen_changed = (0..SCREEN_WORDS).collect(),
                _ => {}
            }
        }
    }

    fn recount_len(&mut self, len: usize) {
        let bit = len_bit(len);
        let any = if len >= 63 {
            self.by_len[63..].iter().any(|&n| n != 0)
        } else {
            self.by_len[len] != 0
        };
        if any {
            self.len_mask |= bit;
        } else {
            self.len_mask &= !bit;
        }
    }

    /// The entry of `q`, created (and counted) if it is new.
    fn entry_mut(&mut self, q: &QueueKey) -> &mut Entry {
        let new = !self
            .dbs
            .get(&q.db)
            .is_some_and(|d| d.entries.contains_key(&q.name));
        if new {
            let n = self.names.entry(q.name.clone()).or_default();
            *n += 1;
            if *n == 1 {
                self.by_len[len_slot(&q.name)] += 1;
                self.recount_len(q.name.len());
                self.count_screen(&q.name, true);
            }
        }
        let db = self.dbs.entry(q.db).or_default();
        db.entries.entry(q.name.clone()).or_default()
    }

    fn uncount(&mut self, name: &[u8]) {
        if let Some(n) = self.names.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                self.names.remove(name);
                self.by_len[len_slot(name)] -= 1;
                self.recount_len(name.len());
                self.count_screen(name, false);
                if self.names.capacity() > 64 && self.names.len() * 4 < self.names.capacity() {
                    self.names.shrink_to_fit();
                }
            }
        }
    }

    /// Entries, over every database.
    pub fn len(&self) -> usize {
        self.dbs.values().map(|d| d.entries.len()).sum()
    }

    /// Leases in the table (each has one deadline record), over every database.
    pub fn leases(&self) -> usize {
        self.dbs.values().map(|d| d.deadlines.len()).sum()
    }

    /// The entry of `q`, a copy.
    pub fn entry(&self, q: &QueueKey) -> Entry {
        self.dbs
            .get(&q.db)
            .and_then(|d| d.entries.get(&q.name))
            .cloned()
            .unwrap_or_default()
    }

    /// The lease of `e`, if it is live at `now_ms`: not lapsed, and its
    /// holder still connected.
    pub fn live<'e>(&self, e: &'e Entry, now_ms: i64) -> Option<&'e Lease> {
        e.live_lease(now_ms)
            .filter(|l| l.holder.is_none_or(|h| !self.departed_set.contains(&h)))
    }

    /// Makes `lease` the lease of `q`, ending any previous one.
    pub fn grant(&mut self, q: &QueueKey, lease: Lease) {
        self.take(q, None);
        let db = self.dbs.entry(q.db).or_default();
        db.deadlines
            .insert((lease.deadline_ms, lease.token, q.name.clone()));
        if let Some(h) = lease.holder {
            db.holders.insert((h, q.name.clone()));
        }
        self.entry_mut(q).lease = Some(lease);
    }

    /// Removes the lease of `q` if it is `token` (any if `None`).
    pub fn take(&mut self, q: &QueueKey, token: Option<u64>) -> Option<Lease> {
        let db = self.dbs.get_mut(&q.db)?;
        let e = db.entries.get_mut(&q.name)?;
        let lease = e.lease.take_if(|l| token.is_none_or(|t| l.token == t))?;
        db.deadlines
            .remove(&(lease.deadline_ms, lease.token, q.name.clone()));
        if let Some(h) = lease.holder {
            db.holders.remove(&(h, q.name.clone()));
        }
        self.tidy(q);
        Some(lease)
    }

    /// Sets (or with `None` clears) the stale mark of `q`.
    pub fn set_stale(&mut self, q: &QueueKey, until: Option<i64>) {
        let old = self
            .dbs
            .get_mut(&q.db)
            .and_then(|d| d.entries.get_mut(&q.name))
            .and_then(|e| e.stale_until.take());
        if let Some(t) = old {
            self.stale_ends.remove(&(t, q.db, q.name.clone()));
        }
        match until {
            Some(t) => {
                self.entry_mut(q).stale_until = Some(t);
                self.stale_ends.insert((t, q.db, q.name.clone()));
            }
            None => self.tidy(q),
        }
    }

    /// Forgets `q` (lease and stale mark); its lease, if it had one, and
    /// whether it had an entry.
    pub fn clear(&mut self, q: &QueueKey) -> (Option<Lease>, bool) {
        let lease = self.take(q, None);
        let had = self
            .dbs
            .get(&q.db)
            .is_some_and(|d| d.entries.contains_key(&q.name));
        self.set_stale(q, None);
        let had = had || lease.is_some();
        (lease, had)
    }

    /// Drops the entry of `q` once it is empty, and the database once it is.
    fn tidy(&mut self, q: &QueueKey) {
        let Some(db) = self.dbs.get_mut(&q.db) else {
            return;
        };
        if db.entries.get(&q.name).is_some_and(Entry::is_empty) {
            db.entries.remove(&q.name);
            shrink(&mut db.entries);
            if db.entries.is_empty() {
                self.dbs.remove(&q.db);
            }
            self.uncount(&q.name);
        }
    }

    /// Revokes the leases of `name` in every database (the command filter
    /// does not know the client's database; revoking more is always safe).
    /// The number of leases revoked.
    pub fn revoke_everywhere(&mut self, name: &[u8]) -> usize {
        let dbs: Vec<c_int> = self
            .dbs
            .iter()
            .filter(|(_, d)| d.entries.contains_key(name))
            .map(|(&db, _)| db)
            .collect();
        let mut revoked = 0;
        for db in dbs {
            let q = QueueKey {
                db,
                name: name.to_vec(),
            };
            if self.clear(&q).0.is_some() {
                revoked += 1;
            }
            self.revoked.push(q);
        }
        revoked
    }

    /// Revokes every lease, in every database (a write warden could not
    /// see the keys of ran): stale marks stay. The number revoked.
    pub fn revoke_all(&mut self) -> usize {
        self.revoke_where(|_| true)
    }

    /// Revokes the leases of the keys `picked` chooses (their slots moved to
    /// another node, or all of them), in every database: stale marks stay.
    /// The number revoked.
    pub fn revoke_where(&mut self, picked: impl Fn(&[u8]) -> bool) -> usize {
        let leased: Vec<QueueKey> =
            self.dbs
                .iter()
                .flat_map(|(&db, d)| {
                    d.deadlines.iter().filter(|(_, _, name)| picked(name)).map(
                        move |(_, _, name)| QueueKey {
                            db,
                            name: name.clone(),
                        },
                    )
                })
                .collect();
        let revoked = leased.len();
        for q in leased {
            self.take(&q, None);
            self.revoked.push(q);
        }
        revoked
    }

    /// Forgets every entry of `db` (-1: all) at once; the memory is freed by
    /// later batches.
    pub fn forget_db(&mut self, db: c_int) {
        let gone: Vec<Db> = if db == -1 {
            std::mem::take(&mut self.dbs).into_values().collect()
        } else {
            self.dbs.remove(&db).into_iter().collect()
        };
        self.stale_ends.retain(|(_, d, _)| db != -1 && *d != db);
        for d in &gone {
            for name in d.entries.keys() {
                self.uncount(name);
            }
        }
        for d in gone {
            self.graveyard.push(Burial {
                entries: d.entries.into_iter(),
                deadlines: d.deadlines.into_iter(),
                holders: d.holders.into_iter(),
            });
        }
    }

    /// A client disconnected: whether it held leases (then a batch must run).
    pub fn depart(&mut self, client: u64) -> bool {
        let holds = self
            .dbs
            .values()
            .any(|d| first_of(&d.holders, client).is_some());
        if holds && self.departed_set.insert(client) {
            self.departed.push_back(client);
        }
        holds
    }

    /// When the next lease lapses (its deadline; it lapses just after).
    pub fn next_deadline(&self) -> Option<i64> {
        self.dbs
            .values()
            .filter_map(|d| d.deadlines.first().map(|r| r.0))
            .chain(self.stale_ends.first().map(|r| r.0))
            .min()
    }

    /// Whether a batch has work at `now_ms`.
    pub fn has_work(&self, now_ms: i64) -> bool {
        !self.revoked.is_empty()
            || !self.departed.is_empty()
            || !self.graveyard.is_empty()
            || self.next_deadline().is_some_and(|d| d < now_ms)
    }

    /// Ends at most `budget` leases (lapsed, or held by departed clients),
    /// and frees flushed tables, within `budget` steps in all.
    pub fn batch(&mut self, now_ms: i64, budget: usize) -> Batch {
        let mut b = Batch::default();
        while b.steps < budget {
            let Some(q) = self.revoked.pop() else { break };
            b.ended.push(q);
            b.steps += 1;
        }
        shrink_vec(&mut self.revoked);
        while b.steps < budget {
            let lapsed = self
                .dbs
                .iter()
                .filter_map(|(&db, d)| d.deadlines.first().map(|r| (r.0, db, r.1, r.2.clone())))
                .min()
                .filter(|r| r.0 < now_ms);
            let Some((_, db, token, name)) = lapsed else {
                break;
            };
            let q = QueueKey { db, name };
            self.take(&q, Some(token));
            b.ended.push(q);
            b.steps += 1;
        }
        while b.steps < budget {
            let Some((until, db, name)) = self.stale_ends.first().cloned() else {
                break;
            };
            if until >= now_ms {
                break;
            }
            // A stale window that ended is forgotten; the value (if any) is
            // fresh again, for the readers that wait for a fresh one.
            let q = QueueKey { db, name };
            self.set_stale(&q, None);
            b.ended.push(q);
            b.steps += 1;
        }
        while b.steps < budget {
            let Some(&client) = self.departed.front() else {
                break;
            };
            let held = self
                .dbs
                .iter()
                .find_map(|(&db, d)| first_of(&d.holders, client).map(|name| (db, name.to_vec())));
            match held {
                Some((db, name)) => {
                    let q = QueueKey { db, name };
                    self.take(&q, None);
                    b.ended.push(q);
                }
                None => {
                    self.departed.pop_front();
                    self.departed_set.remove(&client);
                }
            }
            b.steps += 1;
        }
        while b.steps < budget {
            let Some(burial) = self.graveyard.last_mut() else {
                break;
            };
            let freed = burial.free(budget - b.steps);
            b.steps += freed;
            if freed == 0 {
                self.graveyard.pop();
            }
        }
        if self.departed.is_empty() && self.departed_set.capacity() > 64 {
            self.departed_set.shrink_to_fit();
        }
        b.more = self.has_work(now_ms);
        b
    }
}

/// The first key `client` holds a lease on, in one database.
fn first_of(holders: &BTreeSet<(u64, Vec<u8>)>, client: u64) -> Option<&[u8]> {
    holders
        .range((client, Vec::new())..)
        .next()
        .filter(|(h, _)| *h == client)
        .map(|(_, name)| name.as_slice())
}

fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    let emptied = map.is_empty() && map.capacity() > 16;
    if emptied || (map.capacity() > 64 && map.len() * 4 < map.capacity()) {
        map.shrink_to_fit();
    }
}

fn shrink_vec<T>(v: &mut Vec<T>) {
    if v.capacity() > 64 && v.len() * 4 < v.capacity() {
        v.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(db: c_int, name: &str) -> QueueKey {
        QueueKey {
            db,
            name: name.as_bytes().to_vec(),
        }
    }

    fn lease(token: u64, deadline_ms: i64, holder: Option<u64>) -> Lease {
        Lease {
            token,
            deadline_ms,
            holder,
        }
    }

    /// Runs batches until none is left; the largest batch.
    fn drain(t: &mut Table, now: i64, budget: usize) -> (usize, usize) {
        let (mut ended, mut largest) = (0, 0);
        loop {
            let b = t.batch(now, budget);
            ended += b.ended.len();
            largest = largest.max(b.steps);
            if !b.more {
                return (ended, largest);
            }
        }
    }

    #[test]
    fn a_new_grant_replaces_the_old_lease_and_its_records() {
        let mut t = Table::default();
        t.grant(&q(0, "k"), lease(1, 100, Some(7)));
        t.grant(&q(0, "k"), lease(2, 200, Some(8)));
        assert_eq!(t.len(), 1);
        assert_eq!(t.next_deadline(), Some(200));
        assert!(!t.depart(7), "7 holds nothing any more");
        assert_eq!(t.take(&q(0, "k"), Some(1)), None);
        assert!(t.take(&q(0, "k"), Some(2)).is_some());
        assert!(t.is_empty());
    }

    #[test]
    fn lapsed_leases_end_a_batch_at_a_time() {
        let mut t = Table::default();
        for i in 0..10_000u64 {
            t.grant(&q(0, &format!("k{i}")), lease(i + 1, 100, Some(1)));
        }
        assert!(!t.has_work(100), "a lease lapses after its deadline");
        let (ended, largest) = drain(&mut t, 101, 1000);
        assert_eq!((ended, largest), (10_000, 1000));
        assert!(t.is_empty());
    }

    #[test]
    fn a_departed_holders_leases_are_not_live_and_end_in_batches() {
        let mut t = Table::default();
        for i in 0..5_000u64 {
            t.grant(
                &q((i % 2) as c_int, &format!("k{i}")),
                lease(i + 1, 1000, Some(9)),
            );
        }
        t.grant(&q(0, "other"), lease(99_999, 1000, Some(10)));
        assert!(t.depart(9));
        let e = t.entry(&q(0, "k0"));
        assert!(e.live_lease(0).is_some() && t.live(&e, 0).is_none());
        let (ended, largest) = drain(&mut t, 0, 700);
        assert_eq!(ended, 5_000);
        assert!(largest <= 700);
        assert_eq!(t.len(), 1, "another holder's lease stays");
        let e = t.entry(&q(0, "other"));
        assert!(t.live(&e, 0).is_some());
    }

    #[test]
    fn leases_are_counted_until_they_end_however_they_end() {
        let mut t = Table::default();
        for i in 0..6u64 {
            t.grant(
                &q((i % 2) as c_int, &format!("k{i}")),
                lease(i + 1, 100, Some(i)),
            );
        }
        t.grant(&q(0, "k0"), lease(50, 100, None));
        assert_eq!(t.leases(), 6, "a new grant replaces the old lease");
        t.take(&q(0, "k0"), Some(50));
        t.set_stale(&q(1, "k1"), Some(500));
        t.clear(&q(1, "k1"));
        assert_eq!(t.leases(), 4);
        t.forget_db(1);
        assert_eq!(
            t.leases(),
            2,
            "a flushed database's leases are gone at once"
        );
        drain(&mut t, 101, 10);
        assert_eq!(t.leases(), 0);
    }

    #[test]
    fn a_flush_forgets_at_once_and_frees_in_batches() {
        let mut t = Table::default();
        for i in 0..3_000u64 {
            t.grant(
                &q((i % 3) as c_int, &format!("k{i}")),
                lease(i + 1, 1000, Some(1)),
            );
        }
        t.forget_db(1);
        assert_eq!(t.len(), 2_000);
        assert_eq!(t.entry(&q(1, "k1")), Entry::default());
        t.forget_db(-1);
        assert!(t.is_empty());
        let (ended, largest) = drain(&mut t, 0, 500);
        assert_eq!((ended, largest), (0, 500));
        assert!(t.graveyard.is_empty());
    }

    #[test]
    fn revoking_by_name_reaches_every_database_and_reports_the_keys() {
        let mut t = Table::default();
        t.grant(&q(0, "k"), lease(1, 100, Some(1)));
        t.grant(&q(3, "k"), lease(2, 100, None));
        t.set_stale(&q(5, "k"), Some(50));
        t.grant(&q(0, "j"), lease(3, 100, Some(1)));
        assert_eq!(t.revoke_everywhere(b"k"), 2);
        assert_eq!(t.revoke_everywhere(b"absent"), 0);
        assert_eq!(t.len(), 1);
        let b = t.batch(0, 100);
        assert_eq!(b.ended.len(), 3);
        assert!(!b.more);
    }

    #[test]
    fn revoking_all_ends_every_lease_and_keeps_stale_marks() {
        let mut t = Table::default();
        t.grant(&q(0, "a"), lease(1, 100, Some(1)));
        t.grant(&q(4, "b"), lease(2, 100, None));
        t.set_stale(&q(0, "s"), Some(50));
        t.grant(&q(0, "s"), lease(3, 100, None));
        assert_eq!(t.revoke_all(), 3);
        assert_eq!(t.leases(), 0);
        assert_eq!(t.len(), 1, "the stale mark stays");
        assert!(t.names(b"s") && !t.names(b"a") && !t.names(b"b"));
        assert_eq!(t.batch(0, 100).ended.len(), 3);
    }

    #[test]
    fn the_filter_knows_exactly_the_names_with_entries() {
        let mut t = Table::default();
        t.grant(&q(0, "k"), lease(1, 100, Some(1)));
        t.grant(&q(2, "k"), lease(2, 100, Some(1)));
        t.set_stale(&q(0, "s"), Some(50));
        let long = "x".repeat(300);
        t.grant(&q(0, &long), lease(3, 100, None));
        assert!(t.names(b"k") && t.names(b"s") && t.names(long.as_bytes()));
        assert!(!t.names(b"j") && !t.names(b"kk") && !t.names(&[b'x'; 299]));
        t.take(&q(0, "k"), None);
        assert!(t.names(b"k"), "another database still has it");
        t.clear(&q(2, "k"));
        assert!(!t.names(b"k"));
        t.forget_db(-1);
        assert!(!t.names(b"s") && !t.names(long.as_bytes()));
        assert!(t.names.is_empty() && t.by_len.iter().all(|&n| n == 0));
        assert!(t.screen.iter().all(|&n| n == 0));
        assert_eq!(t.len_mask(), 0);
        assert!(t.screen_bits.iter().all(|&w| w == 0));
    }

    #[test]
    fn the_name_screen_passes_every_name_with_an_entry_and_few_others() {
        let mut t = Table::default();
        let mut copy = [0u64; SCREEN_WORDS];
        let mut follow = |t: &mut Table| {
            for (word, bits) in t.screen_changes() {
                copy[word] = bits;
            }
            copy
        };
        let passes = |copy: &[u64; SCREEN_WORDS], name: &str| {
            let slot = screen_slot(name.as_bytes());
            copy[slot / 64] & (1 << (slot % 64)) != 0
        };
        let names: Vec<String> = (0..1000).map(|i| format!("lease:{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            t.grant(&q(0, name), lease(i as u64 + 1, 100, None));
        }
        let long = format!("{}:{}", "x".repeat(100), "y".repeat(100));
        t.set_stale(&q(1, &long), Some(50));
        let screen = follow(&mut t);
        assert!(names.iter().all(|n| passes(&screen, n)) && passes(&screen, &long));
        let others = (0..10_000)
            .filter(|i| passes(&screen, &format!("other:{i}")))
            .count();
        assert!(others < 1_000, "{others} of 10,000 other names pass");
        for name in &names[..500] {
            t.clear(&q(0, name));
        }
        let screen = follow(&mut t);
        assert_eq!(screen, t.screen_bits, "the copy follows the table");
        assert!(names[500..].iter().all(|n| passes(&screen, n)));
        t.forget_db(-1);
        assert!(
            t.screen_changed.len() <= SCREEN_WORDS,
            "one record a word at most"
        );
        assert_eq!(follow(&mut t), [0; SCREEN_WORDS]);
    }

    #[test]
    fn a_stale_mark_ends_by_itself_in_a_batch() {
        let mut t = Table::default();
        t.set_stale(&q(0, "k"), Some(10));
        t.set_stale(&q(0, "k"), Some(20));
        assert_eq!(
            t.next_deadline(),
            Some(20),
            "the later mark replaced the first"
        );
        assert!(t.batch(20, 10).ended.is_empty(), "not before it ends");
        let b = t.batch(21, 10);
        assert_eq!(b.ended, vec![q(0, "k")]);
        assert!(t.is_empty() && !t.names(b"k") && t.next_deadline().is_none());
    }

    #[test]
    fn a_stale_mark_alone_keeps_an_entry_until_cleared() {
        let mut t = Table::default();
        t.set_stale(&q(0, "k"), Some(10));
        assert_eq!(t.len(), 1);
        t.grant(&q(0, "k"), lease(1, 100, None));
        t.set_stale(&q(0, "k"), None);
        assert_eq!(t.len(), 1, "the lease stays");
        assert_eq!(t.clear(&q(0, "k")).0.map(|l| l.token), Some(1));
        assert!(t.is_empty());
    }
}
