//! The server never dies and nothing acknowledged is lost: memory limits,
//! hostile inputs, faults.

mod common;

use common::*;
use redis::Value;

#[test]
fn at_maxmemory_acquires_and_bloom_writes_answer_oom_while_releases_still_work() {
    let s = Server::start(&["--maxmemory-policy", "noeviction"]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "held", "a", "60000"]);
    run(&mut c, &["RWLOCK.READ", "rw", "a", "60000"]).unwrap();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    let used: String = redis::cmd("INFO").arg("memory").query(&mut c).unwrap();
    let used: i64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    run(
        &mut c,
        &["CONFIG", "SET", "maxmemory", &(used / 2).to_string()],
    )
    .unwrap();
    for words in [
        &["LOCK.ACQUIRE", "new", "a", "1000"][..],
        &["RWLOCK.READ", "rw2", "a", "1000"],
        &["RWLOCK.WRITE", "rw3", "a", "1000"],
        &["BF.ADD", "bf", "y"],
        &["BF.MADD", "bf", "y", "z"],
        &["BF.INSERT", "bf", "ITEMS", "y"],
        &["BF.RESERVE", "bf2", "0.01", "100"],
    ] {
        assert!(err(&mut c, words).starts_with("OOM"), "{words:?}");
    }
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "held", "a", "90000"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.EXTEND", "rw", "a", "90000"]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "held", "a"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", "rw", "a"]), 1);
    assert_eq!(int(&mut c, &["BF.EXISTS", "bf", "x"]), 1);
    run(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    assert!(int(&mut c, &["LOCK.ACQUIRE", "new", "a", "1000"]) > 0);
}

#[test]
fn a_killed_holders_lease_ends_and_a_waiter_gets_a_higher_fence() {
    let s = Server::start(&[]);
    let mut holder = s.conn();
    let mut c = s.conn();
    let first = int(&mut holder, &["LOCK.ACQUIRE", "k", "crashed", "300"]);
    let id = int(&mut holder, &["CLIENT", "ID"]);
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "next", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    let fence = granted(w);
    assert!(fence > first);
}

#[test]
fn waiters_survive_flush_rename_move_and_swapdb_and_nobody_hangs() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // RENAME: the lock moves away, so the old name is free for the waiter.
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    run(&mut c, &["RENAME", "k", "k2"]).unwrap();
    granted(w);
    // MOVE to another database frees the name here too.
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "c", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    assert_eq!(int(&mut c, &["MOVE", "k", "1"]), 1);
    granted(w);
    // SWAPDB brings in another database's keys: waiters are served by what is there now.
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "d", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    run(&mut c, &["SELECT", "2"]).unwrap();
    run(&mut c, &["SWAPDB", "0", "2"]).unwrap();
    granted(w);
    // FLUSHDB of the waiter's database.
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "e", "60000", "WAIT", "0"]);
    run(&mut c, &["SELECT", "0"]).unwrap();
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    run(&mut c, &["FLUSHDB"]).unwrap();
    granted(w);
    let info: String = redis::cmd("INFO").arg("warden").query(&mut c).unwrap();
    assert!(info.contains("waiting_clients:0"), "{info}");
}

#[test]
fn waiters_of_a_restarting_server_get_an_error_not_a_hang() {
    let mut s = Server::start(&["--appendonly", "yes"]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "60000"]);
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "k", 1);
    s.restart(false);
    assert!(
        w.join().unwrap().is_err(),
        "the connection ends with the server"
    );
    let mut c = s.conn();
    let f = map(&mut c, &["LOCK.INFO", "k"]);
    assert_eq!(field_str(&f, "owner"), "a");
    assert_eq!(field_int(&f, "waiters"), 0);
}

#[test]
fn acknowledged_writes_survive_sigkill_with_appendfsync_always() {
    let mut s = Server::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = s.conn();
    let mut fences = Vec::new();
    for i in 0..200 {
        fences.push(int(
            &mut c,
            &["LOCK.ACQUIRE", &format!("lock:{i}"), "a", "600000"],
        ));
        if i % 2 == 0 {
            assert_eq!(int(&mut c, &["LOCK.RELEASE", &format!("lock:{i}"), "a"]), 1);
        }
        run(&mut c, &["BF.ADD", "seen", &format!("item:{i}")]).unwrap();
        run(
            &mut c,
            &[
                "RWLOCK.READ",
                &format!("rw:{}", i % 10),
                &format!("r{i}"),
                "600000",
            ],
        )
        .unwrap();
    }
    s.restart(false); // SIGKILL, then start again on the same files
    let mut c = s.conn();
    for i in 0..200 {
        let held = !is_nil(&mut c, &["LOCK.INFO", &format!("lock:{i}")]);
        assert_eq!(held, i % 2 == 1, "lock:{i}");
        assert_eq!(int(&mut c, &["BF.EXISTS", "seen", &format!("item:{i}")]), 1);
    }
    assert_eq!(int(&mut c, &["BF.CARD", "seen"]), 200);
    for i in 0..10 {
        assert_eq!(
            field_int(
                &map(&mut c, &["RWLOCK.INFO", &format!("rw:{i}")]),
                "readers"
            ),
            20
        );
    }
    assert!(int(&mut c, &["LOCK.ACQUIRE", "after", "z", "1000"]) > *fences.iter().max().unwrap());
}

/// Deterministic pseudo-random numbers (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn word(&mut self) -> Vec<u8> {
        let pool: [&[u8]; 16] = [
            b"WAIT",
            b"0",
            b"-1",
            b"1",
            b"100",
            b"99999999999999999999",
            b"",
            b"ITEMS",
            b"NONSCALING",
            b"EXPANSION",
            b"CAPACITY",
            b"ERROR",
            b"NOCREATE",
            b"0.01",
            b"nan",
            b"1e308",
        ];
        match self.next() % 4 {
            0 => pool[(self.next() % 16) as usize].to_vec(),
            1 => (0..self.next() % 40).map(|_| self.next() as u8).collect(),
            2 => self.next().to_string().into_bytes(),
            _ => format!("k{}", self.next() % 4).into_bytes(),
        }
    }
}

#[test]
fn thousands_of_random_argument_vectors_never_hurt_the_server() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let commands = [
        "LOCK.ACQUIRE",
        "LOCK.RELEASE",
        "LOCK.EXTEND",
        "LOCK.INFO",
        "RWLOCK.READ",
        "RWLOCK.WRITE",
        "RWLOCK.UNLOCK",
        "RWLOCK.EXTEND",
        "RWLOCK.INFO",
        "BF.RESERVE",
        "BF.ADD",
        "BF.MADD",
        "BF.INSERT",
        "BF.EXISTS",
        "BF.MEXISTS",
        "BF.INFO",
        "BF.CARD",
        "BF.SCANDUMP",
        "BF.LOADCHUNK",
        "WARDEN.LOCKSET",
        "WARDEN.RWSET",
        "WARDEN.RWHOLD",
    ];
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let start_memory = used_memory(&mut c);
    for round in 0..6000 {
        let name = commands[round % commands.len()];
        let words: Vec<Vec<u8>> = (0..rng.next() % 9).map(|_| rng.word()).collect();
        // A WAIT with a random timeout would block this connection: none here.
        if words.iter().any(|w| w.eq_ignore_ascii_case(b"WAIT")) {
            continue;
        }
        let mut cmd = redis::cmd(name);
        for w in &words {
            cmd.arg(&w[..]);
        }
        let _ = cmd.query::<Value>(&mut c);
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    run(&mut c, &["FLUSHALL"]).unwrap();
    assert!(
        used_memory(&mut c) < start_memory + (8 << 20),
        "memory stayed bounded"
    );
}

#[test]
fn restore_payloads_with_valid_checksums_but_hostile_bytes_are_refused() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "lock", "owner", "60000"]);
    run(&mut c, &["RWLOCK.READ", "rw", "r1", "60000"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "rw", "r2", "60000"]).unwrap();
    run(
        &mut c,
        &["BF.RESERVE", "bf", "0.01", "64", "EXPANSION", "2"],
    )
    .unwrap();
    for i in 0..150 {
        run(&mut c, &["BF.ADD", "bf", &i.to_string()]).unwrap();
    }
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for key in ["lock", "rw", "bf"] {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut c).unwrap();
        // our own checksum matches Redis': the unchanged payload restores
        let same = resign(&dump, dump[..dump.len() - 10].to_vec());
        assert_eq!(same, dump);
        let body = &dump[..dump.len() - 10];
        let mut refused = 0;
        for round in 0..1500 {
            let mut bad = body.to_vec();
            match round % 3 {
                0 => {
                    let i = (rng.next() as usize) % bad.len();
                    bad[i] = rng.next() as u8;
                }
                1 => bad.truncate((rng.next() as usize) % bad.len()),
                _ => {
                    let i = (rng.next() as usize) % bad.len();
                    bad[i] ^= 1 << (rng.next() % 8);
                    let j = (rng.next() as usize) % bad.len();
                    bad[j] = 0xff;
                }
            }
            let payload = resign(&dump, bad);
            match redis::cmd("RESTORE")
                .arg("t")
                .arg(0)
                .arg(&payload)
                .arg("REPLACE")
                .query::<Value>(&mut c)
            {
                Err(_) => refused += 1,
                Ok(_) => {
                    // accepted: it must be a usable value of its type
                    let _ = run(&mut c, &["LOCK.INFO", "t"]);
                    let _ = run(&mut c, &["RWLOCK.INFO", "t"]);
                    let _ = run(&mut c, &["BF.ADD", "t", "probe"]);
                    let _ = run(&mut c, &["BF.INFO", "t"]);
                }
            }
        }
        assert!(
            refused > 500,
            "{key}: hostile payloads were refused ({refused})"
        );
        run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

/// The fence check a protected store runs: refuse tokens not above the last one.
const STORE_WRITE: &str =
    "if tonumber(ARGV[1]) <= tonumber(redis.call('get', KEYS[1]) or '0') then return 0 end \
     redis.call('set', KEYS[1], ARGV[1]) redis.call('set', KEYS[2], ARGV[2]) return 1";

#[test]
fn a_holder_paused_past_its_lease_is_fenced_off() {
    let s = Server::start(&[]);
    let python = std::env::var("WARDEN_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python")
        });
    // The holder: takes the lock, reports its token, then (once resumed) writes.
    let holder = format!(
        r#"
import sys, redis
r = redis.Redis(unix_socket_path={socket:?})
fence = r.execute_command("LOCK.ACQUIRE", "lock:job", "paused-holder", 200)
print(fence, flush=True)
sys.stdin.readline()
print(r.eval({script:?}, 2, "store:fence", "store:value", fence, "late write"), flush=True)
"#,
        socket = s.socket().display().to_string(),
        script = STORE_WRITE
    );
    let mut child = std::process::Command::new(python)
        .arg("-c")
        .arg(holder)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python holder");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let old_fence: i64 = line.trim().parse().unwrap();
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    // Its lease ends while it is paused; the next holder gets a higher token and writes.
    let mut c = s.conn();
    let (_, next) = spawn_command(
        &s,
        &[
            "LOCK.ACQUIRE",
            "lock:job",
            "next-holder",
            "60000",
            "WAIT",
            "0",
        ],
    );
    let fence = granted(next);
    assert!(fence > old_fence);
    let wrote: i64 = redis::cmd("EVAL")
        .arg(STORE_WRITE)
        .arg(2)
        .arg("store:fence")
        .arg("store:value")
        .arg(fence)
        .arg("fresh write")
        .query(&mut c)
        .unwrap();
    assert_eq!(wrote, 1);
    // Resumed, the paused holder writes with its old token: refused.
    assert!(std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "0", "the late write was refused");
    assert!(child.wait().unwrap().success());
    let value: String = redis::cmd("GET").arg("store:value").query(&mut c).unwrap();
    assert_eq!(value, "fresh write");
}
