//! Against a server without the module, every kind's first command fails
//! with the server's own words and a hint to check that warden is loaded.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;
use warden_client::{Error, Warden};

/// A plain server (no `--loadmodule`) on a unix socket, stopped on drop.
struct Plain {
    _dir: tempfile::TempDir,
    url: String,
    child: Child,
}

impl Plain {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("redis.sock");
        let child = Command::new(server_binary())
            .current_dir(dir.path())
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server binary");
        let url = format!("redis+unix://{}", sock.display());
        wait_for("the plain server", Duration::from_secs(20), || {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
        Plain {
            _dir: dir,
            url,
            child,
        }
    }

    fn warden(&self) -> Warden {
        Warden::open(&self.url).unwrap()
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_says_to_check_that_warden_is_loaded() {
    let server = Plain::start();
    let w = server.warden();
    let wait = Duration::from_secs(1);
    let cases: Vec<(&str, Error)> = vec![
        (
            "LOCK.ACQUIRE",
            w.lock("k").wait(wait).acquire().await.unwrap_err(),
        ),
        (
            "RWLOCK.READ",
            w.read_lock("k").wait(wait).acquire().await.unwrap_err(),
        ),
        (
            "SEM.ACQUIRE",
            w.semaphore("k", 2).acquire().await.unwrap_err(),
        ),
        (
            "CACHE.GET",
            w.cache()
                .get_or_load("k", wait, || async {
                    Ok::<_, std::io::Error>("v".to_string())
                })
                .await
                .unwrap_err(),
        ),
    ];
    for (command, e) in cases {
        let Error::Server { code, message } = &e else {
            panic!("{command}: not a server error: {e:?}");
        };
        assert_eq!(code, "ERR", "{command}: {e}");
        assert!(
            message.starts_with(&format!("unknown command '{command}'")),
            "{command}: the server's words first: {message}"
        );
        assert!(
            e.to_string()
                .ends_with("(is the warden module loaded? MODULE LIST shows it)"),
            "{command}: {e}"
        );
    }
}

/// Other error replies pass through as the server wrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_errors_carry_no_hint() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "v"]).unwrap();
    let e = warden(&s).lock("k").acquire().await.unwrap_err();
    assert!(
        matches!(&e, Error::Server { code, .. } if code == "WRONGTYPE"),
        "{e:?}"
    );
    assert!(!e.to_string().contains("loaded"), "{e}");
}
