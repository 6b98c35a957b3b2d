//! [`Client`]: a store's URL parsed, and one connection per calling
//! thread, with retries.
//!
//! 1. `URL#NAME` is split and the client built ([`Client::open`]): a
//!    single server (read with `resp.rs`) or a cluster (the `redis`
//!    crate's cluster client, which follows `MOVED`/`ASK`).
//! 2. [`Client::with_conn`] takes the calling thread's connection out of
//!    the map (connecting if there is none), runs the request, and puts it
//!    back. A failed request drops the connection (after a timeout it may
//!    still owe a reply), waits (backoff from 10 ms, doubling to 500 ms)
//!    and tries again on a new one, until the deadline; an error that is
//!    not worth a retry (a server error for this request) fails at once.
//! 3. [`Client::scan`] walks the keys matching a pattern on every master
//!    (the single server, or each master of a cluster, found with
//!    `CLUSTER NODES`, on a connection of its own).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Value};

use crate::config::RedisConfig;
use crate::error::RedisStoreError;
use crate::resp::RawConn;

/// Where the store lives.
enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// One thread's connection.
pub(crate) enum Conn {
    Single(Box<Single>),
    Cluster(Box<ClusterConnection>),
}

/// A single-server connection and its stream read-ahead (see
/// [`RedisConfig::read_ahead`]).
pub(crate) struct Single {
    pub(crate) raw: RawConn,
    /// Where the last one-range fill ended: a fill starting there
    /// continues a stream.
    pub(crate) last_end: Option<u64>,
    /// Fills sent ahead whose replies are still unread, oldest first (at
    /// most one).
    pub(crate) ahead: VecDeque<Ahead>,
}

/// A fill sent ahead of its fault.
pub(crate) struct Ahead {
    pub(crate) offset: u64,
    pub(crate) len: usize,
    /// Replies it owes (one per piece).
    pub(crate) replies: usize,
    /// The store's write-backs started when it was sent.
    pub(crate) writes: u64,
}

impl Single {
    /// Reads and drops every reply still owed to fills sent ahead.
    pub(crate) fn drain(&mut self) -> RedisResult<()> {
        while let Some(a) = self.ahead.pop_front() {
            for _ in 0..a.replies {
                self.raw.skip_reply()?;
            }
        }
        Ok(())
    }
}

/// A failed request: the key it was about and why.
pub(crate) struct Failure {
    pub(crate) key: String,
    pub(crate) cause: String,
    pub(crate) errno: Option<i32>,
}

/// A store's server (or cluster) and its connections; see the module docs.
pub(crate) struct Client {
    /// `redis BASE#NAME`, for messages.
    pub(crate) what: Arc<str>,
    /// The store's name (after `#`).
    pub(crate) name: String,
    pub(crate) cfg: RedisConfig,
    target: Target,
    conns: Mutex<HashMap<ThreadId, Conn>>,
}

impl Client {
    /// Splits `URL#NAME` and builds the client (no connection yet).
    pub(crate) fn open(url: &str, cfg: RedisConfig) -> Result<Client, RedisStoreError> {
        let bad = |reason: String| RedisStoreError::Url {
            url: url.to_string(),
            reason,
        };
        let (base, name) = match url.split_once('#') {
            Some((b, n)) if !n.is_empty() => (b, n.to_string()),
            Some(_) => return Err(bad("empty store name after '#'".into())),
            None => (url, "faultline".to_string()),
        };
        if name.contains(['{', '}']) {
            return Err(bad("the store name may not contain '{' or '}'".into()));
        }
        let target = if let Some(nodes) = base.strip_prefix("redis-cluster://") {
            let nodes: Vec<String> = nodes
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(bad("no cluster nodes".into()));
            }
            let client = ClusterClient::builder(nodes)
                .connection_timeout(cfg.connect_timeout)
                .response_timeout(cfg.command_timeout)
                .retries(3)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            Target::Cluster(client)
        } else if ["redis://", "redis+unix://", "unix://"]
            .iter()
            .any(|p| base.starts_with(p))
        {
            Target::Single(redis::Client::open(base).map_err(|e| bad(e.to_string()))?)
        } else {
            return Err(bad(
                "expected redis://HOST:PORT, redis+unix:///PATH, unix:///PATH or redis-cluster://HOST:PORT,...".into(),
            ));
        };
        Ok(Client {
            what: format!("redis {base}#{name}").into(),
            name,
            cfg,
            target,
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// Runs `f` on this thread's connection, reconnecting and retrying
    /// with backoff until the deadline. `key` names the request in errors.
    pub(crate) fn with_conn<T>(
        &self,
        key: &str,
        mut f: impl FnMut(&mut Conn) -> RedisResult<T>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        let me = std::thread::current().id();
        let mut backoff = Duration::from_millis(10);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let taken = self.conns.lock().expect("conns").remove(&me);
            let res = match taken {
                Some(c) => Ok(c),
                None => self.connect(),
            }
            .and_then(|mut c| f(&mut c).map(|v| (v, c)));
            let err = match res {
                Ok((v, c)) => {
                    self.conns.lock().expect("conns").insert(me, c);
                    return Ok(v);
                }
                Err(e) => e,
            };
            // The connection is dropped: after a timeout it may still owe
            // a reply.
            let elapsed = start.elapsed();
            if !retryable(&err) || elapsed + backoff > self.cfg.deadline {
                return Err(Failure {
                    key: key.to_string(),
                    cause: format!("{err} ({tries} tries over {:.1} s)", elapsed.as_secs_f64()),
                    errno: crate::error::errno_of(&err),
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    fn connect(&self) -> RedisResult<Conn> {
        match &self.target {
            Target::Single(client) => Ok(Conn::Single(Box::new(Single {
                raw: RawConn::connect(
                    client.get_connection_info(),
                    self.cfg.connect_timeout,
                    self.cfg.command_timeout,
                )?,
                last_end: None,
                ahead: VecDeque::new(),
            }))),
            Target::Cluster(client) => Ok(Conn::Cluster(Box::new(client.get_connection()?))),
        }
    }

    /// The error of a failed step `op`.
    pub(crate) fn request_error(&self, op: &str, f: Failure) -> RedisStoreError {
        RedisStoreError::Request {
            what: self.what.to_string(),
            op: format!("{op} ({})", f.key),
            cause: f.cause,
            errno: f.errno,
        }
    }

    /// One request about `key` (step `op` in errors), with retries.
    pub(crate) fn query<T: FromRedisValue>(
        &self,
        op: &str,
        key: &str,
        cmd: &Cmd,
    ) -> Result<T, RedisStoreError> {
        self.with_conn(key, |c| c.query(cmd))
            .map_err(|f| self.request_error(op, f))
    }

    /// Requests in one pipeline (step `op` in errors, named after `key`),
    /// with retries of the whole pipeline; their replies.
    pub(crate) fn pipeline(
        &self,
        op: &str,
        key: &str,
        cmds: &[Cmd],
    ) -> Result<Vec<Value>, RedisStoreError> {
        self.with_conn(key, |c| c.pipeline(cmds))
            .map_err(|f| self.request_error(op, f))
    }

    /// Calls `each` with the keys matching `pattern` on every master, a
    /// batch at a time (a key may come twice: `SCAN`'s guarantee).
    pub(crate) fn scan(
        &self,
        pattern: &str,
        mut each: impl FnMut(Vec<String>) -> Result<(), RedisStoreError>,
    ) -> Result<(), RedisStoreError> {
        let step = |cursor: &str| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            cmd
        };
        match &self.target {
            Target::Single(_) => {
                let mut cursor = "0".to_string();
                loop {
                    let (next, keys): (String, Vec<String>) =
                        self.query("listing keys", pattern, &step(&cursor))?;
                    each(keys)?;
                    if next == "0" {
                        return Ok(());
                    }
                    cursor = next;
                }
            }
            Target::Cluster(_) => {
                let mut nodes = redis::cmd("CLUSTER");
                nodes.arg("NODES");
                let nodes: String =
                    self.query("listing the cluster's masters", "CLUSTER NODES", &nodes)?;
                for addr in masters(&nodes) {
                    let fail = |e: RedisError| RedisStoreError::Request {
                        what: self.what.to_string(),
                        op: format!("listing keys on master {addr} ({pattern})"),
                        cause: e.to_string(),
                        errno: crate::error::errno_of(&e),
                    };
                    let mut c = redis::Client::open(format!("redis://{addr}"))
                        .and_then(|c| c.get_connection_with_timeout(self.cfg.connect_timeout))
                        .map_err(fail)?;
                    c.set_read_timeout(Some(self.cfg.command_timeout))
                        .and_then(|()| c.set_write_timeout(Some(self.cfg.command_timeout)))
                        .map_err(fail)?;
                    let mut cursor = "0".to_string();
                    loop {
                        let (next, keys): (String, Vec<String>) =
                            step(&cursor).query(&mut c).map_err(fail)?;
                        each(keys)?;
                        if next == "0" {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(())
            }
        }
    }
}

/// The `HOST:PORT` of every master that is up, from `CLUSTER NODES`
/// (`ID HOST:PORT@BUS[,HOSTNAME] FLAGS ...`).
fn masters(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, addr, flags) = (f.next()?, f.next()?, f.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            let up = flags.contains(&"master")
                && !flags
                    .iter()
                    .any(|x| matches!(*x, "fail" | "fail?" | "noaddr"));
            let addr = addr.split(['@', ',']).next()?;
            (up && !addr.starts_with(':')).then(|| addr.to_string())
        })
        .collect()
}

/// Errors worth a reconnect and a retry: the server is down, slow,
/// loading, or the cluster is re-sharding.
pub(crate) fn retryable(e: &RedisError) -> bool {
    use redis::ErrorKind::*;
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            BusyLoadingError
                | TryAgain
                | ClusterDown
                | MasterDown
                | IoError
                | ClusterConnectionNotFound
        )
}

impl Conn {
    /// One request and its reply.
    pub(crate) fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(sc) => {
                sc.drain()?;
                let c = &mut sc.raw;
                c.wbuf.clear();
                cmd.write_packed_command(&mut c.wbuf);
                c.send()?;
                T::from_owned_redis_value(c.read_value()?.extract_error()?)
            }
            Conn::Cluster(c) => cmd.query(c.as_mut()),
        }
    }

    /// Requests in one pipeline and their replies; an error reply fails
    /// the whole pipeline (the first one is returned) after every reply
    /// was read.
    pub(crate) fn pipeline(&mut self, cmds: &[Cmd]) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Single(sc) => {
                sc.drain()?;
                let c = &mut sc.raw;
                c.wbuf.clear();
                cmds.iter()
                    .for_each(|cmd| cmd.write_packed_command(&mut c.wbuf));
                c.send()?;
                let mut first = None;
                let mut values = Vec::with_capacity(cmds.len());
                for _ in cmds {
                    match c.read_value()?.extract_error() {
                        Ok(v) => values.push(v),
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
                first.map_or(Ok(values), Err)
            }
            Conn::Cluster(c) => {
                let mut p = redis::cluster::cluster_pipe();
                cmds.iter().for_each(|cmd| {
                    p.add_command(cmd.clone());
                });
                p.query::<Vec<Value>>(c.as_mut())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_come_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001,host.example master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7002@17002 slave a1 0 0 1 connected
d4 127.0.0.1:7003@17003 master,fail - 0 0 3 disconnected
e5 :0@0 master,noaddr - 0 0 4 disconnected
";
        assert_eq!(masters(nodes), ["127.0.0.1:7000", "127.0.0.1:7001"]);
    }
}
