//! SPEC "Conventions": a command the server refuses is no write — it revokes
//! no cache lease and serves no waiter; expiry in the past is a write on
//! every server, also on a key that does not exist; and warden hears other
//! commands only while it has cache leases.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

fn pair(c: &mut Connection, words: &[&str]) -> (Option<Vec<u8>>, Option<i64>) {
    match run(c, words).unwrap() {
        Value::Array(v) if v.len() == 2 => {
            let value = match &v[0] {
                Value::BulkString(b) => Some(b.clone()),
                _ => None,
            };
            let lease = match v[1] {
                Value::Int(n) => Some(n),
                _ => None,
            };
            (value, lease)
        }
        other => panic!("{words:?}: {other:?}"),
    }
}

fn lease_of(c: &mut Connection, key: &str) -> Option<i64> {
    match map(c, &["CACHE.INFO", key])
        .into_iter()
        .find(|(k, _)| k == "lease")
        .map(|(_, v)| v)
    {
        Some(Value::Int(n)) => Some(n),
        _ => None,
    }
}

/// Before a case: the key's state and the lease on it.
#[derive(Clone, Copy, Debug)]
enum Before {
    /// Missing, a miss lease out and one reader waiting for its fill.
    MissingWithWaiter,
    /// A value with a refresh lease out.
    Value,
}

/// Takes the lease (and queues the waiter); the token and the waiter.
fn prepare(
    s: &Server,
    c: &mut Connection,
    before: Before,
) -> (i64, Option<std::thread::JoinHandle<Value>>) {
    prepare_on(s, c, before, "k")
}

fn prepare_on(
    s: &Server,
    c: &mut Connection,
    before: Before,
    key: &str,
) -> (i64, Option<std::thread::JoinHandle<Value>>) {
    match before {
        Before::MissingWithWaiter => {
            let (_, token) = pair(c, &["CACHE.GET", key, "60000"]);
            let mut w = s.conn();
            let k = key.to_string();
            let handle = std::thread::spawn(move || {
                run(&mut w, &["CACHE.GET", &k, "60000", "WAIT", "30000"]).unwrap()
            });
            wait_for("one cache waiter", Duration::from_secs(10), || {
                field_int(&map(c, &["CACHE.INFO", key]), "waiters") == 1
            });
            (token.unwrap(), Some(handle))
        }
        Before::Value => {
            run(c, &["SET", key, "old", "PX", "100000"]).unwrap();
            let (_, token) = pair(c, &["CACHE.GET", key, "60000", "REFRESH", "200000"]);
            (token.unwrap(), None)
        }
    }
}

/// The lease outlived the refused command: nothing was revoked, nobody
/// was served, and the holder's fill is stored and answers the waiter.
fn assert_untouched(
    c: &mut Connection,
    case: &str,
    token: i64,
    waiter: Option<std::thread::JoinHandle<Value>>,
) {
    assert_untouched_on(c, case, "k", token, waiter)
}

fn assert_untouched_on(
    c: &mut Connection,
    case: &str,
    key: &str,
    token: i64,
    waiter: Option<std::thread::JoinHandle<Value>>,
) {
    assert_eq!(lease_of(c, key), Some(token), "{case}: the lease stays");
    if waiter.is_some() {
        let waiting = field_int(&map(c, &["CACHE.INFO", key]), "waiters");
        assert_eq!(waiting, 1, "{case}: the waiter was not served");
    }
    let filled = int(c, &["CACHE.FILL", key, &token.to_string(), "fresh"]);
    assert_eq!(filled, 1, "{case}: the holder's fill is stored");
    if let Some(w) = waiter {
        match w.join().unwrap() {
            Value::Array(v) => assert_eq!(v[0], Value::BulkString(b"fresh".to_vec()), "{case}"),
            other => panic!("{case}: {other:?}"),
        }
    }
}

/// How a refusal is set up: the connection that sends the refused
/// commands, made from the server and an admin connection.
type Refuser = fn(&Server, &mut Connection) -> Connection;

fn same(s: &Server, _admin: &mut Connection) -> Connection {
    s.conn()
}

fn unauthenticated(s: &Server, admin: &mut Connection) -> Connection {
    run(admin, &["CONFIG", "SET", "requirepass", "secret"]).unwrap();
    s.conn()
}

fn user(s: &Server, admin: &mut Connection, rules: &[&str]) -> Connection {
    let mut words = vec!["ACL", "SETUSER", "limited", "on", "nopass"];
    words.extend_from_slice(rules);
    run(admin, &words).unwrap();
    let mut c = s.conn();
    run(&mut c, &["AUTH", "limited", "any"]).unwrap();
    c
}

fn other_keys_only(s: &Server, admin: &mut Connection) -> Connection {
    user(s, admin, &["~mine:*", "+@all"])
}

fn no_del_command(s: &Server, admin: &mut Connection) -> Connection {
    user(s, admin, &["~*", "+@all", "-del", "-expire", "-set"])
}

fn out_of_memory(s: &Server, admin: &mut Connection) -> Connection {
    run(admin, &["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    s.conn()
}

fn too_few_replicas(s: &Server, admin: &mut Connection) -> Connection {
    run(admin, &["CONFIG", "SET", "min-replicas-to-write", "1"]).unwrap();
    s.conn()
}

/// Puts back what a refuser changed.
fn restore(admin: &mut Connection) {
    for words in [
        &["CONFIG", "SET", "requirepass", ""][..],
        &["CONFIG", "SET", "maxmemory", "0"],
        &["CONFIG", "SET", "min-replicas-to-write", "0"],
        &["ACL", "DELUSER", "limited"],
    ] {
        run(admin, words).unwrap();
    }
}

#[test]
fn a_refused_command_revokes_nothing_and_serves_no_waiter() {
    // (name, who sends, what is sent: every command is refused by the server)
    let cases: &[(&str, Refuser, &[&[&str]])] = &[
        ("NOAUTH DEL", unauthenticated, &[&["DEL", "k"]]),
        ("NOAUTH EXPIRE", unauthenticated, &[&["EXPIRE", "k", "0"]]),
        ("NOPERM key DEL", other_keys_only, &[&["DEL", "k"]]),
        ("NOPERM key SET", other_keys_only, &[&["SET", "k", "x"]]),
        ("NOPERM command", no_del_command, &[&["DEL", "k"]]),
        ("NOPERM EXPIRE", no_del_command, &[&["EXPIRE", "k", "-1"]]),
        ("wrong arity GETDEL", same, &[&["GETDEL", "k", "extra"]]),
        ("wrong arity EXPIRE", same, &[&["EXPIRE", "k"]]),
        ("unknown command", same, &[&["DELETE", "k"]]),
        ("OOM SET", out_of_memory, &[&["SET", "k", "x"]]),
        (
            "OOM SUNIONSTORE",
            out_of_memory,
            &[&["SUNIONSTORE", "k", "none"]],
        ),
        ("NOREPLICAS DEL", too_few_replicas, &[&["DEL", "k"]]),
        ("NOREPLICAS SET", too_few_replicas, &[&["SET", "k", "x"]]),
    ];
    let s = Server::start(&[]);
    let mut admin = s.conn();
    for (name, refuser, commands) in cases {
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("{name}, {before:?}");
            run(&mut admin, &["FLUSHALL"]).unwrap();
            let (token, waiter) = prepare(&s, &mut admin, before);
            let errors_before = warden_stat(&mut admin, "cache_revoked");
            let mut r = refuser(&s, &mut admin);
            for words in commands.iter() {
                assert!(run(&mut r, words).is_err(), "{case}: {words:?} is refused");
            }
            restore(&mut admin);
            assert_untouched(&mut admin, &case, token, waiter);
            assert_eq!(
                warden_stat(&mut admin, "cache_revoked"),
                errors_before,
                "{case}: no counter moved"
            );
        }
    }
}

/// A transaction `EXEC` discards runs none of its commands: nothing is
/// revoked, on every server (a write queued in `MULTI` has not run).
#[test]
fn a_transaction_that_never_runs_revokes_nothing() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let cases: &[(&str, &[&[&str]], &str)] = &[
        (
            "EXECABORT",
            &[&["MULTI"], &["DEL", "k"], &["GETDEL"], &["EXEC"]],
            "EXECABORT",
        ),
        ("DISCARD", &[&["MULTI"], &["DEL", "k"], &["DISCARD"]], ""),
    ];
    for (name, commands, error) in cases {
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("{name}, {before:?}");
            run(&mut admin, &["FLUSHALL"]).unwrap();
            let (token, waiter) = prepare(&s, &mut admin, before);
            let mut c = s.conn();
            let mut seen = String::new();
            for words in commands.iter() {
                if let Err(e) = run(&mut c, words) {
                    seen.push_str(&error_text(&e));
                }
            }
            assert!(seen.contains(error), "{case}: {seen}");
            assert_untouched(&mut admin, &case, token, waiter);
        }
    }
    // A transaction that runs revokes, on every server.
    run(&mut admin, &["FLUSHALL"]).unwrap();
    let (token, _waiter) = prepare(&s, &mut admin, Before::Value);
    let mut c = s.conn();
    for words in [&["MULTI"][..], &["DEL", "k"], &["EXEC"]] {
        run(&mut c, words).unwrap();
    }
    let filled = int(&mut admin, &["CACHE.FILL", "k", &token.to_string(), "late"]);
    assert_eq!(filled, 0, "an EXEC that ran revoked");
}

/// SPEC cache rule 6: a time that is not in the future deletes, on every
/// server (Valkey announces it as `expired`), also on a missing key.
#[test]
fn expiry_in_the_past_revokes_even_on_a_missing_key() {
    let writes: &[&[&str]] = &[
        &["EXPIRE", "k", "0"],
        &["EXPIRE", "k", "-1"],
        &["PEXPIRE", "k", "0"],
        &["EXPIREAT", "k", "1"],
        &["PEXPIREAT", "k", "1"],
        &["GETEX", "k", "PXAT", "1"],
        &["GETEX", "k", "EXAT", "1"],
        &["SET", "k", "x", "PXAT", "1"],
    ];
    let s = Server::start(&[]);
    let mut c = s.conn();
    for words in writes {
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("{words:?}, {before:?}");
            run(&mut c, &["FLUSHALL"]).unwrap();
            let (token, waiter) = prepare(&s, &mut c, before);
            let _ = run(&mut c, words);
            let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "late"]);
            assert_eq!(filled, 0, "{case}: the stale fill is refused");
            if let Some(w) = waiter {
                // The oldest waiter got a new lease: it loads, nobody else does.
                match w.join().unwrap() {
                    Value::Array(v) => {
                        assert!(matches!(v[1], Value::Int(t) if t > token), "{case}")
                    }
                    other => panic!("{case}: {other:?}"),
                }
            }
        }
    }
}

/// A write that ran counts even when an error follows it at once: a
/// script's own error, or a malformed request behind it on its connection.
/// Loads the function `w`: it sets its key to `new`, then answers `error`.
fn load_writing_function(c: &mut Connection, error: &str) {
    let library = format!(
        "#!lua name=writes\nredis.register_function('w', function(keys) \
         redis.call('SET', keys[1], 'new'); return redis.error_reply('{error}') end)"
    );
    run(c, &["FUNCTION", "LOAD", &library]).unwrap();
}

#[test]
fn a_write_followed_by_an_error_still_revokes() {
    use std::io::{Read, Write};
    let s = Server::start(&[]);
    let mut c = s.conn();
    let cases: &[&str] = &["script error", "function error", "protocol error"];
    load_writing_function(&mut c, "ERR x");
    for case in cases {
        for before in [Before::MissingWithWaiter, Before::Value] {
            run(&mut c, &["DEL", "k"]).unwrap();
            let (token, waiter) = prepare(&s, &mut c, before);
            match *case {
                "script error" => {
                    let script = "redis.call('SET', KEYS[1], 'new'); error('boom')";
                    assert!(run(&mut c, &["EVAL", script, "1", "k"]).is_err());
                }
                "function error" => assert!(run(&mut c, &["FCALL", "w", "1", "k"]).is_err()),
                _ => {
                    let mut raw = std::os::unix::net::UnixStream::connect(s.socket()).unwrap();
                    raw.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nnew\r\n*abc\r\n")
                        .unwrap();
                    let mut out = Vec::new();
                    raw.read_to_end(&mut out).unwrap();
                    assert!(out.starts_with(b"+OK\r\n-ERR Protocol error"), "{out:?}");
                }
            }
            let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "stale"]);
            assert_eq!(
                filled, 0,
                "{case}, {before:?}: the fill after a write is refused"
            );
            if let Some(w) = waiter {
                match w.join().unwrap() {
                    Value::Array(v) => {
                        assert_eq!(v[0], Value::BulkString(b"new".to_vec()), "{case}")
                    }
                    other => panic!("{case}: {other:?}"),
                }
            }
        }
    }
}

/// A command that only reads the key is no write, whoever answers it.
#[test]
fn a_read_revokes_nothing() {
    let reads: &[&[&str]] = &[
        &["GET", "k"],
        &["STRLEN", "k"],
        &["HGET", "k", "f"],
        &["LRANGE", "k", "0", "-1"],
        &["TTL", "k"],
        &["EXISTS", "k"],
        &["LOCK.INFO", "k"],
        &["BF.EXISTS", "k", "x"],
        &["ECHO", "k"],
        &["EVAL", "return redis.call('EXISTS', KEYS[1])", "1", "k"],
    ];
    let s = Server::start(&[]);
    let mut c = s.conn();
    for before in [Before::MissingWithWaiter, Before::Value] {
        run(&mut c, &["FLUSHALL"]).unwrap();
        let (token, waiter) = prepare(&s, &mut c, before);
        for words in reads {
            let _ = run(&mut c, words);
        }
        assert_untouched(&mut c, &format!("reads, {before:?}"), token, waiter);
    }
}

/// warden hears other commands (a command filter, client disconnects) only
/// while its lease table has entries.
#[test]
fn other_commands_are_heard_only_while_leases_exist() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(warden_stat(&mut c, "cache_listening"), 0, "at load");
    run(&mut c, &["SET", "a", "1"]).unwrap();
    assert_eq!(
        warden_stat(&mut c, "cache_listening"),
        0,
        "a hit grants nothing"
    );
    let _ = pair(&mut c, &["CACHE.GET", "a", "1000"]);
    assert_eq!(
        warden_stat(&mut c, "cache_listening"),
        0,
        "nor does a cache hit"
    );
    let mut holder = s.conn();
    let (_, token) = pair(&mut holder, &["CACHE.GET", "k", "60000"]);
    assert!(token.is_some());
    assert_eq!(warden_stat(&mut c, "cache_listening"), 1, "a lease is out");
    drop(holder);
    wait_for(
        "the lease to end with its holder",
        Duration::from_secs(10),
        || warden_stat(&mut c, "cache_listening") == 0,
    );
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
    // A stale window is an entry too, and ends by itself.
    run(&mut c, &["SET", "s", "v"]).unwrap();
    run(&mut c, &["CACHE.INVALIDATE", "s", "STALE", "300"]).unwrap();
    assert_eq!(warden_stat(&mut c, "cache_listening"), 1, "a stale window");
    wait_for("the stale window to end", Duration::from_secs(10), || {
        warden_stat(&mut c, "cache_listening") == 0
    });
    assert_eq!(warden_stat(&mut c, "cache_entries"), 0);
}

/// Whether the server says which client sent a command (Redis ≥ 7.2,
/// Valkey); on Redis 7.0 every `EXEC` that runs while leases exist revokes
/// every lease, since the keys its transaction queued are unknown.
fn knows_sender(c: &mut Connection) -> bool {
    let knows = is_valkey() || server_version(c) >= (7, 2);
    println!(
        "version-dependent: {} {:?}: {}",
        if is_valkey() { "Valkey" } else { "Redis" },
        server_version(c),
        if knows {
            "an EXEC revokes the leases of the keys its transaction queued"
        } else {
            "an EXEC that runs a write command revokes every lease (Redis 7.0 does not say who sent a command)"
        }
    );
    knows
}

/// A write queued in `MULTI` before the key had a lease — before any lease
/// existed, or while only other keys had one — and run by `EXEC` after the
/// lease was granted ends that lease: the reader's fill is refused and the
/// key keeps the writer's value.
#[test]
fn a_write_queued_before_the_lease_revokes_it_at_exec() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    knows_sender(&mut admin);
    // (the write queued, the key's value after EXEC)
    let writes: &[(&[&str], Option<&str>)] = &[
        (&["SET", "k", "new"], Some("new")),
        (&["DEL", "k"], None),
        (
            &["EVAL", "return redis.call('SET', KEYS[1], 'new')", "1", "k"],
            Some("new"),
        ),
    ];
    for (words, after) in writes {
        for other_lease in [false, true] {
            let case = format!("{words:?}, a lease on another key: {other_lease}");
            run(&mut admin, &["FLUSHALL"]).unwrap();
            let mut holder = s.conn();
            if other_lease {
                let (_, t) = pair(&mut holder, &["CACHE.GET", "other", "60000"]);
                assert!(t.is_some(), "{case}");
            } else {
                wait_for("no listening", Duration::from_secs(10), || {
                    warden_stat(&mut admin, "cache_listening") == 0
                });
            }
            let mut w = s.conn();
            run(&mut w, &["MULTI"]).unwrap();
            run(&mut w, words).unwrap();
            let mut r = s.conn();
            let (_, token) = pair(&mut r, &["CACHE.GET", "k", "60000"]);
            let token = token.expect("a miss grants a lease");
            run(&mut w, &["EXEC"]).unwrap();
            let filled = int(&mut r, &["CACHE.FILL", "k", &token.to_string(), "old"]);
            assert_eq!(filled, 0, "{case}: the stale fill is refused");
            let value: Option<String> = redis::cmd("GET").arg("k").query(&mut admin).unwrap();
            assert_eq!(value.as_deref(), *after, "{case}: the writer's value stays");
        }
    }
}

/// A transaction that grants a lease and then writes its key, run while the
/// filter did not listen yet (no lease existed when it was queued).
#[test]
fn a_write_after_a_grant_in_the_same_transaction_revokes_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for other_lease in [false, true] {
        run(&mut c, &["FLUSHALL"]).unwrap();
        let mut holder = s.conn();
        if other_lease {
            pair(&mut holder, &["CACHE.GET", "other", "60000"]);
        }
        run(&mut c, &["MULTI"]).unwrap();
        run(&mut c, &["CACHE.GET", "k", "60000"]).unwrap();
        run(&mut c, &["SET", "k", "new"]).unwrap();
        let token = match run(&mut c, &["EXEC"]).unwrap() {
            Value::Array(v) => match &v[0] {
                Value::Array(p) => match p[1] {
                    Value::Int(t) => t,
                    ref other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "old"]);
        assert_eq!(filled, 0, "other lease {other_lease}: the fill is refused");
        let value: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
        assert_eq!(value, "new");
    }
}

/// A transaction that writes other keys leaves a lease alone where the
/// server says who sent each command; on Redis 7.0 any `EXEC` that runs a
/// write revokes (a reload, never a stale value). One that only reads
/// revokes nothing anywhere.
#[test]
fn a_transaction_on_other_keys_revokes_only_where_the_sender_is_unknown() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let knows = knows_sender(&mut admin);
    let (token, _) = prepare(&s, &mut admin, Before::Value);
    let mut w = s.conn();
    for words in [&["MULTI"][..], &["GET", "elsewhere"], &["EXEC"]] {
        run(&mut w, words).unwrap();
    }
    assert_eq!(lease_of(&mut admin, "k"), Some(token), "a read-only EXEC");
    for words in [&["MULTI"][..], &["SET", "elsewhere", "1"], &["EXEC"]] {
        run(&mut w, words).unwrap();
    }
    if knows {
        assert_untouched(&mut admin, "other keys", token, None);
    } else {
        assert_eq!(lease_of(&mut admin, "k"), None, "revoked on Redis 7.0");
    }
}

/// Writes postponed by `CLIENT PAUSE WRITE` run after a lease granted by a
/// reader postponed before them: the lease ends (the pause ending by its
/// timeout or by `CLIENT UNPAUSE`, with or without other leases out).
#[test]
fn a_postponed_write_revokes_a_lease_granted_before_it_runs() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let blocked = |c: &mut Connection| -> i64 {
        let info: String = redis::cmd("INFO").arg("clients").query(c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    for other_lease in [false, true] {
        for by_timeout in [true, false] {
            let case = format!("other lease {other_lease}, ends by timeout {by_timeout}");
            run(&mut admin, &["FLUSHALL"]).unwrap();
            let mut holder = s.conn();
            if other_lease {
                pair(&mut holder, &["CACHE.GET", "other", "60000"]);
            }
            let ms = if by_timeout { "300" } else { "60000" };
            run(&mut admin, &["CLIENT", "PAUSE", ms, "WRITE"]).unwrap();
            let (mut r, mut w) = (s.conn(), s.conn());
            let reader = std::thread::spawn(move || pair(&mut r, &["CACHE.GET", "k", "60000"]));
            wait_for("the reader postponed", Duration::from_secs(10), || {
                blocked(&mut admin) == 1
            });
            let writer = std::thread::spawn(move || run(&mut w, &["SET", "k", "new"]).unwrap());
            wait_for("the writer postponed", Duration::from_secs(10), || {
                blocked(&mut admin) == 2
            });
            if !by_timeout {
                run(&mut admin, &["CLIENT", "UNPAUSE"]).unwrap();
            }
            let (value, token) = reader.join().unwrap();
            writer.join().unwrap();
            assert_eq!(value, None, "{case}: the reader ran first");
            let token = token.expect("a miss grants a lease");
            let filled = int(&mut admin, &["CACHE.FILL", "k", &token.to_string(), "old"]);
            assert_eq!(filled, 0, "{case}: the stale fill is refused");
            let value: String = redis::cmd("GET").arg("k").query(&mut admin).unwrap();
            assert_eq!(value, "new", "{case}");
        }
    }
}

/// Whether the command the server runs is a write is the server's word, as
/// it will look the command up: a command renamed by `rename-command` writes
/// (or reads) under its new name and is unknown, so refused, under its old
/// one; a container's subcommand (`XGROUP CREATE`) writes; so does a command
/// of a module loaded after warden (at start-up or by `MODULE LOAD` while a
/// lease is out), also inside a transaction warden did not see opened. A
/// renamed command counts as a write the first time it names a leased key
/// (its flags are learnt on the next timer turn): the cases below run once
/// on another leased key first, and then must revoke exactly what they write.
#[test]
fn commands_are_known_as_the_server_knows_them() {
    let late = late_module_path().display().to_string();
    let s = Server::start(&[
        "--rename-command",
        "APPEND",
        "MYAPPEND",
        "--rename-command",
        "STRLEN",
        "LENGTH",
        "--rename-command",
        "UNLINK",
        "MYUNLINK",
        "--loadmodule",
        &late,
    ]);
    let mut c = s.conn();
    // (what is sent, whether it writes the key, whether it answers an error)
    let cases: &[(&[&str], bool, bool)] = &[
        (&["MYAPPEND", "k", "new"], true, false),
        (&["myappend", "k", "new"], true, false),
        (&["MYUNLINK", "k"], true, false),
        (&["APPEND", "k", "new"], false, true),
        (&["UNLINK", "k"], false, true),
        (&["LENGTH", "k"], false, false),
        (&["STRLEN", "k"], false, true),
        (
            &["XGROUP", "CREATE", "k", "g", "$", "MKSTREAM"],
            true,
            false,
        ),
        (&["XGROUP", "NOSUCH", "k"], false, true),
        (&["XINFO", "STREAM", "k"], false, true),
        (&["LATE.SET", "k", "new"], true, false),
        (&["LATE.GET", "k"], false, false),
        // The module declares no arity: the server runs it, it answers an
        // error itself, and counts as a write (revoking more is safe).
        (&["LATE.SET", "k"], true, true),
    ];
    for (words, writes, _) in cases {
        run(&mut c, &["DEL", "warm"]).unwrap();
        let mut holder = s.conn();
        let (_, token) = pair(&mut holder, &["CACHE.GET", "warm", "60000"]);
        assert!(token.is_some());
        let warm: Vec<&str> = words
            .iter()
            .map(|w| if *w == "k" { "warm" } else { w })
            .collect();
        let revoked = warden_stat(&mut c, "cache_revoked");
        let _ = run(&mut c, &warm);
        if *writes {
            let now = warden_stat(&mut c, "cache_revoked");
            assert_eq!(now, revoked + 1, "{words:?} on first sight");
        }
    }
    for (words, writes, refused) in cases {
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("{words:?}, {before:?}");
            run(&mut c, &["FLUSHALL"]).unwrap();
            let (token, waiter) = prepare(&s, &mut c, before);
            let reply = run(&mut c, words);
            // (XGROUP or XINFO of a missing key or a string fails as the
            // command runs: that is no refusal.)
            if *refused {
                assert!(reply.is_err(), "{case}: refused");
            }
            if *writes {
                let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "stale"]);
                assert_eq!(filled, 0, "{case}: the stale fill is refused");
                if let Some(w) = waiter {
                    // Woken: served the new value, or WRONGTYPE for a stream.
                    let _ = w.join();
                }
            } else {
                assert_untouched(&mut c, &case, token, waiter);
            }
        }
    }

    // A transaction opened before any lease existed (warden did not see it
    // open) that runs only the later module's write.
    run(&mut c, &["FLUSHALL"]).unwrap();
    wait_for("no listening", Duration::from_secs(10), || {
        warden_stat(&mut c, "cache_listening") == 0
    });
    let mut w = s.conn();
    run(&mut w, &["MULTI"]).unwrap();
    run(&mut w, &["LATE.SET", "k", "new"]).unwrap();
    let (_, token) = pair(&mut c, &["CACHE.GET", "k", "60000"]);
    run(&mut w, &["EXEC"]).unwrap();
    let filled = int(
        &mut c,
        &["CACHE.FILL", "k", &token.unwrap().to_string(), "old"],
    );
    assert_eq!(filled, 0, "unseen transaction: the stale fill is refused");
}

/// A module loaded while a lease is out: its writes revoke at once (until
/// warden has read its commands' flags, any of its commands naming a leased
/// key counts as a write); its reads revoke nothing once they are known.
#[test]
fn a_module_loaded_while_a_lease_is_out_is_heard() {
    let late = late_module_path().display().to_string();
    let s = Server::start(&["--enable-module-command", "yes"]);
    let mut c = s.conn();
    let (token, waiter) = prepare(&s, &mut c, Before::MissingWithWaiter);
    run(&mut c, &["MODULE", "LOAD", &late]).unwrap();
    run(&mut c, &["LATE.SET", "k", "new"]).unwrap();
    let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "stale"]);
    assert_eq!(filled, 0, "the stale fill is refused");
    match waiter.unwrap().join().unwrap() {
        Value::Array(v) => assert_eq!(v[0], Value::BulkString(b"new".to_vec())),
        other => panic!("{other:?}"),
    }
    run(&mut c, &["DEL", "k"]).unwrap();
    let (token, waiter) = prepare(&s, &mut c, Before::MissingWithWaiter);
    run(&mut c, &["LATE.GET", "k"]).unwrap();
    assert_untouched(&mut c, "a read of the module loaded", token, waiter);
}

/// warden writes and replicates through `SET`, `DEL` and `PEXPIREAT`: a
/// server that renamed one does not load it, and says why. One that renamed
/// `CONFIG` (as hardening guides advise) loads it and still reads its
/// eviction policy.
#[test]
fn renamed_commands_warden_needs_refuse_the_load_and_say_why() {
    for name in [
        "SET",
        "DEL",
        "PEXPIREAT",
        "MULTI",
        "EXEC",
        "DISCARD",
        "RESET",
    ] {
        let mut s = Plain::start_with(
            &["--rename-command", name, "OTHER"],
            &[module(module_path(), &[])],
        );
        assert!(s.exited(), "the server started with {name} renamed");
        let log = s.log();
        assert!(
            log.contains(&format!("does not know {name} under its own name")),
            "{log}"
        );
    }
    let s = Server::start(&[
        "--rename-command",
        "CONFIG",
        "",
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    assert!(s.log().contains("can evict lock keys"), "{}", s.log());
}

/// An error reply that carries a refusal's code but comes from a command
/// that ran (a script's own `NOPERM`, an `EXECABORT` inside a transaction
/// that ran, statistics reset inside one) does not hide the write before
/// it; a command refused with a plain `ERR` (a read-only script's write —
/// not on Redis 7.0, which does not say a command runs inside a script —, a
/// `SET` in RESP2 subscriber mode, an `EXEC` a `WATCH` aborted) revokes
/// nothing.
#[test]
fn only_what_ran_counts_whatever_the_error_codes_say() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let inner_known = knows_sender(&mut c);
    load_writing_function(&mut c, "NOPERM no");
    // (what runs on another connection; it writes k)
    let writes: &[&[&[&str]]] = &[
        &[&[
            "EVAL",
            "redis.call('SET', KEYS[1], 'new'); return redis.error_reply('NOPERM x')",
            "1",
            "k",
        ]],
        &[&[
            "EVAL",
            "redis.call('SET', KEYS[1], 'new'); return redis.error_reply('OOM x')",
            "1",
            "k",
        ]],
        &[&[
            "EVAL",
            "redis.call('SET', KEYS[1], 'new'); return redis.error_reply('NOAUTH x')",
            "1",
            "k",
        ]],
        &[&["FCALL", "w", "1", "k"]],
        &[
            &["MULTI"],
            &["SET", "k", "new"],
            &["EVAL", "return redis.error_reply('EXECABORT x')", "0"],
            &["EXEC"],
        ],
        &[
            &["MULTI"],
            &["SET", "k", "new"],
            &["CONFIG", "RESETSTAT"],
            &["EXEC"],
        ],
    ];
    for (i, commands) in writes.iter().enumerate() {
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("write {i} {commands:?}, {before:?}");
            run(&mut c, &["FLUSHALL"]).unwrap();
            // Something refused on the server before, for RESETSTAT to hide.
            let _ = run(&mut c, &["EXEC"]);
            let (token, waiter) = prepare(&s, &mut c, before);
            let mut w = s.conn();
            for words in commands.iter() {
                let _ = run(&mut w, words);
            }
            let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "stale"]);
            assert_eq!(filled, 0, "{case}: the stale fill is refused");
            if let Some(h) = waiter {
                let _ = h.join();
            }
        }
    }
    // Refused with a plain ERR: nothing ran.
    for before in [Before::MissingWithWaiter, Before::Value] {
        run(&mut c, &["FLUSHALL"]).unwrap();
        let (token, waiter) = prepare(&s, &mut c, before);
        let mut r = s.conn();
        if inner_known {
            // Redis 7.0 cannot tell a script's refused write from a command
            // of its own: the script ran, so the write counts there.
            let script = "return redis.pcall('SET', KEYS[1], 'x')";
            let _ = run(&mut r, &["EVAL_RO", script, "1", "k"]);
            let flagged = "#!lua flags=no-writes\nreturn redis.pcall('SET', KEYS[1], 'x')";
            let _ = run(&mut r, &["EVAL", flagged, "1", "k"]);
        }
        let mut watcher = s.conn();
        run(&mut watcher, &["WATCH", "w2"]).unwrap();
        run(&mut r, &["SET", "w2", "1"]).unwrap();
        run(&mut watcher, &["MULTI"]).unwrap();
        run(&mut watcher, &["DEL", "k"]).unwrap();
        let aborted = run(&mut watcher, &["EXEC"]).unwrap();
        assert_eq!(aborted, Value::Nil, "the EXEC is WATCH-ed out");
        use std::io::{Read, Write};
        let mut raw = std::os::unix::net::UnixStream::connect(s.socket()).unwrap();
        raw.write_all(
            b"*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nx\r\n",
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !String::from_utf8_lossy(&got).contains("-ERR") {
            let n = raw.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert_untouched(
            &mut c,
            &format!("refused with ERR, {before:?}"),
            token,
            waiter,
        );
    }
}

/// A client blocked on a leased key for good does not keep warden listening
/// to the rest of the server once the leases are gone.
#[test]
fn a_client_blocked_for_good_does_not_keep_the_filter() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut holder = s.conn();
    let (_, token) = pair(&mut holder, &["CACHE.GET", "k", "60000"]);
    let token = token.unwrap();
    let mut b = s.conn();
    std::thread::spawn(move || {
        let _ = run(&mut b, &["BLPOP", "k", "0"]);
    });
    wait_for("the client blocked", Duration::from_secs(10), || {
        let info: String = redis::cmd("INFO").arg("clients").query(&mut c).unwrap();
        info.contains("blocked_clients:1")
    });
    run(&mut c, &["PING"]).unwrap();
    int(&mut holder, &["CACHE.FILL", "k", &token.to_string(), "v"]);
    run(&mut c, &["DEL", "k"]).unwrap();
    wait_for("the filter to go", Duration::from_secs(10), || {
        warden_stat(&mut c, "cache_listening") == 0
    });
}

/// A command that runs another inside itself (a module's `RedisModule_Call`
/// before its write) is decided once it has returned, not when the command
/// inside it passes: its write revokes. Redis 7.0 does not say who sent a
/// command, so there the inner command cannot be told from the next client's.
#[test]
fn a_write_around_an_inner_call_revokes() {
    let late = late_module_path().display().to_string();
    let s = Server::start(&["--loadmodule", &late]);
    let mut c = s.conn();
    let inner_known = knows_sender(&mut c);
    for before in [Before::MissingWithWaiter, Before::Value] {
        run(&mut c, &["FLUSHALL"]).unwrap();
        // Learn the command first (its first sight counts as a write).
        let mut holder = s.conn();
        pair(&mut holder, &["CACHE.GET", "warm", "60000"]);
        run(&mut c, &["LATE.CALLSET", "warm", "x"]).unwrap();
        run(&mut c, &["PING"]).unwrap();
        let (token, waiter) = prepare(&s, &mut c, before);
        run(&mut c, &["LATE.CALLSET", "k", "new"]).unwrap();
        let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "stale"]);
        if inner_known {
            assert_eq!(filled, 0, "{before:?}: the stale fill is refused");
        } else {
            println!("version-dependent: Redis 7.0, {before:?}: fill {filled}");
        }
        if let Some(w) = waiter {
            let _ = w.join();
        }
    }
}

/// The default user needs the password `secret`; `admin` authenticates.
fn require_password(admin: &mut Connection) {
    run(
        admin,
        &["ACL", "SETUSER", "default", "resetpass", ">secret"],
    )
    .unwrap();
    run(admin, &["AUTH", "secret"]).unwrap();
}

/// No password any more (`requirepass` too).
fn no_password(admin: &mut Connection) {
    run(admin, &["CONFIG", "SET", "requirepass", ""]).unwrap();
    run(admin, &["ACL", "SETUSER", "default", "nopass"]).unwrap();
}

/// `INFO` sections the cache's command filter has read.
fn reads(c: &mut Connection) -> i64 {
    warden_stat(c, "cache_filter_info_reads")
}

/// A transaction on keys without leases costs the filter nothing while a
/// lease is open elsewhere (where the server says who sends a command); one
/// that writes a leased key still ends its lease.
#[test]
fn a_transaction_on_other_keys_is_not_followed_to_its_exec() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let known = knows_sender(&mut c);
    let (token, _) = prepare(&s, &mut c, Before::Value);
    let mut w = s.conn();
    let before = reads(&mut c);
    for _ in 0..20 {
        for words in [
            &["MULTI"][..],
            &["SET", "x", "1"],
            &["INCR", "y"],
            &["DEL", "z"],
            &["EXEC"],
        ] {
            run(&mut w, words).unwrap();
        }
    }
    let read = reads(&mut c) - before;
    if known {
        assert_eq!(read, 0, "no INFO read for 20 transactions on other keys");
        assert_eq!(lease_of(&mut c, "k"), Some(token), "the lease stays");
    } else {
        println!("floor (Redis 7.0): {read} INFO reads for 20 transactions");
    }
    // A transaction that writes the leased key ends the lease.
    run(&mut c, &["FLUSHALL"]).unwrap();
    let (token, _) = prepare(&s, &mut c, Before::Value);
    for words in [&["MULTI"][..], &["SET", "k", "new"], &["EXEC"]] {
        run(&mut w, words).unwrap();
    }
    let filled = int(&mut c, &["CACHE.FILL", "k", &token.to_string(), "stale"]);
    assert_eq!(filled, 0, "the stale fill is refused");
    // So does a lease granted inside the transaction before its write.
    run(&mut c, &["FLUSHALL"]).unwrap();
    let (_, _) = prepare(&s, &mut c, Before::Value);
    for words in [
        &["MULTI"][..],
        &["CACHE.GET", "fresh", "60000"],
        &["DEL", "fresh"],
        &["EXEC"],
    ] {
        run(&mut w, words).unwrap();
    }
    let token = lease_of(&mut c, "fresh");
    if let Some(t) = token {
        let filled = int(&mut w, &["CACHE.FILL", "fresh", &t.to_string(), "stale"]);
        assert_eq!(filled, 0, "a lease granted before the DEL in its EXEC ends");
    }
}

/// A client known to be unauthenticated is refused before its command runs:
/// after its first refused write of a leased key, no INFO read, nothing
/// revoked (where the server says who sends a command). What authenticates
/// it, or removes the password, ends that: its next write revokes.
#[test]
fn a_known_unauthenticated_client_is_refused_at_no_cost() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let known = knows_sender(&mut admin);
    // (what happens between the refused writes, whether the last DEL runs)
    type Step = fn(&mut Connection, &mut Connection);
    let cases: &[(&str, Step, bool)] = &[
        ("nothing", |_, _| {}, false),
        (
            "a wrong AUTH",
            |r, _| assert!(run(r, &["AUTH", "wrong"]).is_err()),
            false,
        ),
        ("an EXEC", |r, _| assert!(run(r, &["EXEC"]).is_err()), false),
        (
            "AUTH",
            |r, _| {
                run(r, &["AUTH", "secret"]).unwrap();
            },
            true,
        ),
        (
            "HELLO AUTH",
            |r, _| {
                run(r, &["HELLO", "2", "AUTH", "default", "secret"]).unwrap();
            },
            true,
        ),
        (
            "the default user made nopass",
            |_, a| {
                run(a, &["ACL", "SETUSER", "default", "nopass"]).unwrap();
            },
            true,
        ),
    ];
    for (name, between, runs) in cases {
        run(&mut admin, &["FLUSHALL"]).unwrap();
        require_password(&mut admin);
        let (token, _) = prepare(&s, &mut admin, Before::Value);
        let mut r = s.conn();
        // Its first refusal is learnt the slow way.
        assert!(run(&mut r, &["DEL", "k"]).is_err());
        let before = reads(&mut admin);
        for _ in 0..50 {
            assert!(run(&mut r, &["DEL", "k"]).is_err(), "{name}: refused");
            assert!(run(&mut r, &["SET", "k", "x"]).is_err(), "{name}: refused");
        }
        let read = reads(&mut admin) - before;
        if known {
            assert!(
                read <= 2,
                "{name}: {read} INFO reads for 100 refused writes"
            );
        } else {
            println!("floor (Redis 7.0): {read} INFO reads for 100 refused writes");
        }
        between(&mut r, &mut admin);
        let del = run(&mut r, &["DEL", "k"]);
        assert_eq!(del.is_ok(), *runs, "{name}: {del:?}");
        let filled = int(&mut admin, &["CACHE.FILL", "k", &token.to_string(), "v"]);
        assert_eq!(filled, i64::from(!runs), "{name}: the fill after the DEL");
        no_password(&mut admin);
    }
}

/// A client known to be authenticated invalidates leased keys with no INFO
/// read; the ACL is asked each time, so a permission taken away revokes
/// nothing; `RESET` forgets it (and `min-replicas-to-write`, a refusal no
/// module can see coming, sends every write the slow way).
#[test]
fn a_known_client_invalidates_at_no_cost_and_the_acl_still_holds() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let known = knows_sender(&mut admin);
    run(
        &mut admin,
        &["ACL", "SETUSER", "writer", "on", "nopass", "~*", "+@all"],
    )
    .unwrap();
    let mut w = s.conn();
    run(&mut w, &["AUTH", "writer", "any"]).unwrap();
    let mut holder = s.conn();
    let tokens: Vec<i64> = (0..200)
        .map(|i| {
            pair(&mut holder, &["CACHE.GET", &format!("p:{i}"), "60000"])
                .1
                .unwrap()
        })
        .collect();
    run(&mut w, &["DEL", "p:0"]).unwrap();
    let before = reads(&mut admin);
    for i in 1..100 {
        run(&mut w, &["DEL", &format!("p:{i}")]).unwrap();
    }
    let read = reads(&mut admin) - before;
    if known {
        assert_eq!(read, 0, "no INFO read for 99 invalidations");
    } else {
        println!("floor (Redis 7.0): {read} INFO reads for 99 invalidations");
    }
    for (i, t) in tokens.iter().enumerate().take(100) {
        let filled = int(
            &mut holder,
            &["CACHE.FILL", &format!("p:{i}"), &t.to_string(), "v"],
        );
        assert_eq!(filled, 0, "p:{i} was revoked");
    }
    // The permission taken away: refused, nothing revoked.
    run(&mut admin, &["ACL", "SETUSER", "writer", "-del"]).unwrap();
    assert!(run(&mut w, &["DEL", "p:100"]).is_err());
    let filled = int(
        &mut holder,
        &["CACHE.FILL", "p:100", &tokens[100].to_string(), "v"],
    );
    assert_eq!(filled, 1, "a DEL the ACL refuses revokes nothing");
    run(&mut admin, &["ACL", "SETUSER", "writer", "+del"]).unwrap();
    // RESET, then refused: nothing revoked.
    run(&mut admin, &["CONFIG", "SET", "requirepass", "secret"]).unwrap();
    run(&mut w, &["RESET"]).unwrap();
    assert!(run(&mut w, &["DEL", "p:101"]).is_err());
    let filled = int(
        &mut holder,
        &["CACHE.FILL", "p:101", &tokens[101].to_string(), "v"],
    );
    assert_eq!(
        filled, 1,
        "a DEL after RESET is refused and revokes nothing"
    );
    run(&mut admin, &["AUTH", "secret"]).unwrap();
    run(&mut holder, &["AUTH", "secret"]).unwrap();
    run(&mut w, &["AUTH", "writer", "any"]).unwrap();
    run(&mut w, &["DEL", "p:102"]).unwrap();
    // A refusal no module can see coming: the slow way, nothing revoked.
    run(&mut admin, &["CONFIG", "SET", "min-replicas-to-write", "1"]).unwrap();
    assert!(run(&mut w, &["DEL", "p:103"]).is_err());
    run(&mut admin, &["CONFIG", "SET", "min-replicas-to-write", "0"]).unwrap();
    let filled = int(
        &mut holder,
        &["CACHE.FILL", "p:103", &tokens[103].to_string(), "v"],
    );
    assert_eq!(filled, 1, "a DEL refused NOREPLICAS revokes nothing");
    run(&mut admin, &["CONFIG", "SET", "requirepass", ""]).unwrap();
}

/// A RESP2 subscriber's blocking write naming a leased key is refused
/// (`ERR Can't execute`) and revokes nothing, on every server.
#[test]
fn a_subscribers_blocking_write_revokes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for words in [
        &["BLMOVE", "src", "k", "LEFT", "LEFT", "0"][..],
        &["BRPOPLPUSH", "src", "k", "0"],
    ] {
        run(&mut c, &["FLUSHALL"]).unwrap();
        let (_, token) = pair(&mut c, &["CACHE.GET", "k", "60000"]);
        let mut sub = wire::Wire::open(&s.socket()).unwrap();
        sub.send(&[wire::cmd(&["SUBSCRIBE", "ch"])]).unwrap();
        sub.read().unwrap();
        sub.send(&[wire::cmd(words)]).unwrap();
        assert!(sub.read().unwrap().is_error(), "{words:?} is refused");
        let filled = int(
            &mut c,
            &["CACHE.FILL", "k", &token.unwrap().to_string(), "v"],
        );
        assert_eq!(filled, 1, "{words:?}: the fill is stored");
    }
}

/// What lets clients in, queued in a transaction while a client is learnt
/// unauthenticated, is followed at the `EXEC`: that client's write, which
/// the server now runs, revokes.
#[test]
fn a_password_removed_by_a_transaction_lets_the_next_write_revoke() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    for queued in [
        &["ACL", "SETUSER", "default", "nopass"][..],
        &["CONFIG", "SET", "requirepass", ""],
    ] {
        run(&mut admin, &["FLUSHALL"]).unwrap();
        require_password(&mut admin);
        let (token, _) = prepare(&s, &mut admin, Before::Value);
        let mut a = s.conn();
        run(&mut a, &["AUTH", "secret"]).unwrap();
        run(&mut a, &["MULTI"]).unwrap();
        run(&mut a, queued).unwrap();
        let mut b = s.conn();
        assert!(run(&mut b, &["SET", "k", "new1"]).is_err(), "{queued:?}");
        assert!(run(&mut b, &["PING"]).is_err(), "{queued:?}");
        run(&mut a, &["EXEC"]).unwrap();
        if run(&mut b, &["SET", "k", "new2"]).is_ok() {
            let filled = int(
                &mut admin,
                &["CACHE.FILL", "k", &token.to_string(), "stale"],
            );
            assert_eq!(filled, 0, "{queued:?}: the stale fill is refused");
        }
        no_password(&mut admin);
    }
}

/// A write the server postpones (`CLIENT PAUSE WRITE`) from a client known
/// to have written runs after a lease granted while it waited: that lease
/// ends too.
#[test]
fn a_postponed_write_of_a_known_client_revokes_the_lease_granted_meanwhile() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let mut other = s.conn();
    pair(&mut other, &["CACHE.GET", "other", "60000"]);
    let mut w = s.conn();
    let mut l1 = s.conn();
    pair(&mut l1, &["CACHE.GET", "k", "10000"]);
    run(&mut w, &["SET", "k", "w0"]).unwrap();
    run(&mut w, &["PING"]).unwrap();
    run(&mut admin, &["DEL", "k"]).unwrap();
    pair(&mut l1, &["CACHE.GET", "k", "10000"]);
    run(&mut admin, &["CLIENT", "PAUSE", "3000", "WRITE"]).unwrap();
    let mut l2 = s.conn();
    let reader = std::thread::spawn(move || pair(&mut l2, &["CACHE.GET", "k", "10000"]).1);
    std::thread::sleep(Duration::from_millis(200));
    let writer = std::thread::spawn(move || run(&mut w, &["SET", "k", "new"]).unwrap());
    std::thread::sleep(Duration::from_millis(200));
    run(&mut admin, &["CLIENT", "UNPAUSE"]).unwrap();
    let token = reader.join().unwrap();
    writer.join().unwrap();
    if let Some(t) = token {
        let filled = int(&mut admin, &["CACHE.FILL", "k", &t.to_string(), "stale"]);
        assert_eq!(
            filled, 0,
            "the fill of the lease granted before the write ran"
        );
    }
}

/// A client the ACL refuses is learnt once: its next refused writes of a
/// leased key read nothing and revoke nothing; a transaction that queues a
/// script or another of warden's commands reads nothing either.
#[test]
fn refusals_by_the_acl_and_scripts_in_transactions_cost_no_read() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let known = knows_sender(&mut admin);
    let (token, _) = prepare(&s, &mut admin, Before::Value);
    let mut r = other_keys_only(&s, &mut admin);
    assert!(run(&mut r, &["SET", "k", "x"]).is_err());
    let before = reads(&mut admin);
    for _ in 0..30 {
        assert!(run(&mut r, &["SET", "k", "x"]).is_err());
    }
    let mut t = s.conn();
    for queued in [&["EVAL", "return 1", "0"][..], &["BF.ADD", "bf", "x"]] {
        for _ in 0..10 {
            run(&mut t, &["MULTI"]).unwrap();
            run(&mut t, queued).unwrap();
            run(&mut t, &["EXEC"]).unwrap();
        }
    }
    let read = reads(&mut admin) - before;
    if known {
        assert_eq!(read, 0, "{read} INFO reads");
        assert_eq!(lease_of(&mut admin, "k"), Some(token), "the lease stays");
    } else {
        // Redis 7.0: the EXEC that ran BF.ADD revoked every lease.
        println!("floor (Redis 7.0): {read} INFO reads");
    }
    restore(&mut admin);
}

/// `ACL` renamed: the filter still sees it change who must authenticate,
/// and a client learnt unauthenticated before then revokes when its write
/// runs.
#[test]
fn a_renamed_acl_still_lets_the_next_write_revoke() {
    let s = Server::start(&["--rename-command", "ACL", "ACLX"]);
    let mut admin = s.conn();
    run(
        &mut admin,
        &["ACLX", "SETUSER", "default", "resetpass", ">secret"],
    )
    .unwrap();
    run(&mut admin, &["AUTH", "secret"]).unwrap();
    let (token, _) = prepare(&s, &mut admin, Before::Value);
    let mut b = s.conn();
    assert!(run(&mut b, &["SET", "k", "new1"]).is_err());
    assert!(run(&mut b, &["SET", "k", "new1"]).is_err());
    run(&mut admin, &["ACLX", "SETUSER", "default", "nopass"]).unwrap();
    run(&mut b, &["SET", "k", "new2"]).unwrap();
    let filled = int(
        &mut admin,
        &["CACHE.FILL", "k", &token.to_string(), "stale"],
    );
    assert_eq!(filled, 0, "the stale fill is refused");
}

/// Once the server stops counting errors (more than 128 error codes), a
/// refusal tells warden nothing about the client: an unauthenticated
/// client's refused writes still end no lease.
#[test]
fn with_error_counts_off_an_unauthenticated_client_still_revokes_nothing() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    require_password(&mut admin);
    for i in 0..140 {
        let script = format!("return redis.error_reply('E{i} boom')");
        let _ = run(&mut admin, &["EVAL", &script, "0"]);
    }
    let (token, _) = prepare(&s, &mut admin, Before::Value);
    let mut b = s.conn();
    for _ in 0..5 {
        assert!(run(&mut b, &["SET", "k", "new"]).is_err());
        assert!(run(&mut b, &["PING"]).is_err());
    }
    let filled = int(
        &mut admin,
        &["CACHE.FILL", "k", &token.to_string(), "fresh"],
    );
    assert_eq!(filled, 1, "the refused writes ended no lease");
    run(&mut admin, &["ACL", "SETUSER", "default", "nopass"]).unwrap();
}

/// A `BLMOVE` blocked before its destination had a lease writes it when
/// served, without passing the filter again: the lease granted meanwhile
/// ends (Redis 7.2+ and Valkey, which say who sent a command).
#[test]
fn a_move_blocked_before_the_lease_ends_it_when_served() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let known = knows_sender(&mut c);
    pair(&mut c, &["CACHE.GET", "warm", "60000"]);
    let mut b1 = s.conn();
    let mut b2 = s.conn();
    let t1 =
        std::thread::spawn(move || run(&mut b1, &["BLMOVE", "dst", "out", "LEFT", "LEFT", "0"]));
    let t2 =
        std::thread::spawn(move || run(&mut b2, &["BLMOVE", "src", "dst", "LEFT", "LEFT", "0"]));
    wait_for("two blocked clients", Duration::from_secs(10), || {
        info_int(&mut c, "clients", "blocked_clients") == 2
    });
    let token = pair(&mut c, &["CACHE.GET", "dst", "60000"]).1.unwrap();
    run(&mut c, &["RPUSH", "src", "x"]).unwrap();
    t1.join().unwrap().unwrap();
    t2.join().unwrap().unwrap();
    let filled = int(&mut c, &["CACHE.FILL", "dst", &token.to_string(), "stale"]);
    if known {
        assert_eq!(filled, 0, "the fill after the served moves is refused");
    } else {
        println!("Redis 7.0: the served move went unseen (fill {filled})");
    }
}

/// A write that names none of the keys it writes — `DEBUG POPULATE`,
/// `DEBUG RELOAD NOFLUSH`, another module's keyless write command, one of a
/// module loaded while the lease is out — ends every lease once it ran, also
/// inside a transaction: the fill after it is refused (the key `p:0` is one
/// it writes). Refused (`DEBUG` disabled, `NOAUTH`, `NOPERM`, wrong arity),
/// it ends none.
#[test]
fn a_write_warden_cannot_see_ends_every_lease_and_a_refused_one_none() {
    let late = late_module_path().display().to_string();
    // (name, what the server loads, the commands: they run)
    let writes: &[(&str, bool, &[&[&str]])] = &[
        ("DEBUG POPULATE", true, &[&["DEBUG", "POPULATE", "1", "p"]]),
        (
            "DEBUG RELOAD NOFLUSH",
            true,
            &[&["DEBUG", "RELOAD", "NOSAVE", "NOFLUSH", "MERGE"]],
        ),
        (
            "DEBUG POPULATE in MULTI",
            true,
            &[&["MULTI"], &["DEBUG", "POPULATE", "1", "p"], &["EXEC"]],
        ),
        (
            "module keyless write",
            true,
            &[&["LATE.POPULATE", "1", "p"]],
        ),
        (
            "module loaded since",
            false,
            &[&["MODULE", "LOAD", &late], &["LATE.POPULATE", "1", "p"]],
        ),
    ];
    for (name, loaded, commands) in writes {
        let mut args = vec!["--enable-module-command", "yes"];
        if *loaded {
            args.extend(["--loadmodule", &late]);
        }
        for before in [Before::MissingWithWaiter, Before::Value] {
            // A server each: a module loads once.
            let s = Server::start(&args);
            let mut c = s.conn();
            let case = format!("{name}, {before:?}");
            // What DEBUG RELOAD NOFLUSH loads back: p:0 as it was saved.
            run(&mut c, &["SET", "p:0", "saved"]).unwrap();
            run(&mut c, &["SAVE"]).unwrap();
            run(&mut c, &["DEL", "p:0"]).unwrap();
            let (token, waiter) = prepare_on(&s, &mut c, before, "p:0");
            let mut w = s.conn();
            for words in commands.iter() {
                run(&mut w, words).unwrap_or_else(|e| panic!("{case}: {words:?}: {e}"));
            }
            let filled = int(&mut c, &["CACHE.FILL", "p:0", &token.to_string(), "stale"]);
            assert_eq!(filled, 0, "{case}: the fill after it is refused");
            if let Some(waiter) = waiter {
                // Answered: a value, or the lease to load (none stale).
                match waiter.join().unwrap() {
                    Value::Array(v) => {
                        assert_ne!(v[0], Value::BulkString(b"stale".to_vec()), "{case}")
                    }
                    other => panic!("{case}: {other:?}"),
                }
            }
        }
    }
    // (name, server arguments, who sends, what is sent: every one refused)
    type Refusal<'a> = (&'a str, &'a [&'a str], Refuser, &'a [&'a [&'a str]]);
    let no_debug: Refuser = |s, a| user(s, a, &["~*", "+@all", "-debug", "-late.populate"]);
    let refusals: &[Refusal] = &[
        (
            "DEBUG disabled",
            &["--enable-debug-command", "no"],
            same,
            &[&["DEBUG", "POPULATE", "1", "p"]],
        ),
        (
            "NOAUTH",
            &[],
            unauthenticated,
            &[
                &["DEBUG", "POPULATE", "1", "p"],
                &["DEBUG", "RELOAD", "NOSAVE", "NOFLUSH", "MERGE"],
                &["LATE.POPULATE", "1", "p"],
            ],
        ),
        (
            "NOPERM",
            &[],
            no_debug,
            &[
                &["DEBUG", "POPULATE", "1", "p"],
                &["LATE.POPULATE", "1", "p"],
            ],
        ),
        ("wrong arity", &[], same, &[&["DEBUG"]]),
    ];
    for (name, extra, refuser, commands) in refusals {
        let mut args = vec!["--loadmodule", &late];
        args.extend_from_slice(extra);
        let s = Server::start(&args);
        let mut admin = s.conn();
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("{name}, {before:?}");
            run(&mut admin, &["FLUSHALL"]).unwrap();
            let (token, waiter) = prepare_on(&s, &mut admin, before, "p:0");
            let revoked = warden_stat(&mut admin, "cache_revoked");
            let mut r = refuser(&s, &mut admin);
            for words in commands.iter() {
                assert!(run(&mut r, words).is_err(), "{case}: {words:?} is refused");
            }
            restore(&mut admin);
            assert_untouched_on(&mut admin, &case, "p:0", token, waiter);
            assert_eq!(
                warden_stat(&mut admin, "cache_revoked"),
                revoked,
                "{case}: nothing revoked"
            );
        }
    }
}

/// An unauthenticated client sending `EXEC`, `DEL` or `SET` of a leased key,
/// pipelined: every one is refused, no lease ends, and deciding so costs at
/// most one `INFO` read a command — on Redis 7.0, which does not say who
/// sent a command, an `EXEC` is told refused from the count of commands run
/// alone (`INFO stats`), its write counts not read again; elsewhere the
/// client is known unauthenticated after its first refusal and costs none.
#[test]
fn an_unauthenticated_pipeline_ends_no_lease_at_one_read_a_command_at_most() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let known = knows_sender(&mut admin);
    let n = 50;
    let cases: &[(&str, &[&str])] = &[
        ("EXEC", &["EXEC"]),
        ("DEL", &["DEL", "k"]),
        ("SET", &["SET", "k", "x"]),
    ];
    for (name, words) in cases {
        for before in [Before::MissingWithWaiter, Before::Value] {
            let case = format!("{name}, {before:?}");
            run(&mut admin, &["FLUSHALL"]).unwrap();
            let (token, waiter) = prepare(&s, &mut admin, before);
            require_password(&mut admin);
            let revoked = warden_stat(&mut admin, "cache_revoked");
            let (reads0, short0) = (reads(&mut admin), short(&mut admin));
            let mut r = s.conn();
            let mut p = redis::pipe();
            for _ in 0..n {
                p.cmd(words[0]).arg(&words[1..]);
            }
            let got =
                redis::ConnectionLike::req_packed_commands(&mut r, &p.get_packed_pipeline(), 0, n);
            match got {
                Err(e) => assert!(error_text(&e).contains("NOAUTH"), "{case}: {e:?}"),
                Ok(v) => assert!(
                    v.iter().all(|r| matches!(r, Value::ServerError(e)
                        if format!("{e:?}").contains("NOAUTH"))),
                    "{case}: not refused: {v:?}"
                ),
            }
            // One more request: the last one of the pipeline is decided.
            assert!(run(&mut r, &["PING"]).is_err(), "{case}");
            let read = reads(&mut admin) - reads0;
            let nothing_ran = short(&mut admin) - short0;
            if known {
                assert!(read <= 4, "{case}: {read} INFO reads for {n} refusals");
            } else {
                assert!(
                    read <= n as i64 + 4,
                    "{case}: {read} INFO reads for {n} refusals (one each at most)"
                );
                if *name == "EXEC" {
                    assert!(nothing_ran >= n as i64 - 1, "{case}: {nothing_ran}");
                }
            }
            no_password(&mut admin);
            assert_eq!(
                warden_stat(&mut admin, "cache_revoked"),
                revoked,
                "{case}: nothing revoked"
            );
            assert_untouched(&mut admin, &case, token, waiter);
        }
    }
}

/// Transactions the filter found had not run from the count of commands
/// alone (0 where the module does not count them).
fn short(c: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("warden").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("warden_cache_filter_nothing_ran:"))
        .map_or(0, |v| v.trim().parse().unwrap())
}
