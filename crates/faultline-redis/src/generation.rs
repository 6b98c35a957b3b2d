//! Generations: how `put` replaces a store in one step, and how `gc`
//! (and the next `put`) remove what no metadata names.
//!
//! Every `put` writes a new generation (a number in its chunk keys, see
//! `layout.rs`) beside the one readers use, and switches the metadata
//! to it at the end:
//!
//! ```text
//!   before     fl:{snap}:meta gen=4              readers open generation 4
//!   1. BEGIN   fl:{snap}:gens 5 = "put EXPIRY CHUNK GROUP 0 OWNER"
//!   2. upload  fl:{snap:G}:g5:C for every C      RENEW before each batch
//!   3. COMMIT  fl:{snap}:meta gen=5              one script, one slot:
//!              fl:{snap}:gens 4 = "old ..", 5 dropped
//!   4. unlink  fl:{snap:G}:g4:C for every C, then FORGET gens 4
//!   after                                        readers open generation 5
//! ```
//!
//! 1. **Claim.** A script (`BEGIN`) hands out the next generation id and
//!    records `put EXPIRY CHUNK GROUP UPTO OWNER` under it: an upload in
//!    progress, its lease (60 s of server time), how far it may have
//!    written, and its process (`owner.rs`).
//! 2. **Upload.** Before each batch (4 MiB of chunks, one pipeline) a
//!    script (`RENEW`) extends the lease and records where the batch
//!    ends; if the record is no longer this upload's (it stalled past
//!    its lease and was claimed), the upload stops. The old generation is
//!    untouched: readers go on reading it.
//! 3. **Switch.** One script (`COMMIT`) checks the record is still this
//!    upload's, writes the new metadata (with `gen`), turns the old
//!    generation into an `old` record and removes the upload's record.
//!    The metadata and the records share the hash tag `{NAME}`, so on a
//!    cluster this is one script on one slot: atomic there too. Before
//!    it, readers open the old generation; after it, the new one; never
//!    a mix (every chunk key names its generation).
//! 4. **Removal.** The old generation's chunks are unlinked (their keys
//!    follow from the record: chunk size, tag size, count), then its
//!    record is dropped (`FORGET`, only if unchanged).
//!
//! An upload that stops early (a failed request, a source that fails or
//! is interrupted) unlinks the chunks its record covers, then drops its
//! record (`DROP_OWN`), and reports what it removed; the store is
//! unchanged. Neither step needs memory on the server, so an upload
//! stopped by the server's `maxmemory` cleans up too. One that is killed
//! leaves its `put` record: the next `put` of that name and `gc` take it
//! over (`CLAIM`, which drops the record and returns what it covers)
//! once its process has ended (on this host: its pid and start time are
//! gone; a process that runs keeps its upload, however slow) or its
//! lease ran out (another host), then unlink its chunks.
//! `CLAIM` never takes the generation the metadata names, nor an upload
//! that may still run; a claimed upload finds out at its next `RENEW`
//! or at its `COMMIT` and stops. A process killed between a `CLAIM` and
//! the end of the unlinking leaves keys nothing records: `gc`'s walk
//! (below) finds them.
//!
//! Two `put`s of one name at once each upload their own generation and
//! switch in one step: the last to switch is the store, and it removes
//! the other.
//!
//! `gc` also walks the keys (`SCAN` on every master) and removes the
//! chunks of generations nothing names: keys left by a process killed
//! between steps, chunks of stores written before generations that an
//! older `put` left past the end, anything under the store's name that
//! is not a chunk of its current generation or of a live upload.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::time::Duration;

use redis::{Cmd, Value};

use crate::config::batch_chunks;
use crate::conn::Client;
use crate::error::RedisStoreError;
use crate::layout::{
    checksum, chunk_key, gens_key, info_from_meta, meta_key, parse_chunk_key, scan_pattern, Record,
    StoreInfo, FNV_START,
};
use crate::owner;

/// How long an upload's claim lasts without a renewal (each batch
/// renews it).
const LEASE: Duration = Duration::from_secs(60);

/// Keys per `UNLINK` pipeline.
const UNLINK_BATCH: usize = 512;

/// Server time in ms, in a script.
macro_rules! now_ms {
    () => {
        "local t = redis.call('TIME')\n\
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    };
}

/// KEYS meta, gens; ARGV lease_ms, chunk, group, owner: the new id.
const BEGIN: &str = concat!(
    now_ms!(),
    r#"
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') or 0
local n = redis.call('HINCRBY', KEYS[2], 'next', 1)
if n <= cur then
  n = cur + 1
  redis.call('HSET', KEYS[2], 'next', string.format('%.0f', n))
end
while redis.call('HEXISTS', KEYS[2], string.format('%.0f', n)) == 1 do
  n = redis.call('HINCRBY', KEYS[2], 'next', 1)
end
redis.call('HSET', KEYS[2], string.format('%.0f', n),
  string.format('put %.0f %s %s 0 %s', now + tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]))
return n
"#
);

/// KEYS meta, gens; ARGV id, lease_ms, upto, owner: 1 renewed, 0 the
/// record is not this upload's any more.
const RENEW: &str = concat!(
    r#"
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
local c, g, o = string.match(v, '^put %d+ (%d+) (%d+) %d+ (.+)$')
if o ~= ARGV[4] then return 0 end
"#,
    now_ms!(),
    r#"
redis.call('HSET', KEYS[2], ARGV[1],
  string.format('put %.0f %s %s %s %s', now + tonumber(ARGV[2]), c, g, ARGV[3], o))
return 1
"#
);

/// KEYS meta, gens; ARGV id, owner, len, chunk, group, checksum:
/// {0} not this upload's; {1} switched (no store before); {1, old id,
/// old record} switched, the old generation recorded as `old`.
const COMMIT: &str = r#"
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v or string.match(v, '^put %d+ %d+ %d+ %d+ (.+)$') ~= ARGV[2] then return {0} end
local old = redis.call('HMGET', KEYS[1], 'gen', 'len', 'chunk', 'group')
local out = {1}
local og = old[1] or '0'
local function num(x) return x and string.match(x, '^%d+$') end
if num(og) and num(old[2]) and num(old[3]) and num(old[4]) and og ~= ARGV[1] then
  local c = tonumber(old[3])
  if c > 0 then
    local rec = string.format('old %s %s %.0f', old[3], old[4], math.ceil(tonumber(old[2]) / c))
    redis.call('HSET', KEYS[2], og, rec)
    out = {1, og, rec}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'len', ARGV[3], 'chunk', ARGV[4], 'group', ARGV[5],
  'checksum', ARGV[6], 'gen', ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return out
"#;

/// KEYS meta, gens; ARGV id, owner ('' = none judged ended): {0} if
/// generation id is the store's or an upload that may still run; else
/// {1, record} with the record that says which chunks to remove (an
/// `old` one stays until `FORGET`; the `put` record of an ended owner or
/// an expired lease is dropped here and returned as `old`: dropping
/// needs no memory, so this works on a server out of memory), or {1}
/// if nothing records it.
const CLAIM: &str = concat!(
    r#"
local cur = redis.call('HGET', KEYS[1], 'gen')
if not cur and redis.call('EXISTS', KEYS[1]) == 1 then cur = '0' end
if cur == ARGV[1] then return {0} end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return {1} end
if string.sub(v, 1, 4) == 'old ' then return {1, v} end
local e, c, g, u, o = string.match(v, '^put (%d+) (%d+) (%d+) (%d+) (.+)$')
if not e then return {0} end
if o ~= ARGV[2] then
"#,
    now_ms!(),
    r#"
  if tonumber(e) > now then return {0} end
end
redis.call('HDEL', KEYS[2], ARGV[1])
return {1, 'old ' .. c .. ' ' .. g .. ' ' .. u}
"#
);

/// KEYS meta, gens; ARGV id, owner: drops the `put` record of id if it
/// is owner's (an upload that stopped and removed its chunks).
const DROP_OWN: &str = r#"
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v and string.match(v, '^put %d+ %d+ %d+ %d+ (.+)$') == ARGV[2] then
  return redis.call('HDEL', KEYS[2], ARGV[1])
end
return 0
"#;

/// KEYS meta, gens; ARGV id, record: drops the record if unchanged.
const FORGET: &str = r#"
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[2], ARGV[1])
end
return 0
"#;

/// A write-back of part of a chunk that does not create a missing key
/// (a removed generation's): KEYS chunk; ARGV offset, bytes. Nil if the
/// key is missing, else `SETRANGE`'s reply.
pub(crate) const SETRANGE_IF_EXISTS: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('SETRANGE', KEYS[1], ARGV[1], ARGV[2])
end
return false
"#;

/// A generation `put` or `gc` removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// Its id (0: keys written before generations).
    pub generation: u64,
    /// Why it was removable.
    pub reason: String,
    /// Keys removed.
    pub keys: u64,
}

/// What [`RedisStore::replace`](crate::RedisStore::replace) did.
#[derive(Debug, Clone)]
pub struct Replaced {
    /// The store now (its new generation).
    pub info: StoreInfo,
    /// The generation it replaced (`None`: there was no store).
    pub previous: Option<u64>,
    /// Generations removed: the replaced one, and leftovers of uploads
    /// that ended.
    pub removed: Vec<Removed>,
    /// What could not be removed, and why (`gc` removes it later).
    pub left: Vec<String>,
}

/// What [`RedisStore::gc`](crate::RedisStore::gc) did.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// The store's generation (`None`: no metadata).
    pub current: Option<u64>,
    /// Generations (or stray keys of one) removed.
    pub removed: Vec<Removed>,
    /// Uploads in progress, kept: id and who runs it.
    pub uploading: Vec<(u64, String)>,
    /// What could not be removed, and why.
    pub left: Vec<String>,
}

/// A script on the store's metadata slot.
fn script<T: redis::FromRedisValue>(
    client: &Client,
    op: &str,
    body: &str,
    args: &[&str],
) -> Result<T, RedisStoreError> {
    let meta = meta_key(&client.name);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(body).arg(2).arg(&meta).arg(gens_key(&client.name));
    for a in args {
        cmd.arg(*a);
    }
    client.query(op, &meta, &cmd)
}

/// The store's metadata, `None` if there is none.
pub(crate) fn read_meta(client: &Client) -> Result<Option<StoreInfo>, RedisStoreError> {
    let key = meta_key(&client.name);
    let mut cmd = redis::cmd("HGETALL");
    cmd.arg(&key);
    let map: HashMap<String, String> = client.query("reading metadata", &key, &cmd)?;
    if map.is_empty() {
        return Ok(None);
    }
    info_from_meta(&map)
        .map(Some)
        .map_err(|reason| RedisStoreError::BadMeta {
            what: client.what.to_string(),
            key,
            reason,
        })
}

/// Unlinks `keys` in pipelines; the number that existed.
fn unlink(
    client: &Client,
    what: &str,
    keys: impl Iterator<Item = String>,
) -> Result<u64, RedisStoreError> {
    let mut removed = 0;
    let mut batch: Vec<Cmd> = Vec::with_capacity(UNLINK_BATCH);
    let mut first = String::new();
    let mut flush = |batch: &mut Vec<Cmd>, first: &str| -> Result<(), RedisStoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let replies = client.pipeline(what, first, batch)?;
        removed += replies
            .iter()
            .map(|v| match v {
                Value::Int(n) => *n as u64,
                _ => 0,
            })
            .sum::<u64>();
        batch.clear();
        Ok(())
    };
    for k in keys {
        if batch.is_empty() {
            first.clone_from(&k);
        }
        let mut c = redis::cmd("UNLINK");
        c.arg(k);
        batch.push(c);
        if batch.len() == UNLINK_BATCH {
            flush(&mut batch, &first)?;
        }
    }
    flush(&mut batch, &first)?;
    Ok(removed)
}

/// Removes the chunks a record names (after `CLAIM` said they may go),
/// then the record.
fn remove_recorded(client: &Client, id: u64, value: &str) -> Result<u64, RedisStoreError> {
    let (_, group, upto) = Record::parse(value)
        .ok_or_else(|| RedisStoreError::BadMeta {
            what: client.what.to_string(),
            key: gens_key(&client.name),
            reason: format!("generation {id}'s record {value:?} does not parse"),
        })?
        .extent();
    let name = client.name.clone();
    let n = unlink(
        client,
        &format!("removing generation {id}"),
        (0..upto).map(|c| chunk_key(&name, group, id, c)),
    )?;
    let _: i64 = script(
        client,
        "dropping a generation's record",
        FORGET,
        &[&id.to_string(), value],
    )?;
    Ok(n)
}

/// Claims generation `id` (`owner`: the owner judged ended, or ''),
/// then removes what its record names; `None` if it is not removable.
fn claim_and_remove(client: &Client, id: u64, owner: &str) -> Result<Option<u64>, RedisStoreError> {
    let ids = id.to_string();
    let out: Vec<Value> = script(client, "claiming a generation", CLAIM, &[&ids, owner])?;
    match (out.first(), out.get(1)) {
        (Some(Value::Int(1)), Some(Value::BulkString(rec))) => {
            remove_recorded(client, id, &String::from_utf8_lossy(rec)).map(Some)
        }
        // Nothing records it (removed by another `gc`): no chunks known.
        (Some(Value::Int(1)), None) => Ok(Some(0)),
        _ => Ok(None),
    }
}

/// Removes the generations the records name as removable (`old`, and
/// uploads whose process ended or, on another host, whose lease ran
/// out); lists the uploads that may still run (an upload whose process
/// runs on this host is one, whatever its lease).
fn sweep_records(client: &Client, report: &mut GcReport) -> Result<(), RedisStoreError> {
    let key = gens_key(&client.name);
    let mut all = redis::cmd("HGETALL");
    all.arg(&key);
    let recs: HashMap<String, String> = client.query("reading generation records", &key, &all)?;
    let mut recs: Vec<(u64, Record)> = recs
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, Record::parse(v)?)))
        .collect();
    recs.sort_by_key(|(id, _)| *id);
    for (id, rec) in recs {
        let (owner, reason) = match &rec {
            Record::Old { .. } => (
                String::new(),
                "replaced (its removal had not finished)".into(),
            ),
            Record::Put { owner, .. } => match owner::liveness(owner) {
                // Alive on this host: kept whatever its lease says (a
                // slow upload is not taken from a running process).
                owner::Liveness::Running => {
                    report.uploading.push((id, owner::describe(owner)));
                    continue;
                }
                owner::Liveness::Ended => (
                    owner.clone(),
                    format!("an upload by {} that ended", owner::describe(owner)),
                ),
                owner::Liveness::Elsewhere => (
                    String::new(),
                    format!(
                        "an upload by {} whose lease ran out",
                        owner::describe(owner)
                    ),
                ),
            },
        };
        let res = claim_and_remove(client, id, &owner);
        match res {
            Ok(Some(keys)) => report.removed.push(Removed {
                generation: id,
                reason,
                keys,
            }),
            Ok(None) => {
                if let Record::Put { owner, .. } = &rec {
                    report.uploading.push((id, owner::describe(owner)));
                }
            }
            Err(e) => report.left.push(format!("generation {id}: {e}")),
        }
    }
    Ok(())
}

/// `put`: see the module docs.
pub(crate) fn put(
    client: &Client,
    mut src: impl Read,
    len: u64,
    mut progress: impl FnMut(u64),
) -> Result<Replaced, RedisStoreError> {
    client
        .cfg
        .check_put()
        .map_err(|reason| RedisStoreError::Config {
            what: client.what.to_string(),
            reason,
        })?;
    let chunk = client.cfg.chunk_bytes;
    let group = client.cfg.group_chunks;
    // Leftovers of ended uploads and unfinished removals go first.
    let mut swept = GcReport::default();
    sweep_records(client, &mut swept)?;
    let me = owner::me();
    let lease = LEASE.as_millis().to_string();
    let id: u64 = script(
        client,
        "claiming a new generation",
        BEGIN,
        &[&lease, &chunk.to_string(), &group.to_string(), me],
    )?;
    let mut upto = 0;
    let sum = match upload(client, id, &mut src, len, &mut progress, &mut upto) {
        Ok(sum) => sum,
        Err(e) => return Err(abandon(client, id, upto, e)),
    };
    let ids = id.to_string();
    let sumhex = format!("{sum:016x}");
    let args = [
        ids.as_str(),
        me,
        &len.to_string(),
        &chunk.to_string(),
        &group.to_string(),
        &sumhex,
    ];
    let out: Result<Vec<Value>, _> =
        script(client, "switching to the new generation", COMMIT, &args);
    let info = StoreInfo {
        len,
        chunk_bytes: chunk,
        group_chunks: group,
        checksum: sum,
        generation: id,
    };
    let mut left = swept.left;
    let previous = match out {
        Ok(v) if matches!(v.first(), Some(Value::Int(1))) => match (v.get(1), v.get(2)) {
            (Some(Value::BulkString(og)), Some(Value::BulkString(rec))) => Some((
                String::from_utf8_lossy(og).into_owned(),
                String::from_utf8_lossy(rec).into_owned(),
            )),
            _ => None,
        },
        // A lost reply, or a retried switch that already happened: the
        // metadata tells.
        res => match read_meta(client) {
            Ok(Some(now)) if now.generation == id => {
                left.push(format!(
                    "the generation this one replaced was not recorded ({}); `gc` removes it",
                    res.err()
                        .map_or("its switch was retried".into(), |e| e.to_string())
                ));
                None
            }
            _ => {
                let e = res.err().unwrap_or_else(|| RedisStoreError::Lost {
                    what: client.what.to_string(),
                    generation: id,
                    reason: "its record was taken before the switch".into(),
                });
                return Err(abandon(client, id, upto, e));
            }
        },
    };
    let mut removed = swept.removed;
    let prev_id = match previous {
        Some((og, rec)) => {
            let og_id: u64 = og.parse().unwrap_or(0);
            match remove_recorded(client, og_id, &rec) {
                Ok(keys) => removed.push(Removed {
                    generation: og_id,
                    reason: format!("replaced by generation {id}"),
                    keys,
                }),
                Err(e) => left.push(format!(
                    "generation {og} (replaced) was not removed: {e}; `gc` removes it"
                )),
            }
            Some(og_id)
        }
        None => None,
    };
    Ok(Replaced {
        info,
        previous: prev_id,
        removed,
        left,
    })
}

/// Writes the chunks of generation `id`; the checksum.
/// `upto` is kept at the chunks recorded (what an abandon removes).
fn upload(
    client: &Client,
    id: u64,
    src: &mut impl Read,
    len: u64,
    progress: &mut impl FnMut(u64),
    upto: &mut u64,
) -> Result<u64, RedisStoreError> {
    let chunk = client.cfg.chunk_bytes;
    let group = client.cfg.group_chunks;
    let per = batch_chunks(chunk) as u64 * chunk as u64;
    let mut buf = vec![0u8; per.min(len) as usize];
    let (me, lease, ids) = (owner::me(), LEASE.as_millis().to_string(), id.to_string());
    let mut h = FNV_START;
    let mut done = 0u64;
    while done < len {
        let n = ((len - done) as usize).min(buf.len());
        src.read_exact(&mut buf[..n])
            .map_err(|source| RedisStoreError::Io {
                op: "reading the source",
                source,
            })?;
        h = checksum(h, &buf[..n]);
        let first = done / chunk as u64;
        let end = (done + n as u64).div_ceil(chunk as u64);
        // Recorded before the chunks are: a removal covers them.
        let ours: i64 = script(
            client,
            "renewing the upload's claim",
            RENEW,
            &[&ids, &lease, &end.to_string(), me],
        )?;
        if ours != 1 {
            return Err(RedisStoreError::Lost {
                what: client.what.to_string(),
                generation: id,
                reason: format!(
                    "its record was taken (the upload stalled past its {} s lease and was claimed by a `gc` or `put`)",
                    LEASE.as_secs()
                ),
            });
        }
        *upto = end;
        let cmds: Vec<Cmd> = buf[..n]
            .chunks(chunk)
            .enumerate()
            .map(|(i, data)| {
                let mut c = redis::cmd("SET");
                c.arg(chunk_key(&client.name, group, id, first + i as u64))
                    .arg(data);
                c
            })
            .collect();
        client.pipeline(
            "writing chunks",
            &chunk_key(&client.name, group, id, first),
            &cmds,
        )?;
        done += n as u64;
        progress(done);
    }
    Ok(h)
}

/// An upload of `id` stopped with `cause`: removes the chunks it
/// recorded (`0..upto`; directly, not through a claim, so a server out
/// of memory takes it), then its record, and says so. Never called
/// once the metadata names `id`.
fn abandon(client: &Client, id: u64, upto: u64, cause: RedisStoreError) -> RedisStoreError {
    let name = client.name.clone();
    let group = client.cfg.group_chunks;
    let keys = (0..upto).map(|c| chunk_key(&name, group, id, c));
    let cleanup = match unlink(client, &format!("removing generation {id}"), keys) {
        Ok(n) => {
            let ids = id.to_string();
            match script::<i64>(client, "dropping the upload's record", DROP_OWN, &[&ids, owner::me()]) {
                Ok(_) => format!("its {n} chunk keys were removed"),
                Err(e) => format!(
                    "its {n} chunk keys were removed, its record was left ({e}); `faultline store gc` removes it once this process has ended"
                ),
            }
        }
        Err(e) => format!(
            "its chunks were not removed ({e}); `faultline store gc` removes them once this process has ended"
        ),
    };
    RedisStoreError::Abandoned {
        what: client.what.to_string(),
        generation: id,
        cleanup,
        source: Box::new(cause),
    }
}

/// `gc`: see the module docs.
pub(crate) fn gc(client: &Client) -> Result<GcReport, RedisStoreError> {
    let mut report = GcReport::default();
    sweep_records(client, &mut report)?;
    // The metadata after the sweep: a switch during the walk makes the
    // walk keep keys it could have removed (the next `gc` does), never
    // the reverse (CLAIM is asked before any removal).
    let current = read_meta(client)?;
    report.current = current.map(|i| i.generation);
    let mut stray: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let name = client.name.clone();
    client.scan(&scan_pattern(&name), |keys| {
        for k in keys {
            let Some(ck) = parse_chunk_key(&k, &name) else {
                continue;
            };
            if current.is_some_and(|i| ck.belongs_to(&i)) {
                continue;
            }
            stray.entry(ck.generation).or_default().push(k);
        }
        Ok(())
    })?;
    for (id, mut keys) in stray {
        if report.uploading.iter().any(|(u, _)| *u == id) {
            continue;
        }
        keys.sort();
        keys.dedup();
        let reason = if current.is_some_and(|i| i.generation == id) {
            // Past the current generation's end (or under another tag):
            // nothing writes there.
            "past the end of the store's current generation".to_string()
        } else {
            let out: Vec<Value> = script(
                client,
                "claiming a generation",
                CLAIM,
                &[&id.to_string(), ""],
            )?;
            if !matches!(out.first(), Some(Value::Int(1))) {
                continue;
            }
            if id == 0 {
                "keys written before generations that no metadata names".into()
            } else {
                "no metadata or upload names it".into()
            }
        };
        match unlink(
            client,
            &format!("removing generation {id}"),
            keys.into_iter(),
        ) {
            Ok(n) => report.removed.push(Removed {
                generation: id,
                reason,
                keys: n,
            }),
            Err(e) => report.left.push(format!("generation {id}: {e}")),
        }
    }
    Ok(report)
}
