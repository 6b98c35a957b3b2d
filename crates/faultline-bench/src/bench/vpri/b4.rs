//! B4 (Fig 15): fault-worker scaling, the paper's serialized IOPF worker
//! against per-tenant (vCPU-affined) workers.
//!
//! K devices, one per tenant (the paper's VMs), each injects I/O faults at
//! `rate`/s (Poisson arrivals, seeded): a read into a page that is not
//! there, whose store fill takes `store_ms` (the paper's 5,000 us). Modes:
//! one tenant with a single [`WorkerMode::Serialized`] worker for all
//! devices, or a tenant per device with its own worker
//! ([`WorkerMode::Affined`], pinned to one of the machine's CPUs). The
//! figure is the mean post-to-response time of the fault queue
//! ([`faultline_io::TenantStats`]) as K grows, as a ratio to K = 1.
//!
//! The fill is a sleep (a store's wait), so K fault workers need no CPUs
//! of their own: this reproduces the queueing the paper measures, not
//! CPU contention, which a 2-vCPU machine could not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::testing::{Action, Fault, FaultyStore};
use faultline::{MemoryStore, PollEngine, Region};
use faultline_io::{Backend, DeviceConfig, IoDevice, Ordering, Tenant, TenantConfig, WorkerMode};
use faultline_sys::BASE_PAGE as PS;
use rand::{Rng, SeedableRng};

use crate::harness::paper::line;
use crate::harness::report::print_table;
use crate::harness::BenchCtx;

/// B4's settings (from `bench vpri`'s arguments).
pub(crate) struct B4 {
    /// Injected I/O faults per second per device.
    pub rate: f64,
    /// Seconds per point.
    pub secs: f64,
    /// Store latency of an injected fault, in ms.
    pub store_ms: f64,
}

/// Runs B4.
pub(crate) fn run(ctx: &mut BenchCtx, a: &B4) -> anyhow::Result<()> {
    println!(
        "\n== B4: fault-worker scaling (Fig 15): K devices x {} I/O faults/s, {} ms store, {} s per point ==",
        a.rate, a.store_ms, a.secs
    );
    let ks = [1usize, 2, 4, 8, 16];
    let cpus = faultline_sys::thread::online_cpus().max(1);
    let file = Arc::new(tempfile_one_page()?);
    let engine = PollEngine::new()?;
    let mut rows = Vec::new();
    let mut means: Vec<Vec<f64>> = Vec::new();
    let mut progress = crate::harness::progress::Progress::new((2 * ks.len()) as u64, "B4");
    for mode in [WorkerMode::Serialized, WorkerMode::Affined] {
        let mut m = Vec::new();
        for &k in &ks {
            progress.step(&format!("{mode:?} K={k}"));
            let tenants: Vec<Arc<Tenant>> = match mode {
                WorkerMode::Serialized => vec![Arc::new(Tenant::new(TenantConfig {
                    name: "serialized".into(),
                    mode,
                    ..Default::default()
                })?)],
                WorkerMode::Affined => (0..k)
                    .map(|i| {
                        Tenant::new(TenantConfig {
                            name: format!("vm{i}"),
                            cpus: vec![i % cpus],
                            mode,
                            ..Default::default()
                        })
                        .map(Arc::new)
                    })
                    .collect::<Result<_, _>>()?,
            };
            let pages = (a.rate * a.secs * 3.0) as usize + 64;
            let threads: Vec<_> = (0..k)
                .map(|i| {
                    let tenant = tenants[i % tenants.len()].clone();
                    let region = Region::builder(pages * PS)
                        .store(
                            FaultyStore::builder(MemoryStore::new(vec![0u8; pages * PS]))
                                .rule(Fault::fill(Action::Slow(Duration::from_secs_f64(
                                    a.store_ms / 1000.0,
                                ))))
                                .build(),
                        )
                        .fault_around(1)
                        .build(&engine);
                    let file = file.clone();
                    let (rate, secs) = (a.rate, a.secs);
                    std::thread::spawn(move || -> anyhow::Result<()> {
                        let dev = IoDevice::new(
                            Arc::new(region?),
                            &tenant,
                            DeviceConfig {
                                ordering: Ordering::Unordered,
                                unit_pages: 1,
                                ..Default::default()
                            },
                        )?;
                        let mut q = dev.queue(Backend::Syscall)?;
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(40 + i as u64);
                        let t0 = Instant::now();
                        let end = t0 + Duration::from_secs_f64(secs);
                        let mut next = t0;
                        let mut page = 0;
                        while Instant::now() < end || q.outstanding() > 0 {
                            if Instant::now() >= next && Instant::now() < end && page < pages {
                                q.read_at(&file, 0, page * PS, 64, page as u64)?;
                                page += 1;
                                let gap: f64 = -rng.gen::<f64>().max(1e-12).ln() / rate;
                                next += Duration::from_secs_f64(gap);
                            }
                            let wait = next.saturating_duration_since(Instant::now());
                            if let Some(c) = q.complete(
                                wait.clamp(Duration::from_micros(100), Duration::from_millis(100)),
                            ) {
                                anyhow::ensure!(c.result.is_ok(), "read failed: {:?}", c.result);
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for t in threads {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a device thread panicked"))??;
            }
            let (total, n) = tenants.iter().fold((0u64, 0u64), |(t, n), x| {
                let s = x.stats();
                (t + s.service_ns_total, n + s.resolved)
            });
            let mean_ms = total as f64 / n.max(1) as f64 / 1e6;
            m.push(mean_ms);
            rows.push(vec![
                format!("{mode:?}"),
                k.to_string(),
                n.to_string(),
                format!("{mean_ms:.2}"),
                format!("{:.2}", mean_ms / m[0]),
            ]);
        }
        means.push(m);
    }
    progress.finish();
    print_table(
        &[
            "workers",
            "devices",
            "faults served",
            "mean service ms",
            "vs K=1",
        ],
        &rows,
    );
    let last = ks.len() - 1;
    line(
        ctx,
        "fig15.serialized.lat_ratio_16x10",
        means[0][last] / means[0][0],
        "x",
        "10.4 (target >= 3)",
    );
    line(
        ctx,
        "fig15.affined.lat_ratio_16x10",
        means[1][last] / means[1][0],
        "x",
        "flat (target <= 1.3)",
    );
    Ok(())
}

/// A one-page file in the temp dir to read from (unlinked at once; a
/// cleanup temporary until then).
fn tempfile_one_page() -> anyhow::Result<std::fs::File> {
    let tmp = std::env::temp_dir();
    faultline_cli_support::cleanup::sweep_prefixed(&tmp, "faultline-b4-");
    let guard = faultline_cli_support::cleanup::temp(&tmp, "faultline-b4-", "");
    std::fs::write(guard.path(), vec![7u8; PS])?;
    let f = std::fs::File::open(guard.path())?;
    drop(guard);
    Ok(f)
}
