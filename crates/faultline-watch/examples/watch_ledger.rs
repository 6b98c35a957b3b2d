//! Watch one field of a real data structure: the balance of one account in
//! a ledger of 10,000 accounts that 200,000 random transfers update.
//!
//! ```text
//! cargo run --release -p faultline-watch --example watch_ledger            # automatic tier
//! cargo run --release -p faultline-watch --example watch_ledger -- page    # page protection only
//! ```
//!
//! Every write to the watched balance is reported with the value before and
//! after, the thread and the instruction; the program checks that the
//! reports add up to the balance's final value and that their number equals
//! the transfers that touched the account (nothing missed, nothing twice).

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use faultline_watch::{Hit, Watcher};
use rand::{Rng, SeedableRng};

#[derive(Clone)]
struct Account {
    id: u64,
    balance: i64,
    transfers: u32,
}

/// What the callback records: it runs in a signal handler, so it only
/// touches atomics (no allocation, no locks, no printing).
struct Events {
    n: AtomicUsize,
    net: AtomicI64,
    first: [AtomicU64; 8],
    ips: AtomicU64,
}

fn transfer(ledger: &mut [Account], from: usize, to: usize, amount: i64) {
    ledger[from].balance -= amount;
    ledger[from].transfers += 1;
    ledger[to].balance += amount;
    ledger[to].transfers += 1;
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let page_only = std::env::args().nth(1).as_deref() == Some("page");
    let mut ledger: Vec<Account> = (0..10_000)
        .map(|id| Account {
            id,
            balance: 1_000,
            transfers: 0,
        })
        .collect();
    let watched = 4242;
    let events = Arc::new(Events {
        n: AtomicUsize::new(0),
        net: AtomicI64::new(0),
        first: Default::default(),
        ips: AtomicU64::new(0),
    });
    let ev = events.clone();
    let watcher = Watcher::builder()
        .hardware(!page_only)
        .on_hit(move |h: &Hit| {
            let i = ev.n.fetch_add(1, SeqCst);
            let (before, after) = (h.before_u64() as i64, h.after_u64() as i64);
            ev.net.fetch_add(after - before, SeqCst);
            if let Some(slot) = ev.first.get(i) {
                slot.store(
                    ((before as u64) << 32) | (after as u64 & 0xffff_ffff),
                    SeqCst,
                );
            }
            ev.ips.store(h.ip, SeqCst);
        })
        .build()?;
    let start_balance = ledger[watched].balance;
    watcher.watch_value(&ledger[watched].balance)?;

    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut touching = 0usize;
    for _ in 0..200_000 {
        let from = rng.gen_range(0..ledger.len());
        let mut to = rng.gen_range(0..ledger.len());
        if to == from {
            to = (to + 1) % ledger.len();
        }
        // Bias some traffic toward the watched account.
        let (from, to) = if rng.gen_ratio(1, 500) {
            (watched, to)
        } else {
            (from, to)
        };
        if from == watched || to == watched {
            touching += 1;
        }
        transfer(&mut ledger, from, to, rng.gen_range(1..50));
    }
    let stats = watcher.stats();
    drop(watcher);

    let n = events.n.load(SeqCst);
    let net = events.net.load(SeqCst);
    println!(
        "watched account #{} balance: {} -> {} over {} transfers touching it",
        ledger[watched].id, start_balance, ledger[watched].balance, touching
    );
    for (i, slot) in events.first.iter().enumerate().take(n.min(8)) {
        let v = slot.load(SeqCst);
        println!(
            "  write {}: {} -> {}",
            i + 1,
            (v >> 32) as i32,
            (v & 0xffff_ffff) as i32
        );
    }
    println!(
        "reports: {n} (net change {net}), last writer ip {:#x}",
        events.ips.load(SeqCst)
    );
    println!(
        "tier: {}; faults {}, false positives {}, emulated {}, single-stepped {}, debug-register hits {}",
        if stats.hw_watches > 0 { "debug register" } else { "page protection" },
        stats.faults,
        stats.false_positives,
        stats.emulated,
        stats.single_stepped,
        stats.hw_hits
    );
    assert_eq!(n, touching, "one report per write to the balance");
    assert_eq!(
        start_balance + net,
        ledger[watched].balance,
        "reports add up"
    );
    println!("ok: every write to the watched balance was reported once");
    Ok(())
}
