//! What `warden.grace auto` can know about a promotion or a restart, and the
//! record that lets it know: `WARDEN.SYNCSTATE n always members`, an effect
//! the master writes into the replication stream and the AOF.
//!
//! The master (with `sync-replicas` N ≥ 1) keeps a roster: every replica that
//! was ever online while it granted (an address as `INFO replication` shows
//! it, `ip:port`). The roster never shrinks while this server is master, and
//! every change of it (or of N) is written as a marker before any grant is
//! answered under it. A grant is answered once N online replicas — all of
//! them roster members — acknowledged it. So while N ≥ the roster's size,
//! every answered grant is on every member. A marker that ends that guarantee
//! (a new member, or a lower N) is itself acknowledged by every member before
//! one more grant is answered: a member that holds no such marker was asked
//! for every grant.
//!
//! The promoted replica therefore loses nothing when its last marker from
//! its old master (same replication id) names it and says N ≥ the roster's
//! size: `grace auto` opens no window then. Where it cannot show that (it
//! is not named, N was below the roster, the marker came from another
//! history, none came), the window opens as with a fixed `grace`.
//!
//! A replica forgets its marker when a full sync from its master begins: the
//! RDB carries no marker, so one held from before the sync could name this
//! replica under a roster it no longer knows (a member added while it was
//! away, whose marker it never read). Until the master sends its marker
//! again (after the sync's fork ends) a promotion opens the window.
//!
//! Members are addresses, and two replicas may announce the same one (a
//! copied `replica-announce-port`): the roster counts each address as many
//! times as it was seen online at once, and a roster that cannot tell two
//! members apart promises nothing (its markers say N = 0: a window).
//!
//! A restart loses nothing when the server loads its AOF, `appendfsync` is
//! `always`, and the last marker in that AOF says it was `always` when
//! written (markers are written at every start, every change of
//! `appendonly`/`appendfsync`, and after every AOF rewrite). The one case
//! this cannot see: a switch away from `always` followed within the next
//! fsync (a second) by a crash that loses the marker saying so.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis_module::{raw, Context, ContextFlags, RedisError, RedisResult, RedisValue};

use crate::acks::Replication;
use crate::args;
use crate::command::Arg;
use crate::config::{GRACE_AUTO, SYNC_REPLICAS};
use crate::error;
use crate::keyspace::effects_only;

/// The last marker this server read (from its master, or from its AOF).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Marker {
    pub n: i64,
    pub always: bool,
    pub members: Vec<String>,
}

impl Marker {
    /// Whether every grant answered under this marker is on `me`.
    pub fn covers(&self, me: &str) -> bool {
        self.n >= 1 && self.n >= self.members.len() as i64 && self.members.iter().any(|m| m == me)
    }

    /// `members` as written: comma-separated (addresses hold no commas).
    fn parse(n: &[u8], always: &[u8], members: &[u8]) -> Option<Self> {
        let n = args::integer(n).filter(|n| (0..=1024).contains(n))?;
        let always = match always {
            b"1" => true,
            b"0" => false,
            _ => return None,
        };
        let text = std::str::from_utf8(members).ok()?;
        let members = text
            .split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
        Some(Self { n, always, members })
    }
}

/// The master's roster (see the module comment).
#[derive(Default)]
struct Roster {
    /// Each address as many times as it was seen online at once.
    members: Vec<String>,
    /// Two online replicas shared an address: markers promise nothing.
    ambiguous: bool,
    /// N and the roster's size as last written (None: nothing written yet).
    written: Option<(i64, usize)>,
    /// The marker for the roster as it is now has been written.
    marked: bool,
    /// The offset after that marker (the first turn after it): no grant is
    /// answered before the replicas have the marker it was made under.
    marked_at: Option<i64>,
    /// A marker that ended the all-members guarantee, and the members before
    /// it, who must acknowledge it (its offset: the first turn after it).
    barrier: Option<(Vec<String>, Option<i64>)>,
    timer: bool,
}

/// What a replica (or a restarting master) last read: the marker, the
/// replication id it came with, and this server's own address then.
#[derive(Default)]
struct Seen {
    marker: Option<Marker>,
    replid: String,
    me: Option<String>,
    /// The master that sent it (`master_host:master_port`).
    master: Option<String>,
}

/// After a promotion `grace auto` could not clear at once: who may show,
/// by resyncing from here without a full sync, that no answered grant is
/// missing — the old master, or every other replica of its roster — and
/// the full-sync counters when the window opened.
struct Proof {
    old_master: Option<String>,
    others: Vec<String>,
    full_syncs: i64,
    failed_partial: i64,
}

/// Set while a marker saying N ≥ the roster's size (every grant on every
/// member) is in force: written, and not yet withdrawn by a later marker
/// that every member it named acknowledged. Grants wait for replicas
/// meanwhile, whatever N is now (`crate::acks::required`).
static PROMISED: AtomicBool = AtomicBool::new(false);

/// Whether a marker written earlier still promises every grant to every member.
pub fn promised() -> bool {
    PROMISED.load(Ordering::Relaxed)
}

/// Whether a marker for N and a roster of `size` promises every grant to every member.
fn guaranteed((n, size): (i64, usize)) -> bool {
    size > 0 && n >= size as i64
}

/// How often `addr` is in `list`.
fn count<'a>(list: impl IntoIterator<Item = &'a String>, addr: &str) -> usize {
    list.into_iter().filter(|a| *a == addr).count()
}

impl Roster {
    /// Takes in the replicas online now: an address seen more often at once
    /// than the roster holds it is added again (and makes the roster
    /// ambiguous). Whether the roster changed.
    fn take_in(&mut self, online: &[(String, i64)]) -> bool {
        let mut changed = false;
        for (addr, _) in online {
            let now = count(online.iter().map(|(a, _)| a), addr);
            let known = count(&self.members, addr);
            if now > known {
                self.members.extend((known..now).map(|_| addr.clone()));
                changed = true;
            }
            if now > 1 && !self.ambiguous {
                self.ambiguous = true;
                changed = true;
            }
        }
        changed
    }

    /// The N a marker written now states: none where members cannot be told apart.
    fn promised_n(&self, n: i64) -> i64 {
        if self.ambiguous {
            0
        } else {
            n
        }
    }
}

/// Whether every one of `members` (each address as often as listed) has
/// acknowledged `at` among the replicas online now. Where more replicas
/// online show a member's address than the list holds, every one of them
/// must: which of them is the member cannot be told.
fn all_acknowledged(members: &[String], online: &[(String, i64)], at: i64) -> bool {
    members.iter().all(|m| {
        let acked = online.iter().filter(|(a, o)| a == m && *o >= at).count();
        let showing = online.iter().filter(|(a, _)| a == m).count();
        acked >= count(members, m).max(showing)
    })
}

thread_local! {
    static ROSTER: RefCell<Roster> = RefCell::new(Roster::default());
    static SEEN: RefCell<Seen> = RefCell::new(Seen::default());
    static PROOF: RefCell<Option<Proof>> = const { RefCell::new(None) };
}

/// The offset replicas must have acknowledged (besides a grant's own) for
/// grants to be answered now, after taking in who is online: that of the
/// marker for the current roster and N, which must be acknowledged by every
/// earlier member where it ended the all-members guarantee. None: no grant
/// may be answered this turn.
pub fn floor(ctx: *mut raw::RedisModuleCtx, view: &Replication) -> Option<i64> {
    let n = SYNC_REPLICAS.load(Ordering::Relaxed);
    let (arm, ok) = ROSTER.with(|r| {
        let mut r = r.borrow_mut();
        let was_ambiguous = r.ambiguous;
        if r.take_in(&view.replicas) {
            r.marked = false;
        }
        if r.ambiguous && !was_ambiguous {
            Context::new(ctx).log_warning(
                "grace auto: two replicas announce the same address: the roster cannot tell \
                 them apart, so no promotion skips the window (set each replica's \
                 replica-announce-ip/port to its own address)",
            );
        }
        let promised_n = r.promised_n(n);
        if r.written.is_some_and(|(w, _)| w != promised_n) {
            r.marked = false;
        }
        if let Some((before, offset)) = r.barrier.as_mut() {
            let at = *offset.get_or_insert(view.offset);
            if all_acknowledged(before, &view.replicas, at) {
                r.barrier = None;
                PROMISED.store(r.written.is_some_and(guaranteed), Ordering::Relaxed);
            }
        }
        let arm = !r.marked && !r.timer;
        if arm {
            r.timer = true;
        }
        let floor = *r.marked_at.get_or_insert(view.offset);
        (arm, (r.marked && r.barrier.is_none()).then_some(floor))
    });
    if arm {
        Context::new(ctx).create_timer(Duration::ZERO, write_marker, ());
    }
    ok
}

/// Writes the marker for the current roster (from a timer: its own execution
/// unit, never the one that asks for acknowledgements).
fn write_marker(ctx: &Context, _: ()) {
    crate::guard::callback((), || {
        if ctx.get_flags().contains(ContextFlags::SLAVE) {
            // A replica now: its roster is gone (`reset`).
            ROSTER.with(|r| r.borrow_mut().timer = false);
            return;
        }
        if !crate::waiters::may_write(ctx) {
            // Paused: the marker (and the grants waiting on it) wait too.
            ctx.create_timer(Duration::from_millis(10), write_marker, ());
            return;
        }
        let members = ROSTER.with(|r| {
            let mut r = r.borrow_mut();
            r.timer = false;
            let n = r.promised_n(SYNC_REPLICAS.load(Ordering::Relaxed));
            let size = r.members.len();
            if let Some(before) = r.written {
                if guaranteed(before) && !guaranteed((n, size)) {
                    let earlier = r.members[..before.1].to_vec();
                    r.barrier = Some((earlier, None));
                }
            }
            r.written = Some((n, size));
            PROMISED.store(
                guaranteed((n, size)) || r.barrier.is_some(),
                Ordering::Relaxed,
            );
            r.marked = true;
            r.marked_at = None;
            (n, r.members.join(","))
        });
        // A full sync's fork must send it again (see `child_ended`).
        ROSTER_WRITTEN.store(true, Ordering::Relaxed);
        crate::keyspace::hear_forks();
        DURABILITY_UNMARKED.store(false, Ordering::Relaxed);
        replicate(ctx, members.0, appendfsync_always(ctx), &members.1);
    })
}

fn replicate(ctx: &Context, n: i64, always: bool, members: &str) {
    let Ok(members) = std::ffi::CString::new(members) else {
        return;
    };
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.ctx,
            c"WARDEN.SYNCSTATE".as_ptr(),
            c"llc".as_ptr(),
            n as std::os::raw::c_longlong,
            std::os::raw::c_longlong::from(always),
            members.as_ptr(),
        )
    };
}

/// This server becomes a master, or stops being one: a new roster.
pub fn reset() {
    ROSTER.with(|r| *r.borrow_mut() = Roster::default());
    PROMISED.store(false, Ordering::Relaxed);
}

/// A server config value, as `CONFIG GET` shows it.
pub fn config_get(ctx: &Context, name: &str) -> Option<String> {
    match ctx.call("CONFIG", &["GET", name]) {
        Ok(RedisValue::Array(items)) => match items.get(1) {
            Some(RedisValue::SimpleString(s)) => Some(s.clone()),
            Some(RedisValue::BulkString(s)) => Some(s.clone()),
            Some(RedisValue::StringBuffer(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}

/// Whether every write is fsynced before its reply (`appendonly yes`,
/// `appendfsync always`).
fn appendfsync_always(ctx: &Context) -> bool {
    config_get(ctx, "appendonly").as_deref() == Some("yes")
        && config_get(ctx, "appendfsync").as_deref() == Some("always")
}

/// This replica's address as its master's `INFO replication` shows it:
/// `replica-announce-ip` (else the local address of the link to the master)
/// and `replica-announce-port` (else `port`).
fn my_address(ctx: &Context) -> Option<String> {
    let announced = config_get(ctx, "replica-announce-ip").filter(|ip| !ip.is_empty());
    let ip = match announced {
        Some(ip) => ip,
        None => {
            let list = match ctx.call("CLIENT", &["LIST", "TYPE", "master"]).ok()? {
                RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s,
                RedisValue::StringBuffer(b) => String::from_utf8_lossy(&b).into_owned(),
                RedisValue::VerbatimString((_, b)) => String::from_utf8_lossy(&b).into_owned(),
                _ => return None,
            };
            let laddr = list
                .split_whitespace()
                .find_map(|f| f.strip_prefix("laddr="))?;
            let (ip, _) = laddr.rsplit_once(':')?;
            ip.trim_start_matches('[').trim_end_matches(']').to_string()
        }
    };
    let port = config_get(ctx, "replica-announce-port")
        .filter(|p| p != "0" && !p.is_empty())
        .or_else(|| config_get(ctx, "port"))?;
    Some(format!("{ip}:{port}"))
}

/// One field of an `INFO` section.
fn info_field(ctx: &Context, section: &str, field: &str) -> Option<String> {
    let text = match ctx.call("INFO", &[section]).ok()? {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s,
        RedisValue::StringBuffer(b) => String::from_utf8_lossy(&b).into_owned(),
        RedisValue::VerbatimString((_, b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => return None,
    };
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// One field of `INFO replication`.
fn replication_field(ctx: &Context, field: &str) -> Option<String> {
    info_field(ctx, "replication", field)
}

/// `WARDEN.SYNCSTATE n always members`: the master's marker, as replicas and
/// the AOF receive it. Replies OK; nothing in the keyspace changes.
pub fn syncstate(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    effects_only(ctx)?;
    let Some(marker) = Marker::parse(&args[1], &args[2], &args[3]) else {
        return Err(RedisError::Str(error::INVALID_EFFECT));
    };
    let flags = ctx.get_flags();
    // From a master: who this replica is, and which history it belongs to.
    let mut seen = Seen {
        marker: Some(marker),
        ..Seen::default()
    };
    if flags.contains(ContextFlags::SLAVE) && !flags.contains(ContextFlags::LOADING) {
        seen.me = my_address(ctx);
        seen.replid = replication_field(ctx, "master_replid").unwrap_or_default();
        let host = replication_field(ctx, "master_host");
        let port = replication_field(ctx, "master_port");
        seen.master = host.zip(port).map(|(h, p)| format!("{h}:{p}"));
    }
    SEEN.with(|s| *s.borrow_mut() = seen);
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Set when this server's own start loads an AOF (not a replica's sync).
static LOADING_AOF: AtomicBool = AtomicBool::new(false);

/// An AOF load begins: the markers it replays are this server's own history.
pub fn loading_aof() {
    LOADING_AOF.store(true, Ordering::Relaxed);
    SEEN.with(|s| *s.borrow_mut() = Seen::default());
}

/// After this server's own start loaded its data: whether no answered grant
/// can be missing (`grace auto`'s restart rule), saying why in the log.
pub fn restart_lost_nothing(ctx: &Context) -> bool {
    let from_aof = LOADING_AOF.swap(false, Ordering::Relaxed);
    let marked_always = SEEN.with(|s| s.borrow().marker.as_ref().is_some_and(|m| m.always));
    let safe = from_aof && marked_always && appendfsync_always(ctx);
    if safe {
        ctx.log_notice(
            "grace auto: no window: the AOF was fsynced before every reply \
             (appendfsync always), so it holds every grant this server answered",
        );
    }
    safe
}

/// What `grace auto` concludes at a promotion.
#[derive(Debug, PartialEq, Eq)]
pub enum Promotion {
    /// Every grant the old master answered is here: no window.
    LostNothing,
    /// A window, which [`resynced`] may end early.
    Watch,
    /// A window for its whole length.
    MayHaveLost,
}

/// One field of `INFO stats` (-1 if absent).
fn stats_field(ctx: &Context, field: &str) -> i64 {
    info_field(ctx, "stats", field)
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// At a promotion: whether the last marker from the old master (same
/// history) names this server with N ≥ the roster's size; else whether a
/// resync may still show it (see [`resynced`]). Says why in the log.
pub fn promotion(ctx: &Context) -> Promotion {
    let old = replication_field(ctx, "master_replid2").unwrap_or_default();
    let (marker, replid, me, master) = SEEN.with(|s| {
        let s = s.borrow();
        (
            s.marker.clone(),
            s.replid.clone(),
            s.me.clone(),
            s.master.clone(),
        )
    });
    let same_history = !old.is_empty() && replid == old;
    let marker = marker.filter(|_| same_history);
    if let (Some(m), Some(me)) = (&marker, &me) {
        if m.covers(me) {
            ctx.log_notice(&format!(
                "grace auto: no window: the old master answered a grant only once all {} \
                 replicas of its roster acknowledged it, this one ({me}) among them",
                m.n
            ));
            return Promotion::LostNothing;
        }
    }
    let Some(m) = marker else {
        ctx.log_notice(&format!(
            "grace auto: a window: no marker from the old master's history {old:?} \
             (the last came from {replid:?}): grants it answered may be missing here"
        ));
        return Promotion::MayHaveLost;
    };
    let others: Vec<String> = if m.n >= 1 {
        m.members
            .iter()
            .filter(|a| Some(*a) != me.as_ref())
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    ctx.log_notice(&format!(
        "grace auto: a window, until the old master ({}) or every other acknowledging \
         replica ({}) resyncs from here without a full sync",
        master.as_deref().unwrap_or("unknown"),
        if m.n >= 1 {
            others.join(", ")
        } else {
            "none: grants did not wait for replicas".into()
        }
    ));
    let proof = Proof {
        old_master: master,
        others,
        full_syncs: stats_field(ctx, "sync_full"),
        failed_partial: stats_field(ctx, "sync_partial_err"),
    };
    let usable = proof.old_master.is_some() || !proof.others.is_empty();
    PROOF.with(|p| *p.borrow_mut() = usable.then_some(proof));
    if usable {
        Promotion::Watch
    } else {
        Promotion::MayHaveLost
    }
}

/// While a promotion's window is open: whether the old master, or every
/// other replica that acknowledged grants, now replicates from here and no
/// sync since the promotion was a full one — so each continued from an
/// offset this server has, and none held a grant it lacks (a replica with
/// more of the old history than this server is refused a partial resync).
pub fn resynced(ctx: &Context) -> bool {
    let Some(view) = crate::acks::read(ctx.ctx) else {
        return false;
    };
    let full_syncs = stats_field(ctx, "sync_full");
    let failed_partial = stats_field(ctx, "sync_partial_err");
    PROOF.with(|p| {
        let p = p.borrow();
        let Some(proof) = p.as_ref() else {
            return false;
        };
        if full_syncs != proof.full_syncs || failed_partial != proof.failed_partial {
            return false;
        }
        let online = |a: &String| view.replicas.iter().any(|(r, _)| r == a);
        let old_master = proof.old_master.as_ref().is_some_and(online);
        let others = !proof.others.is_empty() && proof.others.iter().all(online);
        if old_master || others {
            ctx.log_notice(&format!(
                "grace auto: {} resynced from here without a full sync: no grant is missing",
                if old_master {
                    "the old master"
                } else {
                    "every other acknowledging replica"
                }
            ));
        }
        old_master || others
    })
}

/// The promotion's window ended, or the role changed: nothing to watch.
pub fn stop_watching() {
    PROOF.with(|p| *p.borrow_mut() = None);
}

/// Set once this master wrote a roster marker (`sync-replicas` N ≥ 1, on
/// any `grace`): its replicas may be on `grace auto` and rely on it, so a
/// full sync's fork sends it again.
static ROSTER_WRITTEN: AtomicBool = AtomicBool::new(false);

/// A marker was due (a durability change, the end of a fork) while writes
/// were paused: the next effect writes it first ([`before_effect`]), or a
/// retry once writes resume. While it is unwritten, the replicas' and the
/// AOF's last marker may say what is no longer true (`appendfsync always`,
/// a roster a full sync dropped).
static DURABILITY_UNMARKED: AtomicBool = AtomicBool::new(false);

/// Whether markers outside the roster's own changes are wanted: for a
/// restart under `grace auto`, or for replicas that may be on it.
fn wants_markers() -> bool {
    GRACE_AUTO.load(Ordering::Relaxed) || ROSTER_WRITTEN.load(Ordering::Relaxed)
}

/// A marker now, where `grace auto` restarts rely on it: after the start's
/// load, on a change of `appendonly`/`appendfsync`, after an AOF rewrite or
/// a full sync's fork. While writes are paused it is written by the first
/// effect after them, or by a retry: never after a grant made under what it
/// says.
pub fn mark_durability(ctx: &Context) {
    if !wants_markers() || ctx.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    if !crate::waiters::may_write(ctx) {
        if !DURABILITY_UNMARKED.swap(true, Ordering::Relaxed) {
            ctx.create_timer(Duration::from_millis(10), retry_marker, ());
        }
        return;
    }
    DURABILITY_UNMARKED.store(false, Ordering::Relaxed);
    let (n, members) = ROSTER.with(|r| {
        let r = r.borrow();
        (
            r.written.map_or(0, |(n, _)| n),
            r.members[..r.written.map_or(0, |(_, size)| size)].join(","),
        )
    });
    replicate(ctx, n, appendfsync_always(ctx), &members);
}

/// Writes a marker that paused writes held back, once they resume.
fn retry_marker(ctx: &Context, _: ()) {
    crate::guard::callback((), || {
        if ctx.get_flags().contains(ContextFlags::SLAVE) {
            DURABILITY_UNMARKED.store(false, Ordering::Relaxed);
        } else if !DURABILITY_UNMARKED.load(Ordering::Relaxed) {
            // An effect wrote it first.
        } else if crate::waiters::may_write(ctx) {
            mark_durability(ctx);
        } else {
            ctx.create_timer(Duration::from_millis(10), retry_marker, ());
        }
    })
}

/// Before any effect (a grant, a release, a hand-off) is replicated: a
/// marker that paused writes held back goes first, so neither a replica nor
/// the AOF holds a grant made after a change its last marker does not show.
/// One relaxed load when none is due.
pub fn before_effect(ctx: &Context) {
    if DURABILITY_UNMARKED.load(Ordering::Relaxed) {
        mark_durability(ctx);
    }
}

/// Whether forks must be heard: after an AOF rewrite the AOF holds no
/// marker until one is written, and after a full sync the replica holds none.
pub fn wants_forks() -> bool {
    wants_markers()
}

/// A fork's child ended (an AOF rewrite, a save, a full sync): the new AOF
/// and the replica that synced get a marker.
pub fn child_ended(ctx: &Context) {
    mark_durability(ctx);
}

/// This replica begins loading a full sync from its master: the marker it
/// held came with a dataset and stream that are gone, and may name it under
/// a roster it never read (a member added while it was away). It holds none
/// until its master sends one again, and a promotion before then opens the
/// window.
pub fn full_sync_started(ctx: &Context) {
    let had = SEEN.with(|s| s.replace(Seen::default()).marker.is_some());
    if had {
        ctx.log_notice("grace auto: a full sync from the master: the last roster marker is forgotten until the master sends one");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_covers_a_replica_it_names_when_n_reaches_every_member() {
        let m = |n: i64, members: &[&str]| Marker {
            n,
            always: false,
            members: members.iter().map(|s| s.to_string()).collect(),
        };
        let cases = [
            (m(1, &["a:1"]), "a:1", true),
            (m(2, &["a:1", "b:1"]), "b:1", true),
            (m(1, &["a:1", "b:1"]), "a:1", false),
            (m(1, &["a:1"]), "b:1", false),
            (m(0, &["a:1"]), "a:1", false),
            (m(3, &[]), "a:1", false),
        ];
        for (marker, me, covered) in cases {
            assert_eq!(marker.covers(me), covered, "{marker:?} {me}");
        }
    }

    #[test]
    fn markers_parse_as_written_and_refuse_anything_else() {
        assert_eq!(
            Marker::parse(b"2", b"1", b"10.0.0.1:6379,10.0.0.2:6379"),
            Some(Marker {
                n: 2,
                always: true,
                members: vec!["10.0.0.1:6379".into(), "10.0.0.2:6379".into()]
            })
        );
        assert_eq!(
            Marker::parse(b"0", b"0", b"").map(|m| m.members.len()),
            Some(0)
        );
        for (n, always) in [("-1", "0"), ("x", "0"), ("1", "2"), ("1025", "1")] {
            assert_eq!(Marker::parse(n.as_bytes(), always.as_bytes(), b""), None);
        }
    }

    #[test]
    fn a_roster_counts_an_address_as_often_as_it_is_online_at_once() {
        let online = |addrs: &[&str]| -> Vec<(String, i64)> {
            addrs.iter().map(|a| (a.to_string(), 0)).collect()
        };
        let mut r = Roster::default();
        assert!(r.take_in(&online(&["a:1"])));
        assert!(!r.take_in(&online(&["a:1"])), "nothing new");
        assert!(!r.ambiguous);
        assert_eq!(r.promised_n(1), 1);
        assert!(r.take_in(&online(&["a:1", "a:1", "b:1"])));
        assert_eq!(r.members, ["a:1", "a:1", "b:1"]);
        assert!(r.ambiguous, "two replicas share a:1");
        assert_eq!(r.promised_n(3), 0, "an ambiguous roster promises nothing");
        assert!(!r.take_in(&online(&["b:1"])), "the roster never shrinks");
    }

    #[test]
    fn a_barrier_needs_every_copy_of_a_shared_address_to_acknowledge() {
        let members = vec!["a:1".to_string(), "a:1".to_string(), "b:1".to_string()];
        let view = |acks: &[(&str, i64)]| -> Vec<(String, i64)> {
            acks.iter().map(|(a, o)| (a.to_string(), *o)).collect()
        };
        let cases = [
            (view(&[("a:1", 10), ("a:1", 10), ("b:1", 10)]), true),
            (view(&[("a:1", 10), ("a:1", 9), ("b:1", 10)]), false),
            (view(&[("a:1", 10), ("b:1", 10)]), false),
            (view(&[("a:1", 10), ("a:1", 10)]), false),
        ];
        for (online, done) in cases {
            assert_eq!(all_acknowledged(&members, &online, 10), done, "{online:?}");
        }
        // A list that names a:1 once, with two replicas showing it: both.
        let members = vec!["a:1".to_string()];
        let cases = [
            (view(&[("a:1", 10), ("a:1", 9)]), false),
            (view(&[("a:1", 10), ("a:1", 10)]), true),
            (view(&[("a:1", 10)]), true),
        ];
        for (online, done) in cases {
            assert_eq!(all_acknowledged(&members, &online, 10), done, "{online:?}");
        }
    }
}
