//! `faultline bench store`: a Redis-backed region against the local file
//! store, same run, same engine, medians.
//!
//! 1. **seq**: sequential first touch (one read per page) of a region with
//!    fault-around 64, pages from Redis (unix socket) vs from a `FileStore`
//!    on a file in the page cache (copied, not zero copy). Target: Redis
//!    <= 2x the file store per page.
//!
//!    **flush**: every page of the same region dirtied (a budget tracks
//!    them), then one `Region::flush`: Redis with its batched write-back
//!    (64 pages per pipeline), the same store written one page per
//!    pipeline (the baseline), and the file store.
//! 2. **bfs**: a level-synchronous BFS over an R-MAT graph (`--scale`,
//!    default 20) whose region reads Redis, with the default adaptive
//!    read-ahead, vs the same region over the file. Target: <= 3x.
//! 3. **throughput**: first touch of a Redis-backed region by 4 threads,
//!    served by the workers engine with 1 then 2 handler threads. Target:
//!    2 handlers >= 1.6x the pages per second of 1.
//!
//! Every configuration runs `--reps` times, interleaved, and the median is
//! reported with the load average. Unless `--url` names a server, the bench
//! starts its own `redis-server` on a unix socket in a temporary directory
//! (pinned to `--server-cpus`, default the last CPU, the poll handler's:
//! on a 2-vCPU guest a request and its reply then switch threads on one
//! CPU instead of waking a halted vCPU) and stops it at the end. The
//! sequential run prints where the fill time went (send, wait for the
//! first reply byte, read) and how many fills were read ahead; the
//! throughput run prints the server's CPU share (`INFO cpu`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use faultline::{engine, Engine, EngineConfig, EngineKind, FileStore, PageStore, Region};
use faultline_cli_support::cleanup;
use faultline_redis::server::RedisServer;
use faultline_redis::{FillTiming, RedisConfig, RedisStore};

use crate::graph::bfs::bfs_parallel;
use crate::graph::csr::read_layout;
use crate::graph::rmat::{generate, GenOptions, RmatParams};
use crate::graph::source::{FaultlineOptions, FaultlineSource, GraphSource};
use crate::harness::report::Record;
use crate::harness::stats::median;
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

/// Arguments of `faultline bench store`.
#[derive(clap::Args, Clone, Debug)]
pub struct StoreArgs {
    /// A Redis server to use, as a base URL without a store name
    /// (`redis+unix:///run/redis.sock`, `redis://127.0.0.1:6379`). Default:
    /// start a `redis-server` on a unix socket in a temporary directory.
    #[arg(long)]
    pub url: Option<String>,
    /// MiB touched by the sequential and throughput runs (1 to what
    /// MemAvailable holds).
    #[arg(long, default_value_t = 64, value_parser = faultline_cli_support::flags::mib())]
    pub mib: usize,
    /// Runs per configuration (the median is reported; 1 to 1000).
    #[arg(long, default_value_t = 5, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
    /// R-MAT scale of the BFS graph (2^scale vertices, edge factor 16); 0
    /// skips the BFS (0 to 40).
    #[arg(long, default_value_t = 20, value_parser = faultline_cli_support::flags::range_u32(0, crate::graph::rmat::MAX_SCALE))]
    pub scale: u32,
    /// Bytes per Redis key, or a comma-separated list: the sequential run
    /// measures each (the first is the one the target line and the other
    /// runs use). Each a power of two from 512 to 536870912 (512 MiB).
    #[arg(long, value_delimiter = ',', default_value = "65536", value_parser = faultline_cli_support::flags::power_of_two(faultline_redis::MIN_CHUNK, faultline_redis::MAX_CHUNK))]
    pub chunk: Vec<usize>,
    /// CPUs of the bench's own redis-server (a `taskset` list, e.g. `1`,
    /// `0-1` or `0,2`, of CPUs this process may run on); `last` (the
    /// default) is the last of those, where the poll engine pins its
    /// handler thread, so a request and its reply switch threads on one
    /// CPU instead of waking the other. Ignored with --url.
    #[arg(long, default_value = "last")]
    pub server_cpus: String,
}

/// What `bench store` needs, checked before any bench runs (before
/// redis-server starts): each --chunk named once, and (without --url)
/// --server-cpus a list of CPUs this process may run on.
pub fn check(args: &StoreArgs) -> anyhow::Result<()> {
    super::named_once("--chunk", &args.chunk)?;
    if args.url.is_none() {
        server_cpus(&args.server_cpus)?;
    }
    Ok(())
}

/// `--server-cpus` as the `taskset` list to pin redis-server to: `last`
/// resolved to the last CPU this process may run on (the one the poll
/// engine pins its handler to), any other list checked to be a `taskset`
/// list (`N`, `N-M`, `N-M:S`, comma-separated) of CPUs this process may
/// run on.
fn server_cpus(arg: &str) -> anyhow::Result<String> {
    let allowed = faultline_sys::thread::allowed_cpus().context("sched_getaffinity")?;
    if arg == "last" {
        let last = allowed.last().context("this process may run on no CPU")?;
        return Ok(last.to_string());
    }
    let cpus = cpu_list(arg).with_context(|| {
        format!("--server-cpus {arg:?}: not a CPU list (`1`, `0-1`, `0,2`, `0-6:2`) or `last`")
    })?;
    if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
        anyhow::bail!(
            "--server-cpus {arg}: CPU {c} is not one this process may run on ({})",
            fmt_cpus(&allowed)
        );
    }
    Ok(arg.to_string())
}

/// The CPUs of a `taskset -c` list: `N`, `N-M` or `N-M:S`, comma-separated.
fn cpu_list(s: &str) -> anyhow::Result<Vec<usize>> {
    let num = |t: &str| -> anyhow::Result<usize> {
        t.trim()
            .parse::<usize>()
            .with_context(|| format!("{t:?} is not a CPU number"))
    };
    let mut cpus = Vec::new();
    for item in s.split(',') {
        let (range, stride) = match item.split_once(':') {
            Some((r, st)) => (r, num(st)?),
            None => (item, 1),
        };
        anyhow::ensure!(stride >= 1, "{item:?}: a stride of 0");
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(range)?, num(range)?),
        };
        anyhow::ensure!(lo <= hi, "{item:?}: a range from {lo} down to {hi}");
        anyhow::ensure!(
            hi < 1 << 16,
            "{item:?}: CPU {hi} is past any machine's (at most 65535)"
        );
        cpus.extend((lo..=hi).step_by(stride));
    }
    Ok(cpus)
}

/// CPUs as a compact list: `0-3,6`.
fn fmt_cpus(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".to_string()
    } else {
        format!("CPUs {}", out.join(","))
    }
}

/// The 1, 5 and 15 minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn thread_engine(kind: EngineKind, workers: usize) -> anyhow::Result<Arc<dyn Engine>> {
    engine::create(
        kind,
        EngineConfig {
            workers,
            ..EngineConfig::default()
        },
    )
    .with_context(|| format!("creating the {} engine", kind.name()))
}

/// What the bench's temporary files are named:
/// `faultline-bench-store-PID-TAG`.
const TEMP_PREFIX: &str = "faultline-bench-store-";

/// A temporary file, `$TMPDIR/faultline-bench-store-PID-TAG`: a cleanup
/// temporary, removed when dropped (an error included), on SIGINT,
/// SIGTERM and SIGHUP, and by a later run once PID is gone.
struct Temp(
    PathBuf,
    #[allow(dead_code, reason = "removes the file when dropped")] cleanup::Guard,
);

impl Temp {
    fn new(tag: &str) -> Temp {
        let guard = cleanup::temp(&std::env::temp_dir(), TEMP_PREFIX, &format!("-{tag}"));
        Temp(guard.path().to_path_buf(), guard)
    }
}

/// Seconds to read one byte of every page of `r` from `threads` threads,
/// each taking its own contiguous share.
fn first_touch(r: &Region, threads: usize) -> f64 {
    let base = r.as_ptr() as usize;
    let pages = r.pages();
    let ps = r.len() / pages;
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..threads {
            let (from, to) = (pages * k / threads, pages * (k + 1) / threads);
            s.spawn(move || {
                let mut sum = 0u64;
                for pg in from..to {
                    // SAFETY: inside the region, which outlives the scope.
                    sum += unsafe { std::ptr::read_volatile((base + pg * ps) as *const u8) } as u64;
                }
                std::hint::black_box(sum);
            });
        }
    });
    t.elapsed().as_secs_f64()
}

fn record(bench: &str, mechanism: &str, ns: &mut [f64]) -> Record {
    Record::new(bench, mechanism, "COPY", "read", &Summary::from_ns(ns))
}

/// Runs `faultline bench store`.
pub fn run(ctx: &mut BenchCtx, args: &StoreArgs) -> anyhow::Result<()> {
    let reps = args.reps.max(1);
    // The files killed runs left (the data, the graph).
    cleanup::sweep_prefixed(&std::env::temp_dir(), TEMP_PREFIX);
    let server = match &args.url {
        Some(_) => None,
        None => Some(RedisServer::start().context("starting redis-server")?),
    };
    // The server stops itself and removes its socket's directory on drop;
    // a signal ending the bench gives them back too.
    let _on_signal: Vec<cleanup::SignalGuard> = server
        .iter()
        .flat_map(|s| {
            let pid = s.pid().map(cleanup::kill_on_signal);
            let dir = s
                .socket()
                .and_then(Path::parent)
                .map(cleanup::remove_on_signal);
            pid.into_iter().chain(dir)
        })
        .collect();
    let placement = match &server {
        Some(s) => {
            // Checked before the server started (`check`).
            let cpus = server_cpus(&args.server_cpus)?;
            s.pin(&cpus).context("pinning redis-server")?;
            format!("redis-server on CPUs {cpus}")
        }
        None => "redis-server placement unknown (--url)".to_string(),
    };
    let base = match (&args.url, &server) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.url(),
        (None, None) => unreachable!("a server or a URL"),
    };
    println!(
        "\n== store: Redis ({base}, {placement}) vs the local file store; load average {}",
        loadavg()
    );
    let steps = if args.scale > 0 { 5 } else { 4 };
    let mut progress = ctx.progress(steps, "store");

    // The data: a file in the page cache and the same bytes in Redis.
    progress.step("uploading");
    let len = args.mib << 20;
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(0x9e37_79b9) as u8 ^ (i >> 12) as u8)
        .collect();
    let file = Temp::new("seq");
    File::create(&file.0)
        .and_then(|mut f| f.write_all(&data))
        .with_context(|| format!("writing {}", file.0.display()))?;
    anyhow::ensure!(
        !args.chunk.is_empty() && args.chunk.iter().all(|c| c.is_power_of_two() && *c >= 512),
        "--chunk: powers of two of at least 512"
    );
    let chunk = args.chunk[0];
    let urls: Vec<String> = args
        .chunk
        .iter()
        .map(|c| format!("{base}#bench-seq-{c}"))
        .collect();
    for (url, &c) in urls.iter().zip(&args.chunk) {
        RedisStore::put(
            url,
            RedisConfig::with_chunk(c),
            &data[..],
            len as u64,
            |_| {},
        )
        .context("uploading the sequential data")?;
    }
    let seq_url = urls[0].clone();
    drop(data);

    // 1. Sequential first touch, fault-around 64, poll engine for both.
    progress.step("sequential first touch");
    let poll = thread_engine(EngineKind::Poll, 1)?;
    let pages = len / 4096;
    // Per chunk size: ns per page of each run, and the fill timing summed.
    let mut per_chunk: Vec<(Vec<f64>, FillTiming)> =
        vec![(Vec::new(), FillTiming::default()); urls.len()];
    let mut file_ns = Vec::new();
    for _ in 0..reps {
        for k in 0..=urls.len() {
            let (store, redis): (Arc<dyn PageStore>, Option<Arc<RedisStore>>) = if k < urls.len() {
                let s = Arc::new(RedisStore::open(&urls[k])?);
                (s.clone(), Some(s))
            } else {
                (Arc::new(FileStore::open(&file.0)?), None)
            };
            let r = Region::builder(len)
                .shared_store(store)
                .fault_around(64)
                .zero_copy(false)
                .build_dyn(poll.clone())?;
            let secs = first_touch(&r, 1);
            let per_page = secs * 1e9 / pages as f64;
            match redis {
                Some(s) => {
                    let t = s.timing();
                    let acc = &mut per_chunk[k];
                    acc.0.push(per_page);
                    acc.1.calls += t.calls;
                    acc.1.bytes += t.bytes;
                    acc.1.send_ns += t.send_ns;
                    acc.1.wait_ns += t.wait_ns;
                    acc.1.read_ns += t.read_ns;
                    acc.1.ahead_hits += t.ahead_hits;
                    acc.1.ahead_dropped += t.ahead_dropped;
                }
                None => file_ns.push(per_page),
            }
        }
    }
    let seq_file_med = median(&mut file_ns.clone());
    for (k, (ns, t)) in per_chunk.iter().enumerate() {
        let pages_read = (t.bytes / 4096).max(1) as f64;
        let m = median(&mut ns.clone());
        progress.suspend(|| {
            println!(
                "  seq, {} KiB keys: redis {m:.0} ns/page (runs {}), {:.2}x the file store; fill time per page: send {:.0} ns, wait for the first reply byte {:.0} ns, read {:.0} ns ({} fills of {:.0} KiB, {} read ahead, {} read ahead and dropped)",
                args.chunk[k] >> 10,
                ns.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(" "),
                m / seq_file_med,
                t.send_ns as f64 / pages_read,
                t.wait_ns as f64 / pages_read,
                t.read_ns as f64 / pages_read,
                t.calls,
                t.bytes as f64 / t.calls.max(1) as f64 / 1024.0,
                t.ahead_hits,
                t.ahead_dropped,
            )
        });
        if k > 0 {
            ctx.report.records.push(
                record("store-seq", "redis", &mut ns.clone())
                    .with("chunk", args.chunk[k])
                    .with("ratio_to_file", m / seq_file_med)
                    .with("fault_around", 64)
                    .with("loadavg", loadavg()),
            );
        }
    }
    let redis_ns = per_chunk[0].0.clone();
    let (seq_redis, seq_file) = (median(&mut redis_ns.clone()), median(&mut file_ns.clone()));
    let seq_ratio = seq_redis / seq_file;
    ctx.report.records.push(
        record("store-seq", "redis", &mut redis_ns.clone())
            .with("chunk", chunk)
            .with("ratio_to_file", seq_ratio)
            .with("fault_around", 64)
            .with("loadavg", loadavg()),
    );
    ctx.report.records.push(
        record("store-seq", "file", &mut file_ns.clone())
            .with("fault_around", 64)
            .with("loadavg", loadavg()),
    );
    progress.suspend(|| {
        println!(
            "seq first touch, fault-around 64, poll engine, {} MiB, {} KiB keys, {reps} runs: redis {seq_redis:.0} ns/page, file {seq_file:.0} ns/page (runs {}), ratio {seq_ratio:.2}x (target <= 2x: {}); load {}",
            args.mib,
            chunk >> 10,
            file_ns.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(" "),
            if seq_ratio <= 2.0 { "met" } else { "missed" },
            loadavg()
        )
    });
    let seq_series = vec![
        (
            "redis".to_string(),
            redis_ns
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as f64 + 1.0, v))
                .collect(),
        ),
        (
            "file".to_string(),
            file_ns
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as f64 + 1.0, v))
                .collect(),
        ),
    ];

    // 1b. Write-back: every page of the region dirtied, then one flush
    //     (batches of 64 pages: one pipeline each for Redis).
    progress.step("flush");
    // [batched redis, redis one page per pipeline, file]
    let mut flush_ns: [Vec<f64>; 3] = Default::default();
    for _ in 0..reps {
        for (k, runs) in flush_ns.iter_mut().enumerate() {
            let store: Arc<dyn PageStore> = match k {
                0 => Arc::new(RedisStore::open(&seq_url)?),
                1 => Arc::new(PerPage(RedisStore::open(&seq_url)?)),
                _ => Arc::new(FileStore::open(&file.0)?),
            };
            let r = Region::builder(len)
                .shared_store(store)
                .fault_around(64)
                .zero_copy(false)
                .budget(faultline::EvictionConfig {
                    budget_pages: pages,
                    policy: faultline::policy::PolicyKind::Clock,
                })
                .build_dyn(poll.clone())?;
            for pg in 0..pages {
                // SAFETY: inside the region, which is writable.
                unsafe { *r.as_ptr().add(pg * 4096) ^= 1 };
            }
            let t = Instant::now();
            let n = r.flush().context("flush")?;
            let ns = t.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64;
            anyhow::ensure!(n == pages, "flush wrote {n} of {pages} pages");
            runs.push(ns);
        }
    }
    let [fb, fp, ff] = flush_ns.clone().map(|mut v| median(&mut v));
    for (k, what) in ["redis", "redis-per-page", "file"].into_iter().enumerate() {
        ctx.report.records.push(
            record("store-flush", what, &mut flush_ns[k].clone())
                .with("ratio_to_file", [fb, fp, ff][k] / ff)
                .with("loadavg", loadavg()),
        );
    }
    progress.suspend(|| {
        println!(
            "flush of {} MiB of dirty pages, {reps} runs: redis, 64 pages per pipeline {fb:.0} ns/page; redis, one pipeline per page {fp:.0} ns/page ({:.2}x faster batched); file {ff:.0} ns/page (redis batched {:.2}x the file); load {}",
            args.mib,
            fp / fb,
            fb / ff,
            loadavg()
        )
    });

    // 2. BFS over a Redis-backed region vs the file store.
    let mut bfs_ratio = None;
    if args.scale > 0 {
        progress.step("bfs");
        let graph = Temp::new("graph");
        let params = RmatParams {
            scale: args.scale,
            edge_factor: 16,
            seed: 1,
            scramble: true,
        };
        let opts = GenOptions {
            threads: 2,
            mem_limit: 4 << 30,
        };
        {
            let mut f = File::create(&graph.0)?;
            generate(&params, &opts, &mut f, &indicatif::ProgressBar::hidden())
                .context("generating the graph")?;
        }
        let layout = read_layout(&graph.0)?;
        let gurl = format!("{base}#bench-graph");
        let f = File::open(&graph.0)?;
        RedisStore::put(
            &gurl,
            RedisConfig::with_chunk(chunk),
            std::io::BufReader::new(f),
            layout.file_bytes(),
            |_| {},
        )
        .context("uploading the graph")?;
        let (mut rb, mut fb) = (Vec::new(), Vec::new());
        let bfs_reps = reps.min(3);
        let mut reach = None;
        for _ in 0..bfs_reps {
            for redis in [true, false] {
                let (secs, reached) = bfs_once(&graph.0, layout, redis.then_some(gurl.as_str()))?;
                anyhow::ensure!(
                    *reach.get_or_insert(reached) == reached,
                    "the BFS over Redis and over the file reached different vertex counts"
                );
                if redis { &mut rb } else { &mut fb }.push(secs * 1e9);
            }
        }
        let (br, bf) = (median(&mut rb.clone()), median(&mut fb.clone()));
        let ratio = br / bf;
        bfs_ratio = Some(ratio);
        ctx.report.records.push(
            record("store-bfs", "redis", &mut rb)
                .with("scale", args.scale)
                .with("ratio_to_file", ratio)
                .with("loadavg", loadavg()),
        );
        ctx.report.records.push(
            record("store-bfs", "file", &mut fb)
                .with("scale", args.scale)
                .with("loadavg", loadavg()),
        );
        progress.suspend(|| {
            println!(
                "bfs scale {}, {} MiB graph, poll engine, adaptive read-ahead, {bfs_reps} runs: redis {:.3} s, file {:.3} s, ratio {ratio:.2}x (target <= 3x: {}); load {}",
                args.scale,
                layout.file_bytes() >> 20,
                br / 1e9,
                bf / 1e9,
                if ratio <= 3.0 { "met" } else { "missed" },
                loadavg()
            )
        });
    }

    // 3. Throughput: workers engine, 1 vs 2 handler threads, 4 faulting
    //    threads, fault-around 16.
    progress.step("throughput");
    let mut tput: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // The server's CPU seconds per wall second, per configuration.
    let mut share: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let engines = [
        thread_engine(EngineKind::Workers, 1)?,
        thread_engine(EngineKind::Workers, 2)?,
    ];
    for _ in 0..reps {
        for (i, e) in engines.iter().enumerate() {
            let store = Arc::new(RedisStore::open(&seq_url)?);
            let cpu0 = store.server_cpu_seconds()?;
            let r = Region::builder(len)
                .shared_store(store.clone())
                .fault_around(16)
                .build_dyn(e.clone())?;
            let secs = first_touch(&r, 4);
            tput[i].push(pages as f64 / secs);
            share[i].push((store.server_cpu_seconds()? - cpu0) / secs);
        }
    }
    let (t1, t2) = (median(&mut tput[0].clone()), median(&mut tput[1].clone()));
    let scale_ratio = t2 / t1;
    for (i, t) in tput.iter().enumerate() {
        let mut ns: Vec<f64> = t.iter().map(|pps| 1e9 / pps).collect();
        ctx.report.records.push(
            record("store-throughput", "workers", &mut ns)
                .with("handler_threads", i + 1)
                .with("pages_per_s", median(&mut t.clone()))
                .with("loadavg", loadavg()),
        );
    }
    progress.suspend(|| {
        println!(
            "throughput, workers engine, 4 faulting threads, fault-around 16, {reps} runs: 1 handler {t1:.0} pages/s (runs {}), 2 handlers {t2:.0} pages/s (runs {}), ratio {scale_ratio:.2}x (target >= 1.6x: {}); redis-server busy {:.0}% / {:.0}% of a CPU (1 / 2 handlers, medians); load {}",
            tput[0].iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(" "),
            tput[1].iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(" "),
            if scale_ratio >= 1.6 { "met" } else { "missed" },
            100.0 * median(&mut share[0].clone()),
            100.0 * median(&mut share[1].clone()),
            loadavg()
        )
    });
    progress.finish();
    ctx.figure("store-seq", |dir, name| {
        crate::harness::plot::line_chart(
            dir,
            name,
            "Sequential first touch, fault-around 64: Redis vs file store",
            "run",
            "ns per page",
            &seq_series,
            false,
        )
    })?;
    let tput_series = vec![(
        "redis, workers engine".to_string(),
        vec![(1.0, t1), (2.0, t2)],
    )];
    ctx.figure("store-throughput", |dir, name| {
        crate::harness::plot::line_chart(
            dir,
            name,
            "First-touch throughput from Redis vs handler threads",
            "handler threads",
            "pages per second",
            &tput_series,
            false,
        )
    })?;
    println!(
        "store summary: seq {seq_ratio:.2}x, bfs {}, throughput 2/1 handlers {scale_ratio:.2}x; load {}",
        bfs_ratio.map_or("skipped".into(), |r| format!("{r:.2}x")),
        loadavg()
    );
    drop(server);
    Ok(())
}

/// A Redis store without its batched write-back (the default
/// `write_back_batch`: one pipeline per page), the baseline of the flush
/// run.
struct PerPage(RedisStore);

impl PageStore for PerPage {
    fn describe(&self) -> &str {
        self.0.describe()
    }
    fn len(&self) -> Option<u64> {
        self.0.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), faultline::StoreError> {
        self.0.fill(offset, buf)
    }
    fn fill_batch(
        &self,
        ranges: &mut [faultline::FillRange<'_>],
        out: &mut [Result<(), faultline::StoreError>],
    ) {
        self.0.fill_batch(ranges, out)
    }
    fn batched(&self) -> bool {
        true
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), faultline::StoreError> {
        self.0.write_back(offset, data)
    }
}

/// One BFS from vertex 0 over `graph` through a poll-engine region reading
/// `store` (or the file); seconds and vertices reached.
fn bfs_once(
    graph: &Path,
    layout: crate::graph::csr::CsrLayout,
    store: Option<&str>,
) -> anyhow::Result<(f64, u64)> {
    let src = FaultlineSource::open(
        graph,
        layout,
        FaultlineOptions {
            engine: EngineKind::Poll,
            page_size: 4096,
            readahead: None,
            file_access: faultline::FileAccess::Mmap,
            zero_copy: Some(false),
            budget: None,
            store,
        },
    )?;
    let t = Instant::now();
    let r = bfs_parallel(src.index(), src.edges(), 0, 1).context("BFS")?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(r.reached() > 1, "the BFS went nowhere");
    Ok((secs, r.reached()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_read_as_taskset_reads_them() {
        assert_eq!(cpu_list("1").unwrap(), [1]);
        assert_eq!(cpu_list("0-2,5").unwrap(), [0, 1, 2, 5]);
        assert_eq!(cpu_list("0-6:2").unwrap(), [0, 2, 4, 6]);
        for bad in ["", "x", "1-", "3-1", "0-4:0", "1,,2", "-1", "99999999"] {
            assert!(cpu_list(bad).is_err(), "{bad:?}");
        }
        assert_eq!(fmt_cpus(&[0, 1, 2, 3, 6]), "CPUs 0-3,6");
        assert_eq!(fmt_cpus(&[1]), "CPUs 1");
    }

    #[test]
    fn server_cpus_must_be_cpus_this_process_may_run_on() {
        let allowed = faultline_sys::thread::allowed_cpus().unwrap();
        let last = *allowed.last().unwrap();
        assert_eq!(server_cpus("last").unwrap(), last.to_string());
        assert_eq!(server_cpus(&last.to_string()).unwrap(), last.to_string());
        let e = server_cpus("4096").unwrap_err().to_string();
        assert!(
            e.contains("CPU 4096 is not one this process may run on"),
            "{e}"
        );
        let e = format!("{:#}", server_cpus("a-b").unwrap_err());
        assert!(e.contains("not a CPU list"), "{e}");
    }
}
