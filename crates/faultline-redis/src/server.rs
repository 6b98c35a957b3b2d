//! Real `redis-server` processes for tests and benchmarks: one server on a
//! unix socket in a temporary directory ([`RedisServer`]), or a cluster of
//! masters on loopback ports ([`RedisCluster`]). Each is stopped by its
//! pid when dropped (SIGTERM, then SIGKILL after a second) and its
//! directory removed; nothing is left running. A missing `redis-server`
//! is an error (`bash scripts/setup.sh` installs it), never a skip.
//!
//! Both answer the questions tests ask of the data ([`Keys`]): how many
//! keys, which ones, how much memory; remove or overwrite a key; slow
//! every node down (`DEBUG SLEEP`), without the test naming the `redis`
//! crate. [`pattern`] makes the test data.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Starting or driving a server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Spawning the process (`redis-server` missing: run `scripts/setup.sh`).
    #[error("starting {program}: {source} (install it with `bash scripts/setup.sh`)")]
    Spawn {
        program: &'static str,
        source: std::io::Error,
    },
    /// The server did not answer in time.
    #[error("{what} did not answer within {timeout:?}: {last}")]
    NotReady {
        what: String,
        timeout: Duration,
        last: String,
    },
    /// A setup step failed.
    #[error("{step}: {reason}")]
    Setup { step: String, reason: String },
    /// A command of the test helpers ([`Keys`]) failed.
    #[error("{command} on {node}: {cause}")]
    Command {
        command: String,
        node: String,
        cause: String,
    },
}

/// A temporary directory removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<TempDir, ServerError> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("faultline-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| ServerError::Setup {
            step: format!("creating {}", p.display()),
            reason: e.to_string(),
        })?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `redis-server` process, stopped by pid on drop.
#[derive(Debug)]
struct Process {
    child: Option<Child>,
}

impl Process {
    fn spawn(args: &[String], dir: &Path) -> Result<Process, ServerError> {
        let child = Command::new("redis-server")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ServerError::Spawn {
                program: "redis-server",
                source,
            })?;
        Ok(Process { child: Some(child) })
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGTERM, wait up to a second, then SIGKILL; reaps the process.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `PING` on `url` until it answers or [`START_TIMEOUT`] passes.
fn wait_ready(url: &str) -> Result<(), ServerError> {
    let end = Instant::now() + START_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < end {
        let ok = redis::Client::open(url).and_then(|c| {
            let mut conn = c.get_connection_with_timeout(Duration::from_millis(200))?;
            redis::cmd("PING").query::<String>(&mut conn)
        });
        match ok {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(ServerError::NotReady {
        what: url.to_string(),
        timeout: START_TIMEOUT,
        last,
    })
}

/// Arguments every server gets: no persistence, quiet.
fn base_args(dir: &Path) -> Vec<String> {
    [
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
        "--loglevel",
        "warning",
        // DEBUG SLEEP simulates a slow server (loopback and unix only).
        "--enable-debug-command",
        "local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A `redis-server` listening on a unix socket in a temporary directory
/// ([`start`](Self::start)) or on a loopback TCP port
/// ([`start_tcp`](Self::start_tcp)).
#[derive(Debug)]
pub struct RedisServer {
    proc: Process,
    socket: PathBuf,
    /// The TCP port; `None` for a unix socket (and no TCP).
    port: Option<u16>,
    // Dropped after `proc`: the directory goes once the server is stopped.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server on a unix socket and waits until it answers `PING`.
    pub fn start() -> Result<RedisServer, ServerError> {
        Self::start_on(None)
    }

    /// Starts a server on a free loopback TCP port (no unix socket).
    pub fn start_tcp() -> Result<RedisServer, ServerError> {
        Self::start_on(Some(free_port()?))
    }

    fn start_on(port: Option<u16>) -> Result<RedisServer, ServerError> {
        let dir = TempDir::new("redis")?;
        let socket = dir.0.join("redis.sock");
        let mut s = RedisServer {
            proc: Process { child: None },
            socket,
            port,
            dir,
        };
        s.restart()?;
        Ok(s)
    }

    fn args(&self) -> Vec<String> {
        let mut a = match self.port {
            Some(p) => vec![
                "--port".to_string(),
                p.to_string(),
                "--bind".to_string(),
                "127.0.0.1".to_string(),
            ],
            None => vec![
                "--port".to_string(),
                "0".to_string(),
                "--unixsocket".to_string(),
                self.socket.display().to_string(),
                "--unixsocketperm".to_string(),
                "700".to_string(),
            ],
        };
        a.extend(base_args(&self.dir.0));
        a
    }

    /// The base URL (`redis+unix:///...` or `redis://127.0.0.1:PORT`),
    /// without a store name.
    pub fn url(&self) -> String {
        match self.port {
            Some(p) => format!("redis://127.0.0.1:{p}"),
            None => format!("redis+unix://{}", self.socket.display()),
        }
    }

    /// The unix socket's path (`None` for a TCP server).
    pub fn socket(&self) -> Option<&Path> {
        self.port.is_none().then_some(self.socket.as_path())
    }

    /// Pins every thread of the server to `cpus` (a `taskset` list:
    /// `1`, `0-1`). Benchmarks use it to say where the server runs.
    pub fn pin(&self, cpus: &str) -> Result<(), ServerError> {
        let pid = self.pid().ok_or_else(|| ServerError::Setup {
            step: "pinning redis-server".into(),
            reason: "the server is not running".into(),
        })?;
        let out = Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, &pid.to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ServerError::Spawn {
                program: "taskset",
                source,
            })?;
        if !out.status.success() {
            return Err(ServerError::Setup {
                step: format!("taskset -a -p -c {cpus} {pid}"),
                reason: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(())
    }

    /// The URL of store `name` on this server.
    pub fn store_url(&self, name: &str) -> String {
        format!("{}#{name}", self.url())
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// Stops the server (its data is gone: nothing is persisted).
    pub fn stop(&mut self) {
        self.proc.stop();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Starts the server again on the same socket (after [`stop`](Self::stop)).
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.stop();
        self.proc = Process::spawn(&self.args(), &self.dir.0)?;
        wait_ready(&self.url())
    }

    /// A connection to the server (for test set-up: `DEBUG SLEEP`, keys).
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }
}

/// `masters` `redis-server --cluster-enabled yes` processes on loopback
/// ports, joined with `redis-cli --cluster create`, each owning a third of
/// the slots (for 3).
#[derive(Debug)]
pub struct RedisCluster {
    procs: Vec<Process>,
    ports: Vec<u16>,
    _dir: TempDir,
}

/// A loopback port free right now (the kernel's pick for port 0).
fn free_port() -> Result<u16, ServerError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ServerError::Setup {
            step: "finding a free loopback port".into(),
            reason: e.to_string(),
        })
}

impl RedisCluster {
    /// Starts `masters` (at least 3) nodes and waits for `cluster_state:ok`.
    pub fn start(masters: usize) -> Result<RedisCluster, ServerError> {
        let dir = TempDir::new("redis-cluster")?;
        let mut procs = Vec::new();
        let mut ports = Vec::new();
        for i in 0..masters {
            let port = free_port()?;
            let node_dir = dir.0.join(format!("node{i}"));
            std::fs::create_dir_all(&node_dir).map_err(|e| ServerError::Setup {
                step: format!("creating {}", node_dir.display()),
                reason: e.to_string(),
            })?;
            let mut args = vec![
                "--port".to_string(),
                port.to_string(),
                "--bind".to_string(),
                "127.0.0.1".to_string(),
                "--cluster-enabled".to_string(),
                "yes".to_string(),
                "--cluster-config-file".to_string(),
                node_dir.join("nodes.conf").display().to_string(),
            ];
            args.extend(base_args(&node_dir));
            procs.push(Process::spawn(&args, &node_dir)?);
            ports.push(port);
        }
        for p in &ports {
            wait_ready(&format!("redis://127.0.0.1:{p}"))?;
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for p in &ports {
            create.arg(format!("127.0.0.1:{p}"));
        }
        let out = create
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ServerError::Spawn {
                program: "redis-cli",
                source,
            })?;
        if !out.status.success() {
            return Err(ServerError::Setup {
                step: "redis-cli --cluster create".into(),
                reason: String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            });
        }
        let cluster = RedisCluster {
            procs,
            ports,
            _dir: dir,
        };
        cluster.wait_ok()?;
        Ok(cluster)
    }

    fn wait_ok(&self) -> Result<(), ServerError> {
        let end = Instant::now() + START_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < end {
            let all_ok = self.ports.iter().all(|p| {
                let info = self
                    .node(*p)
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c));
                match info {
                    Ok(i) if i.contains("cluster_state:ok") => true,
                    Ok(i) => {
                        last = i;
                        false
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            });
            if all_ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ServerError::NotReady {
            what: "the cluster".into(),
            timeout: START_TIMEOUT,
            last,
        })
    }

    /// The nodes' loopback ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// A direct (non-cluster) connection to the node on `port`.
    pub fn node(&self, port: u16) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))?
            .get_connection_with_timeout(Duration::from_secs(2))
    }

    /// The URL of store `name` on this cluster.
    pub fn store_url(&self, name: &str) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://{}#{name}", nodes.join(","))
    }

    /// The nodes' pids.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().filter_map(|p| p.pid()).collect()
    }
}

/// What tests ask of a server's or a cluster's data, summed over its
/// masters; keys are routed to their node.
pub trait Keys {
    /// `redis://` URLs of the masters.
    fn node_urls(&self) -> Vec<String>;

    /// A connection that sends a key's command to the key's node.
    fn routing_connection(&self) -> redis::RedisResult<Box<dyn redis::ConnectionLike>>;

    /// Runs `f` on a connection that routes `key` to its node.
    fn with_key<T>(
        &self,
        key: &str,
        f: impl FnOnce(&mut dyn redis::ConnectionLike) -> redis::RedisResult<T>,
    ) -> Result<T, ServerError> {
        let fail = |e: redis::RedisError| ServerError::Command {
            command: format!("a command on {key}"),
            node: self.node_urls().join(","),
            cause: e.to_string(),
        };
        let mut c = self.routing_connection().map_err(fail)?;
        f(c.as_mut()).map_err(fail)
    }

    /// `DBSIZE`, summed.
    fn dbsize(&self) -> Result<u64, ServerError> {
        let mut n = 0;
        for url in self.node_urls() {
            n += node_query::<u64>(&url, "DBSIZE", redis::cmd("DBSIZE"))?;
        }
        Ok(n)
    }

    /// Every key matching `pattern` (`SCAN MATCH`), sorted.
    fn keys(&self, pattern: &str) -> Result<Vec<String>, ServerError> {
        let mut all = Vec::new();
        for url in self.node_urls() {
            let mut cursor = "0".to_string();
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, keys): (String, Vec<String>) = node_query(&url, "SCAN", cmd)?;
                all.extend(keys);
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        all.sort();
        all.dedup();
        Ok(all)
    }

    /// `used_memory` of `INFO memory`, summed.
    fn used_memory(&self) -> Result<u64, ServerError> {
        let mut n = 0;
        for url in self.node_urls() {
            let mut cmd = redis::cmd("INFO");
            cmd.arg("memory");
            let info: String = node_query(&url, "INFO memory", cmd)?;
            n += info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ServerError::Command {
                    command: "INFO memory".into(),
                    node: url.clone(),
                    cause: "no used_memory line".into(),
                })?;
        }
        Ok(n)
    }

    /// Removes `key`.
    fn del(&self, key: &str) -> Result<(), ServerError> {
        self.with_key(key, |c| redis::cmd("DEL").arg(key).query::<()>(c))
    }

    /// Sets `key` to `value`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), ServerError> {
        self.with_key(key, |c| {
            redis::cmd("SET").arg(key).arg(value).query::<()>(c)
        })
    }

    /// Blocks every master for `seconds` (`DEBUG SLEEP`): see
    /// [`sleep_nodes`].
    fn sleep_all(&self, seconds: f64) -> Result<(), ServerError> {
        sleep_nodes(&self.node_urls(), seconds)
    }
}

/// Blocks each node of `urls` ([`Keys::node_urls`]) for `seconds`
/// (`DEBUG SLEEP`), each from its own connection at once; returns when
/// all have answered. A test slows a command down with it (one sleep
/// after another) to catch it in the middle.
pub fn sleep_nodes(urls: &[String], seconds: f64) -> Result<(), ServerError> {
    let threads: Vec<_> = urls
        .iter()
        .cloned()
        .map(|url| {
            std::thread::spawn(move || {
                let mut cmd = redis::cmd("DEBUG");
                cmd.arg("SLEEP").arg(seconds);
                node_query::<()>(&url, "DEBUG SLEEP", cmd)
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| ServerError::Command {
            command: "DEBUG SLEEP".into(),
            node: "a node".into(),
            cause: "the thread panicked".into(),
        })??;
    }
    Ok(())
}

/// One command on one node, on a connection of its own (a 30 s read
/// timeout: `DEBUG SLEEP` is the longest a test asks for).
fn node_query<T: redis::FromRedisValue>(
    url: &str,
    what: &str,
    cmd: redis::Cmd,
) -> Result<T, ServerError> {
    let fail = |e: redis::RedisError| ServerError::Command {
        command: what.to_string(),
        node: url.to_string(),
        cause: e.to_string(),
    };
    let mut c = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .map_err(fail)?;
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(fail)?;
    cmd.query(&mut c).map_err(fail)
}

impl Keys for RedisServer {
    fn node_urls(&self) -> Vec<String> {
        vec![self.url()]
    }

    fn routing_connection(&self) -> redis::RedisResult<Box<dyn redis::ConnectionLike>> {
        Ok(Box::new(self.connection()?))
    }
}

impl Keys for RedisCluster {
    fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    fn routing_connection(&self) -> redis::RedisResult<Box<dyn redis::ConnectionLike>> {
        let c = redis::cluster::ClusterClient::new(self.node_urls())?.get_connection()?;
        Ok(Box::new(c))
    }
}

/// Test data: `len` bytes that differ on every page and at every offset
/// (xorshift from `seed`), so a page read from the wrong place or the
/// wrong generation never matches.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
