//! Real redis-server processes with the freshly built module, one per test.
#![allow(dead_code)]

pub mod wire;

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

/// The module the tests load: `WARDEN_MODULE`, or the `.so` cargo built beside the test binary.
pub fn module_path() -> PathBuf {
    if let Ok(path) = std::env::var("WARDEN_MODULE") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().expect("profile dir")] {
        let candidate = dir.join("libwarden.so");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("libwarden.so not found near {}", exe.display());
}

/// The test module `LATE` (`tests/modules/late_module.rs`, built by cargo as
/// an example beside the test binaries): loaded after warden.
pub fn late_module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let path = profile.join("examples").join("liblate_module.so");
    assert!(path.exists(), "{} is built by cargo test", path.display());
    path
}

/// With `WARDEN_VALGRIND_DIR` set, servers run under valgrind (memcheck) and
/// their reports are copied there (`make valgrind`).
fn valgrind_dir() -> Option<PathBuf> {
    std::env::var("WARDEN_VALGRIND_DIR").ok().map(PathBuf::from)
}

/// The server binary the tests start: `WARDEN_SERVER` (`make test SERVER=valkey`
/// sets it to Valkey's), or `redis-server` from `PATH`.
pub fn server_binary() -> String {
    std::env::var("WARDEN_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// Whether the tests run against Valkey rather than Redis.
pub fn is_valkey() -> bool {
    server_binary().contains("valkey")
}

/// Whether `CLIENT UNBLOCK` ends a warden wait on this server: only where
/// Redis' timeout path cannot drop an answer already handed over (Redis 7.4+,
/// Valkey 8+); elsewhere it answers 0 and the waiter keeps waiting.
pub fn unblock_ends_wait(c: &mut Connection) -> bool {
    let ends = match info_version(c, "valkey_version:") {
        Some(v) => v >= (8, 0),
        None => info_version(c, "redis_version:").is_some_and(|v| v >= (7, 4)),
    };
    println!(
        "version-dependent: {} {:?}: CLIENT UNBLOCK {}",
        if is_valkey() { "Valkey" } else { "Redis" },
        info_version(c, "valkey_version:").unwrap_or_else(|| server_version(c)),
        if ends {
            "ends a wait (the >= 7.4 path)"
        } else {
            "answers 0, the wait goes on (the 7.0-7.2 path)"
        }
    );
    ends
}

fn info_version(c: &mut Connection, field: &str) -> Option<(u32, u32)> {
    let info: String = redis::cmd("INFO").arg("server").query(c).unwrap();
    info.lines().find_map(|l| l.strip_prefix(field)).map(|v| {
        let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    })
}

/// The Redis version the server reports (Valkey reports the Redis version it
/// is compatible with, 7.2).
pub fn server_version(c: &mut Connection) -> (u32, u32) {
    info_version(c, "redis_version:").unwrap_or((0, 0))
}

fn server_command() -> Command {
    match valgrind_dir() {
        None => Command::new(server_binary()),
        Some(_) => {
            let mut c = Command::new("valgrind");
            c.args([
                "--leak-check=full",
                "--show-leak-kinds=definite",
                "--error-exitcode=0",
                "--log-file=valgrind.%p.log",
            ]);
            c.arg(concat!(
                "--suppressions=",
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/valgrind.supp"
            ));
            c.arg(server_binary());
            c
        }
    }
}

/// A free TCP port on 127.0.0.1 (for replication, which needs TCP); from the
/// range `WARDEN_TEST_PORTS` (`7500-7599`) when set, else any.
pub fn free_port() -> u16 {
    if let Some((low, high)) = std::env::var("WARDEN_TEST_PORTS")
        .ok()
        .and_then(|r| r.split_once('-').map(|(a, b)| (a.parse(), b.parse())))
        .and_then(|(a, b)| Some((a.ok()?, b.ok()?)))
    {
        return port_in(low, high);
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The next port of `low..=high` that nothing listens on (each handed out once per run).
fn port_in(low: u16, high: u16) -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    for _ in low..=high {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % (high - low + 1);
        let port = low + offset;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}-{high}");
}

/// Waits for `cond` to hold, up to `limit`; panics with `what` otherwise.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The settings of `redis.conf.example` as `make run GRACE=0` gives them to
/// the server (`--warden.grace 0` last), but for the harness's own port,
/// address and directory: the server every page of the docs runs on.
pub fn make_run_args() -> Vec<&'static str> {
    let config = include_str!("../../redis.conf.example");
    let mut args = Vec::new();
    for line in config.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once(' ').unwrap_or((line, ""));
        if !["port", "bind", "dir", "protected-mode", "loadmodule"].contains(&name) {
            args.push(&*format!("--{name}").leak());
            args.push(value.trim());
        }
    }
    args.extend(["--warden.grace", "0"]);
    args
}

pub struct Server {
    pub dir: tempfile::TempDir,
    pub port: Option<u16>,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// A server on a unix socket with the module loaded and `extra` config arguments.
    pub fn start(extra: &[&str]) -> Self {
        Self::launch(None, extra)
    }

    /// A server that also listens on a TCP port (replication). A port found
    /// free can be taken before the server binds it (another test's outgoing
    /// connection draws it from the same ephemeral range): then another port.
    pub fn start_tcp(extra: &[&str]) -> Self {
        for _ in 0..4 {
            let mut server = Self::prepare(Some(free_port()), extra);
            match server.try_spawn() {
                Ok(()) => return server,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("redis-server exited:\n{log}"),
            }
        }
        Self::launch(Some(free_port()), extra)
    }

    pub fn launch(port: Option<u16>, extra: &[&str]) -> Self {
        let mut server = Self::prepare(port, extra);
        server.spawn();
        server
    }

    fn prepare(port: Option<u16>, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.unwrap_or(0).to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--unixsocket".into(),
            dir.path().join("redis.sock").display().to_string(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--logfile".into(),
            dir.path().join("redis.log").display().to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--loadmodule".into(),
            module_path().display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self {
            dir,
            port,
            args,
            child: None,
        }
    }

    fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("redis-server exited:\n{log}");
        }
    }

    /// Starts the process and waits until it answers; `Err(log)` if it exited.
    fn try_spawn(&mut self) -> Result<(), String> {
        let child = server_command()
            .current_dir(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): make test installs it",
                    server_binary()
                )
            });
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("({status}) {}", self.log()));
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "redis-server not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server process has exited (crashed, or stopped).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    fn try_conn(&self) -> redis::RedisResult<Connection> {
        redis::Client::open(format!("redis+unix://{}", self.socket().display()))?.get_connection()
    }

    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect")
    }

    /// A connection speaking RESP3.
    pub fn conn3(&self) -> Connection {
        redis::Client::open(format!(
            "redis+unix://{}?protocol=resp3",
            self.socket().display()
        ))
        .and_then(|c| c.get_connection())
        .expect("connect resp3")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// Stops the server: `SHUTDOWN` (saving as configured) or a kill.
    pub fn stop(&mut self, graceful: bool) {
        if let Some(mut child) = self.child.take() {
            if graceful {
                if let Ok(mut c) = self.try_conn() {
                    let _ = redis::cmd("SHUTDOWN").query::<redis::Value>(&mut c);
                }
            } else {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    /// Stops and starts again in the same directory, with extra arguments replaced.
    pub fn restart(&mut self, graceful: bool) {
        self.stop(graceful);
        self.spawn();
    }

    /// Starts again (after a stop) with more arguments, kept for later restarts.
    pub fn start_again_with(&mut self, extra: &[&str]) {
        self.stop(false);
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.spawn();
    }

    /// Sends a signal to the server process (`STOP`, `CONT`, ...).
    pub fn signal(&self, name: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(pid.to_string())
                .status()
                .expect("kill");
            assert!(status.success(), "kill -{name} {pid}");
        }
    }

    /// A TCP connection (as a client elsewhere would connect).
    pub fn tcp(&self) -> Connection {
        tcp_conn(self.port.expect("a TCP port"))
    }
}

/// A connection to 127.0.0.1:`port`, with short timeouts and no retries.
pub fn tcp_conn(port: u16) -> Connection {
    try_tcp_conn(port).expect("tcp connect")
}

pub fn try_tcp_conn(port: u16) -> redis::RedisResult<Connection> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let c = client.get_connection_with_timeout(Duration::from_millis(500))?;
    c.set_read_timeout(Some(Duration::from_secs(30)))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(c)
}

/// A Sentinel (`<server> sentinel.conf --sentinel`) watching `master` as `name`.
pub struct Sentinel {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl Sentinel {
    /// Quorum `quorum`; the master is down after `down_after_ms` without an answer.
    pub fn start(name: &str, master: &Server, quorum: usize, down_after_ms: u64) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {name} 127.0.0.1 {master} {quorum}\n\
             sentinel down-after-milliseconds {name} {down_after_ms}\n\
             sentinel failover-timeout {name} 3000\n\
             sentinel parallel-syncs {name} 2\n",
            dir = dir.path().display(),
            master = master.port.expect("a TCP master"),
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(server_binary())
            .current_dir(dir.path())
            .arg(&path)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sentinel");
        let sentinel = Self { dir, port, child };
        wait_for("sentinel up", Duration::from_secs(20), || {
            try_tcp_conn(port)
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
        sentinel
    }

    pub fn conn(&self) -> Connection {
        tcp_conn(self.port)
    }

    /// The port of the master this Sentinel names for `name`.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let mut c = try_tcp_conn(self.port).ok()?;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query(&mut c)
            .ok()?;
        addr?.1.parse().ok()
    }

    /// A field of `SENTINEL MASTER name`.
    pub fn master_field(&self, name: &str, field: &str) -> Option<String> {
        let mut c = try_tcp_conn(self.port).ok()?;
        let fields: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query(&mut c)
            .ok()?;
        fields
            .chunks(2)
            .find(|kv| kv[0] == field)
            .map(|kv| kv[1].clone())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!("---- sentinel {} log (last lines) ----", self.port);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Starts `n` Sentinels on `master` (quorum a majority) and waits until each
/// knows the others and `replicas` replicas.
pub fn sentinels(name: &str, master: &Server, n: usize, replicas: usize) -> Vec<Sentinel> {
    sentinels_down_after(name, master, n, replicas, 500)
}

/// Like [`sentinels`], the master being down after `down_after_ms` without an answer.
pub fn sentinels_down_after(
    name: &str,
    master: &Server,
    n: usize,
    replicas: usize,
    down_after_ms: u64,
) -> Vec<Sentinel> {
    let all: Vec<Sentinel> = (0..n)
        .map(|_| Sentinel::start(name, master, n / 2 + 1, down_after_ms))
        .collect();
    for s in &all {
        wait_for("sentinels to meet", Duration::from_secs(30), || {
            s.master_field(name, "num-other-sentinels") == Some((n - 1).to_string())
                && s.master_field(name, "num-slaves") == Some(replicas.to_string())
        });
    }
    all
}

impl Drop for Server {
    fn drop(&mut self) {
        if valgrind_dir().is_some() && !std::thread::panicking() {
            // A clean exit, so that valgrind writes its leak report.
            self.stop(true);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = valgrind_dir() {
            for entry in std::fs::read_dir(self.dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with("valgrind.") {
                    let server = self
                        .dir
                        .path()
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .trim_start_matches('.')
                        .to_string();
                    let _ = std::fs::copy(entry.path(), dir.join(format!("{server}-{name}")));
                }
            }
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let mut err = std::io::stderr();
            let _ = writeln!(err, "---- redis-server log (last lines) ----");
            for line in tail.iter().rev() {
                let _ = writeln!(err, "{line}");
            }
        }
    }
}

/// Runs a command given as words and returns the raw reply (errors included).
pub fn run(con: &mut Connection, words: &[&str]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(words[0]);
    for w in &words[1..] {
        cmd.arg(*w);
    }
    cmd.query(con)
}

/// Like `run`, returning the error text (code included), or panicking on success.
pub fn err(con: &mut Connection, words: &[&str]) -> String {
    match run(con, words) {
        Err(e) => error_text(&e),
        Ok(v) => panic!("{words:?} should fail, got {v:?}"),
    }
}

/// The full error line as the server sent it: `CODE message`.
pub fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

pub fn int(con: &mut Connection, words: &[&str]) -> i64 {
    match run(con, words) {
        Ok(Value::Int(n)) => n,
        other => panic!("{words:?}: expected an integer, got {other:?}"),
    }
}

pub fn is_nil(con: &mut Connection, words: &[&str]) -> bool {
    match run(con, words) {
        Ok(Value::Nil) => true,
        Ok(_) => false,
        Err(e) => panic!("{words:?}: {e}"),
    }
}

/// A map reply (RESP2 flat array or RESP3 map) as name → value pairs.
pub fn map(con: &mut Connection, words: &[&str]) -> Vec<(String, Value)> {
    maybe_map(con, words).unwrap_or_else(|| panic!("{words:?}: expected a map, got nil"))
}

/// A map reply, or `None` for nil — in one round trip, so that nothing can
/// change between asking whether it exists and reading it.
pub fn maybe_map(con: &mut Connection, words: &[&str]) -> Option<Vec<(String, Value)>> {
    Some(match run(con, words) {
        Ok(Value::Nil) => return None,
        Ok(Value::Map(pairs)) => pairs
            .into_iter()
            .map(|(k, v)| (reply_text(&k), v))
            .collect(),
        Ok(Value::Array(items)) => items
            .chunks(2)
            .map(|kv| (reply_text(&kv[0]), kv[1].clone()))
            .collect(),
        other => panic!("{words:?}: expected a map, got {other:?}"),
    })
}

/// One field of a map reply as an integer.
pub fn field_int(fields: &[(String, Value)], name: &str) -> i64 {
    let (_, v) = fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name}"));
    match v {
        Value::Int(n) => *n,
        other => reply_text(other)
            .parse()
            .unwrap_or_else(|_| panic!("{name}: not an integer: {other:?}")),
    }
}

/// A string reply's text. (Written out rather than `from_redis_value`, whose
/// signature differs between redis-rs 0.27, used here, and 1.x, used by
/// warden-client's tests, which share this file.)
pub fn reply_text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Int(n) => n.to_string(),
        other => panic!("not a string: {other:?}"),
    }
}

pub fn field_str(fields: &[(String, Value)], name: &str) -> String {
    let (_, v) = fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name}"));
    reply_text(v)
}

/// Makes `replica` a replica of `master` and waits until the link is up and synced.
pub fn replicate(master: &Server, replica: &Server) {
    let mut r = replica.conn();
    run(
        &mut r,
        &["REPLICAOF", "127.0.0.1", &master.port.unwrap().to_string()],
    )
    .unwrap();
    wait_for("replica link", Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut r).unwrap();
        info.contains("master_link_status:up")
    });
}

/// Waits until the master's writes so far reached `n` replicas.
pub fn sync_replicas(master: &mut Connection, n: i64) {
    let acked: i64 = redis::cmd("WAIT").arg(n).arg(5000).query(master).unwrap();
    assert_eq!(acked, n, "replicas did not acknowledge");
}

/// A reply still to come from a command blocked on its own connection.
pub type Pending = std::thread::JoinHandle<redis::RedisResult<Value>>;

/// Sends `words` on a fresh connection from a thread; returns that client's id
/// and the pending reply.
pub fn spawn_command(s: &Server, words: &[&str]) -> (i64, Pending) {
    let mut c = s.conn();
    let id = int(&mut c, &["CLIENT", "ID"]);
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    let handle = std::thread::spawn(move || {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        run(&mut c, &words)
    });
    (id, handle)
}

/// The fence a pending blocked request was granted.
pub fn granted(h: Pending) -> i64 {
    match h.join().unwrap() {
        Ok(Value::Int(f)) => f,
        other => panic!("expected a fence, got {other:?}"),
    }
}

/// The `waiters` field of `<KIND>.INFO key` (0 when the key holds no lock).
pub fn waiters_of(c: &mut Connection, info_cmd: &str, key: &str) -> i64 {
    maybe_map(c, &[info_cmd, key]).map_or(0, |f| field_int(&f, "waiters"))
}

/// Waits until `n` clients are queued on `key`.
pub fn wait_queued(c: &mut Connection, info_cmd: &str, key: &str, n: i64) {
    wait_for(
        &format!("{n} waiters on {key}"),
        Duration::from_secs(10),
        || waiters_of(c, info_cmd, key) == n,
    );
}

/// A TCP port `p` with `p + 10000` free too (the cluster bus).
pub fn free_cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p < 55000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

/// A local Redis Cluster: `masters` masters with `replicas` replicas each,
/// created with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(masters: usize, replicas: usize) -> Self {
        let nodes: Vec<Server> = (0..masters * (1 + replicas))
            .map(|_| {
                Server::launch(
                    Some(free_cluster_port()),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port.unwrap()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and agrees on the slots.
    pub fn wait_ok(&self) {
        for n in &self.nodes {
            let mut c = n.conn();
            wait_for("cluster_state:ok", Duration::from_secs(30), || {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
                info.contains("cluster_state:ok")
            });
        }
        let mut check = Command::new("redis-cli");
        wait_for("cluster check", Duration::from_secs(30), || {
            check
                .args([
                    "--cluster",
                    "check",
                    &format!("127.0.0.1:{}", self.nodes[0].port.unwrap()),
                ])
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout).contains("[OK] All 16384 slots covered")
                })
                .unwrap_or(false)
        });
    }

    pub fn client(&self) -> redis::cluster::ClusterClient {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port.unwrap()))
            .collect();
        redis::cluster::ClusterClient::new(urls).expect("cluster client")
    }

    /// The node serving `key` as master now.
    pub fn master_of(&self, key: &str) -> &Server {
        let mut c = self.nodes[0].conn();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .unwrap();
        self.nodes
            .iter()
            .find(|n| is_master(n) && self.owns(n, slot))
            .expect("a master for the slot")
    }

    /// Whether `node` is the master of `slot` according to itself.
    fn owns(&self, node: &Server, slot: i64) -> bool {
        let mut c = node.conn();
        let myid: String = redis::cmd("CLUSTER").arg("MYID").query(&mut c).unwrap();
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
        nodes.lines().filter(|l| l.starts_with(&myid)).any(|l| {
            l.split_whitespace()
                .skip(8)
                .any(|range| match range.split_once('-') {
                    Some((a, b)) => {
                        a.parse::<i64>().is_ok_and(|a| a <= slot)
                            && b.parse::<i64>().is_ok_and(|b| slot <= b)
                    }
                    None => range.parse::<i64>() == Ok(slot),
                })
        })
    }

    /// Some master that does not serve `key`.
    pub fn other_master(&self, key: &str) -> &Server {
        let owner = self.master_of(key).port;
        self.nodes
            .iter()
            .find(|n| is_master(n) && n.port != owner)
            .unwrap()
    }
}

pub fn is_master(node: &Server) -> bool {
    let role: Vec<Value> = redis::cmd("ROLE").query(&mut node.conn()).unwrap();
    matches!(&role[0], Value::BulkString(b) if b == b"master")
}

pub fn node_id(node: &Server) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut node.conn())
        .unwrap()
}

/// The Python with redis-py that `make test` installs into `.venv`.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("WARDEN_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no Python venv with redis-py: run `make test`, which creates .venv"
    );
    venv
}

/// `used_memory` from INFO.
pub fn used_memory(c: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// (owner, holds, fence) of an exclusive lock, or None.
pub fn lock_state(con: &mut Connection, key: &str) -> Option<(String, i64, i64)> {
    let f = maybe_map(con, &["LOCK.INFO", key])?;
    Some((
        field_str(&f, "owner"),
        field_int(&f, "holds"),
        field_int(&f, "fence"),
    ))
}

/// Starts an AOF rewrite and waits for it to finish.
pub fn rewrite_aof(c: &mut Connection) {
    run(c, &["BGREWRITEAOF"]).unwrap();
    wait_for("aof rewrite", Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("persistence").query(c).unwrap();
        info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0")
    });
}

/// Offers `payload` to RESTORE (into key `t`, replacing); the result is ignored.
pub fn try_restore(c: &mut Connection, payload: &[u8]) {
    let _ = redis::cmd("RESTORE")
        .arg("t")
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query::<Value>(c);
}

/// Every truncation of a DUMP payload is refused (the checksum catches them)
/// and the server still answers.
pub fn restore_every_truncation(c: &mut Connection, dump: &[u8]) {
    for cut in 0..dump.len() {
        try_restore(c, &dump[..cut]);
    }
    let pong: String = redis::cmd("PING").query(c).unwrap();
    assert_eq!(pong, "PONG");
}

/// Redis' CRC-64 (Jones, reflected), as used by DUMP payloads.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95ac9329ac4bc9b5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A DUMP payload with `body` changed and the checksum fixed, so that it reaches the module.
pub fn resign(dump: &[u8], body: Vec<u8>) -> Vec<u8> {
    let trailer = &dump[dump.len() - 10..dump.len() - 8]; // RDB version
    let mut out = body;
    out.extend_from_slice(trailer);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A lock's DUMP payload carrying `fence` instead of the token it was dumped
/// with (tokens are saved as 8 big-endian bytes): how a test plants a token
/// far above the server's counter, now that effects cannot be sent by clients.
pub fn dump_with_fence(dump: &[u8], old: u64, fence: u64) -> Vec<u8> {
    let body = &dump[..dump.len() - 10];
    let needle = old.to_be_bytes();
    let at = body
        .windows(8)
        .position(|w| w == needle)
        .expect("the token in the payload");
    let mut patched = body.to_vec();
    patched[at..at + 8].copy_from_slice(&fence.to_be_bytes());
    resign(dump, patched)
}

/// A field of `INFO <section>` as an integer (`warden_` fields with section "warden").
pub fn info_int(c: &mut Connection, section: &str, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

/// A `warden_<name>` field of `INFO warden`.
pub fn warden_stat(c: &mut Connection, name: &str) -> i64 {
    info_int(c, "warden", &format!("warden_{name}"))
}

/// RedisBloom's module, which `make test` fetches (`REDISBLOOM_MODULE`).
pub fn redisbloom() -> PathBuf {
    let path = std::env::var("REDISBLOOM_MODULE").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench/redisbloom.so"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "RedisBloom not found at {}: run `make test`, which fetches it",
        path.display()
    );
    path
}

/// Every `(iterator, data)` pair of a full `BF.SCANDUMP`.
pub fn scandump(c: &mut Connection, key: &str) -> Vec<(i64, Vec<u8>)> {
    let mut chunks = Vec::new();
    let mut iter = 0;
    loop {
        let (next, data): (i64, Vec<u8>) = redis::cmd("BF.SCANDUMP")
            .arg(key)
            .arg(iter)
            .query(c)
            .unwrap();
        if next == 0 {
            return chunks;
        }
        chunks.push((next, data));
        iter = next;
    }
}

/// A redis-server with the given `--loadmodule` lines, in order.
pub struct Plain {
    pub dir: tempfile::TempDir,
    child: Child,
}

impl Plain {
    pub fn start(modules: &[Vec<String>]) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), modules)
    }

    /// A server that starts on a copy of `rdb`.
    pub fn start_on(rdb: &std::path::Path, modules: &[Vec<String>]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(rdb, dir.path().join("dump.rdb")).unwrap();
        Self::start_in(dir, modules)
    }

    /// With `extra` config arguments before the modules.
    pub fn start_with(extra: &[&str], modules: &[Vec<String>]) -> Self {
        Self::launch(tempfile::tempdir().unwrap(), extra, modules)
    }

    fn start_in(dir: tempfile::TempDir, modules: &[Vec<String>]) -> Self {
        Self::launch(dir, &[], modules)
    }

    fn launch(dir: tempfile::TempDir, extra: &[&str], modules: &[Vec<String>]) -> Self {
        let mut cmd = Command::new(server_binary());
        cmd.current_dir(dir.path()).args([
            "--port",
            "0",
            "--save",
            "",
            "--unixsocket",
            &dir.path().join("redis.sock").display().to_string(),
            "--logfile",
            &dir.path().join("redis.log").display().to_string(),
        ]);
        cmd.args(extra);
        for m in modules {
            cmd.arg("--loadmodule").args(m);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        Self { dir, child }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// A connection once the server answers.
    pub fn conn(&mut self) -> Connection {
        let url = format!(
            "redis+unix://{}",
            self.dir.path().join("redis.sock").display()
        );
        let started = Instant::now();
        loop {
            if let Ok(mut c) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return c;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("redis-server exited ({status}):\n{}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the server to exit on its own.
    pub fn exited(&mut self) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Waits until the server is ready (true) or has exited (false). The
    /// socket exists before modules load, so readiness is the log's line.
    pub fn runs(&mut self) -> bool {
        let started = Instant::now();
        loop {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if self.log().contains("eady to accept connections") {
                return true;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "server neither started nor exited:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `--loadmodule` line: the module's path and its arguments.
pub fn module(path: PathBuf, args: &[&str]) -> Vec<String> {
    let mut line = vec![path.display().to_string()];
    line.extend(args.iter().map(|a| a.to_string()));
    line
}
