//! B5 (Fig 16, 17): the pinning policies (none, pin-all, simple LRU 10%,
//! ADP with the paper's 180 s threshold and with a derived one) on B5's
//! 14 VMs for one simulated hour at each overcommit r in {10, 20, 30}%,
//! under a reclaim model ([`B5Model`]): the I/O-fault reduction against no
//! pinning, the pinned memory, their ratio against simple LRU (RPR), where
//! the pinned memory went ([`PinLedger`]), the reclaimer's horizon, and
//! every model of `--b5-compare` beside the first. [`run`] is also B7's
//! entry ([`b7`]).

use std::collections::HashMap;

use faultline_io::adp::PinCause;

use super::b7;
use super::ledger::{PinLedger, PinUse};
use super::psi::{PsiCfg, Target, Window};
use super::round::{fleet, round, Reclaim, RoundCfg};
use super::trace::Class;
use super::{fmt_opt, line_opt, line_quiet_opt, ratio, reduction_pct};
use crate::harness::paper::line_quiet;
use crate::harness::progress::Progress;
use crate::harness::report::print_table;
use crate::harness::BenchCtx;

/// How B5 sets each VM's reclaim ratio at overcommit r.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum B5Model {
    /// Every VM at r all hour.
    Static,
    /// The paper's "reclaim ratio for each VM dynamically adjusted from 0%
    /// to 50%" as random redraws: each VM's ratio redrawn every S s as
    /// 0.5 U^(0.5/r - 1), within 0-50% with mean r (the period is ours;
    /// the paper gives none).
    Redraw(u64),
    /// The paper's mechanism: a server of (1 - r) memory whose reclaim is
    /// balanced across VMs by their pressure ([`psi`](super::psi)).
    Psi(Window, Target),
}

impl B5Model {
    /// `static`, `redraw` (every `every_s`), `psi` (the default PSI model),
    /// `psi-avg10`/`psi-avg60`/`psi-avg300` (the kernel's averages as the
    /// pressure), `psi-abs` (Senpai's absolute target).
    pub fn parse(s: &str, every_s: u64) -> anyhow::Result<B5Model> {
        Ok(match s {
            "static" => B5Model::Static,
            "redraw" => B5Model::Redraw(every_s.max(1)),
            "psi" => B5Model::Psi(Window::Senpai, Target::ServerMean),
            "psi-avg10" => B5Model::Psi(Window::Avg(10), Target::ServerMean),
            "psi-avg60" => B5Model::Psi(Window::Avg(60), Target::ServerMean),
            "psi-avg300" => B5Model::Psi(Window::Avg(300), Target::ServerMean),
            "psi-abs" => B5Model::Psi(Window::Senpai, Target::Senpai),
            _ => anyhow::bail!(
                "unknown reclaim model {s:?} (static, redraw, psi, psi-avg10, psi-avg60, psi-avg300, psi-abs)"
            ),
        })
    }

    fn reclaim(&self, r: f64) -> Reclaim {
        match *self {
            B5Model::Static => Reclaim::Fixed(r),
            B5Model::Redraw(every_s) => Reclaim::Drift {
                hi: 0.5,
                skew: 0.5 / r - 1.0,
                every_s,
            },
            B5Model::Psi(window, target) => Reclaim::Psi(PsiCfg { r, window, target }),
        }
    }

    /// The model as `--b5-reclaim`/`--b5-compare` name it (what [`parse`]
    /// reads back), for tables and `--json` labels.
    ///
    /// [`parse`]: B5Model::parse
    fn name(&self) -> String {
        match *self {
            B5Model::Static => "static".into(),
            B5Model::Redraw(_) => "redraw".into(),
            B5Model::Psi(window, target) => {
                let w = match window {
                    Window::Senpai => String::new(),
                    Window::Avg(w) => format!("-avg{w}"),
                };
                let t = match target {
                    Target::ServerMean => "",
                    Target::Senpai => "-abs",
                };
                format!("psi{w}{t}")
            }
        }
    }

    /// What the model does, for the heading.
    fn describe(&self) -> String {
        match *self {
            B5Model::Static => "every VM at r all hour".into(),
            B5Model::Redraw(s) => format!("each VM's ratio redrawn every {s} s"),
            B5Model::Psi(window, target) => {
                let w = match window {
                    Window::Senpai => "over Senpai's 6 s interval".to_string(),
                    Window::Avg(w) => format!("the kernel's avg{w}"),
                };
                let t = match target {
                    Target::ServerMean => "towards the server's mean pressure",
                    Target::Senpai => "towards Senpai's absolute 10 ms / 6 s",
                };
                format!("a server of 1 - r, each VM moved by its pressure (PSI {w}) {t}")
            }
        }
    }
}

/// A policy's results in a class over the rounds of r: the I/O-fault
/// reductions of the rounds that had I/O faults to reduce, and the pinned
/// memory of every round.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sums {
    /// Sum of the reductions, % (rounds with I/O faults without pinning).
    red: f64,
    /// How many rounds `red` sums.
    red_n: usize,
    /// Sum of the pinned memory, % per VM (every round).
    pin: f64,
    /// How many rounds `pin` sums.
    pin_n: usize,
}

impl Sums {
    /// Adds a round: its reduction (`None`: no I/O faults without
    /// pinning, nothing to reduce) and pinned memory.
    fn add(&mut self, red: Option<f64>, pin: f64) {
        if let Some(r) = red {
            self.red += r;
            self.red_n += 1;
        }
        self.pin += pin;
        self.pin_n += 1;
    }

    /// Mean reduction over the rounds that had I/O faults, %.
    fn red(&self) -> Option<f64> {
        ratio(self.red, self.red_n as f64)
    }

    /// Mean pinned memory, % per VM.
    fn pin(&self) -> f64 {
        ratio(self.pin, self.pin_n as f64).unwrap_or(0.0)
    }

    /// Reduction per pinned memory (RPR): `None` without a reduction or
    /// without pinned memory.
    fn rpr(&self) -> Option<f64> {
        ratio(self.red()?, self.pin())
    }
}

/// One reclaim model's B5 results.
struct ModelOut {
    name: String,
    /// (policy, class) -> reductions and pinned memory over r.
    sums: HashMap<(&'static str, &'static str), Sums>,
    /// Per r, no pinning: the reclaimer's horizon (P10, P50 s) and the VMs'
    /// reclaim ratios (mean, min, max %), NIC then block.
    horizon: Vec<[(u64, u64); 2]>,
    ratios: Vec<[(f64, f64, f64); 2]>,
    /// Per r, no pinning: the VMs' mean pressure (PSI some %), NIC, block.
    psi: Vec<[f64; 2]>,
    /// Per r, no pinning, PSI model: the server's memory and the most the
    /// VMs held at the end of a second.
    server: Vec<Option<(usize, usize)>>,
}

impl ModelOut {
    /// `kind`'s RPR over simple LRU's, `None` where either has none.
    fn rpr_ratio(&self, kind: &str, class: &str) -> Option<f64> {
        rpr_ratio(&self.sums, kind, class)
    }
}

/// `kind`'s RPR over simple LRU's in `class`: `None` where either has no
/// RPR, or LRU's is 0.
fn rpr_ratio(
    sums: &HashMap<(&'static str, &'static str), Sums>,
    kind: &str,
    class: &str,
) -> Option<f64> {
    ratio(sums[&(kind, class)].rpr()?, sums[&("lru10", class)].rpr()?)
}

const B5_RS: [f64; 3] = [0.1, 0.2, 0.3];
const B5_KINDS: [&str; 4] = ["pin-all", "lru10", "adp", "adp-derived"];

/// Entry point of B5/B7: B5 under `model` in full (the Fig 16 lines,
/// accounting, Fig 17), then every model of `compare` beside it.
pub fn run(
    ctx: &mut BenchCtx,
    model: B5Model,
    compare: &[B5Model],
    b5: bool,
    b7: bool,
) -> anyhow::Result<()> {
    let sizes = fleet(14);
    if b7 {
        b7::run(ctx, &sizes);
    }
    if !b5 {
        return Ok(());
    }
    let mut models = vec![model];
    models.extend(compare.iter().filter(|&&m| m != model));
    let mut progress = Progress::new(
        (models.len() * B5_RS.len() * (B5_KINDS.len() + 1)) as u64,
        "B5",
    );
    let mut outs = Vec::new();
    for (i, &m) in models.iter().enumerate() {
        outs.push(b5_model(ctx, &sizes, m, i == 0, &mut progress)?);
    }
    progress.finish();
    print_models(ctx, &outs);
    Ok(())
}

/// B5's rounds under one reclaim model; `detail`: print them in full.
fn b5_model(
    ctx: &mut BenchCtx,
    sizes: &[(Class, usize)],
    model: B5Model,
    detail: bool,
    progress: &mut Progress,
) -> anyhow::Result<ModelOut> {
    let name = model.name();
    let mut rows = Vec::new();
    let mut sums: HashMap<(&str, &str), Sums> = HashMap::new();
    let mut fig17 = Vec::new();
    let mut acct: HashMap<(&str, &str), PinLedger> = HashMap::new();
    let mut horizon = Vec::new();
    let mut ratios = Vec::new();
    let mut server = Vec::new();
    let mut psi = Vec::new();
    let mut ratio_series = Vec::new();
    for r in B5_RS {
        let hour = |kind| RoundCfg {
            reclaim: model.reclaim(r),
            ..RoundCfg::hour(kind, r)
        };
        progress.step(&format!("{name} r={r} none"));
        let none_out = round(&hour("none"), sizes);
        server.push(none_out.server);
        let none = none_out.classes;
        horizon.push([none["nic"].reclaim_age_s, none["block"].reclaim_age_s]);
        ratios.push([none["nic"].ratio_pct, none["block"].ratio_pct]);
        psi.push([none["nic"].psi_pct, none["block"].psi_pct]);
        for kind in B5_KINDS {
            progress.step(&format!("{name} r={r} {kind}"));
            let out = round(
                &RoundCfg {
                    keep_sizes: detail && r == 0.2,
                    ..hour(kind)
                },
                sizes,
            );
            let res = out.classes;
            if detail && r == 0.2 && (kind == "adp" || kind == "lru10") {
                fig17.push((kind, out.nic_sizes));
            }
            if detail && r == 0.2 && kind == "adp" {
                ratio_series = out
                    .vms
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let c = format!("{:?}", v.class).to_lowercase();
                        (format!("{i}: {c}, {} GB", v.units / 64), v.ratios.clone())
                    })
                    .collect();
            }
            for class in ["nic", "block"] {
                // No I/O faults without pinning: nothing to reduce, no
                // reduction (not 100%).
                let red = reduction_pct(res[class].iopfs as f64, none[class].iopfs as f64);
                let pin = res[class].pinned_pct;
                sums.entry((kind, class)).or_default().add(red, pin);
                let a = acct.entry((kind, class)).or_default();
                let l = &res[class].ledger;
                for (&k, &x) in &l.secs {
                    *a.secs.entry(k).or_default() += x / 3.0;
                }
                for (&k, &x) in &l.pins {
                    *a.pins.entry(k).or_default() += x;
                }
                a.protected += l.protected;
                a.unpinned_idle += l.unpinned_idle;
                a.unpinned_hot += l.unpinned_hot;
                a.transient += l.transient;
                let (rm, rlo, rhi) = res[class].ratio_pct;
                rows.push(vec![
                    format!("{:.0}%", r * 100.0),
                    kind.into(),
                    class.into(),
                    none[class].iopfs.to_string(),
                    res[class].iopfs.to_string(),
                    fmt_opt(red, 1),
                    format!("{pin:.2}"),
                    fmt_opt(red.and_then(|red| ratio(red, pin)), 1),
                    res[class].pin_fetches.to_string(),
                    if kind.starts_with("adp") {
                        format!("{:.0}", res[class].threshold_s)
                    } else {
                        "-".into()
                    },
                    format!(
                        "{} / {}",
                        res[class].reclaim_age_s.0, res[class].reclaim_age_s.1
                    ),
                    format!("{rm:.1} [{rlo:.1}-{rhi:.1}]"),
                ]);
            }
        }
    }
    let out = ModelOut {
        name,
        sums,
        horizon,
        ratios,
        psi,
        server,
    };
    if !detail {
        return Ok(out);
    }
    println!(
        "\n== B5: the ADP mix of Fig 16 (simulated hour, paper constants, S = 1 in simulated time), reclaim model: {} ({}) ==",
        out.name,
        model.describe()
    );
    print_table(
        &[
            "r",
            "policy",
            "class",
            "IOPF none",
            "IOPF",
            "reduction %",
            "pinned %/VM",
            "RPR",
            "pin fetches",
            "threshold s",
            "reclaim age P10/P50 s",
            "VM reclaim % mean [min-max]",
        ],
        &rows,
    );
    print_accounting(ctx, &acct);
    let sums = &out.sums;
    let g = |k: &str, c: &str| sums[&(k, c)];
    let red = |k: &str, c: &str| g(k, c).red();
    let pin = |k: &str, c: &str| Some(g(k, c).pin());
    let rpr = |k: &str, c: &str| rpr_ratio(sums, k, c);
    for (label, v, unit, paper) in [
        (
            "fig16.adp.nic.iopf_reduction_pct",
            red("adp", "nic"),
            "%",
            "95-97 (target >= 90)",
        ),
        (
            "fig16.adp.nic.pinned_pct",
            pin("adp", "nic"),
            "%",
            "~4.3 per VM (target <= 6)",
        ),
        (
            "fig16.lru.nic.iopf_reduction_pct",
            red("lru10", "nic"),
            "%",
            "similar to ADP",
        ),
        (
            "fig16.lru.nic.pinned_pct",
            pin("lru10", "nic"),
            "%",
            "~12 per VM",
        ),
        (
            "fig16.adp.block.iopf_reduction_pct",
            red("adp", "block"),
            "%",
            "36-49",
        ),
        (
            "fig16.adp.block.pinned_pct",
            pin("adp", "block"),
            "%",
            "~4.3 per VM",
        ),
        (
            "fig16.lru.block.iopf_reduction_pct",
            red("lru10", "block"),
            "%",
            "12-15",
        ),
        (
            "fig16.lru.block.pinned_pct",
            pin("lru10", "block"),
            "%",
            "~12 per VM",
        ),
        (
            "fig16.pin_all.nic.iopf_reduction_pct",
            red("pin-all", "nic"),
            "%",
            "100 (static pinning)",
        ),
        (
            "fig16.rpr_ratio.nic",
            rpr("adp", "nic"),
            "x",
            "6.28 (~2.8 from per-VM averages; target >= 2)",
        ),
        (
            "fig16.rpr_ratio.block",
            rpr("adp", "block"),
            "x",
            "10.56 (target >= 3)",
        ),
        (
            "fig16.adp_derived.block.iopf_reduction_pct",
            red("adp-derived", "block"),
            "%",
            "36-49 (target >= LRU's)",
        ),
        (
            "fig16.adp_derived.block.pinned_pct",
            pin("adp-derived", "block"),
            "%",
            "~4.3 (target <= half of LRU's)",
        ),
        (
            "fig16.adp_derived.nic.iopf_reduction_pct",
            red("adp-derived", "nic"),
            "%",
            "95-97 (target >= 90)",
        ),
        (
            "fig16.adp_derived.nic.pinned_pct",
            pin("adp-derived", "nic"),
            "%",
            "~4.3 (target <= 6)",
        ),
        (
            "fig16.adp_derived.rpr_ratio.block",
            rpr("adp-derived", "block"),
            "x",
            "10.56 (target >= 3)",
        ),
        (
            "fig16.adp_derived.rpr_ratio.nic",
            rpr("adp-derived", "nic"),
            "x",
            "6.28 (target >= 2)",
        ),
        (
            "fig16.pinned_reduction_adp_vs_lru_pct",
            reduction_pct(
                g("adp", "nic").pin() + g("adp", "block").pin(),
                g("lru10", "nic").pin() + g("lru10", "block").pin(),
            ),
            "%",
            "up to 81",
        ),
    ] {
        line_opt(ctx, label, v, unit, paper);
    }
    let title = format!(
        "B5, {}: each VM's reclaim ratio per minute (r = 20%, ADP)",
        out.name
    );
    ctx.figure("vpri_b5_reclaim_ratios", |d, nm| {
        crate::harness::plot::line_chart(
            d,
            nm,
            &title,
            "minute",
            "reclaim ratio %",
            &ratio_series,
            false,
        )
    })?;
    for (kind, s) in fig17 {
        let act: Vec<(f64, f64)> = s.iter().map(|x| (x.0, x.1)).collect();
        let ina: Vec<(f64, f64)> = s.iter().map(|x| (x.0, x.2)).collect();
        let name = format!("vpri_fig17_{kind}");
        let title = format!("Fig 17: one NIC domain, {kind}: active / pinned (% of VM) per minute");
        let series = if kind == "adp" {
            vec![
                ("active".to_string(), act),
                ("inactive (pinned)".to_string(), ina),
            ]
        } else {
            vec![("pinned".to_string(), ina)]
        };
        ctx.figure(&name, |d, nm| {
            crate::harness::plot::line_chart(
                d,
                nm,
                &title,
                "minute",
                "% of VM memory",
                &series,
                false,
            )
        })?;
    }
    Ok(out)
}

/// The reclaim models side by side: each policy's reduction and pinned
/// memory (mean over r), the RPR ratios to LRU, the reclaimer's horizon
/// and the VMs' reclaim ratios (no pinning).
fn print_models(ctx: &mut BenchCtx, outs: &[ModelOut]) {
    println!("\nReclaim models (B5, mean over r = 10/20/30%; horizon and VM ratios from the no-pinning rounds):");
    let mut rows = Vec::new();
    for o in outs {
        for class in ["nic", "block"] {
            let c = usize::from(class == "block");
            let cell = |k: &str| {
                let x = o.sums[&(k, class)];
                format!("{} / {:.2}", fmt_opt(x.red(), 1), x.pin())
            };
            let per_r = |f: &dyn Fn(usize) -> String| {
                (0..B5_RS.len()).map(f).collect::<Vec<_>>().join(", ")
            };
            rows.push(vec![
                o.name.clone(),
                class.into(),
                cell("lru10"),
                cell("adp"),
                cell("adp-derived"),
                fmt_opt(o.rpr_ratio("adp", class), 2),
                fmt_opt(o.rpr_ratio("adp-derived", class), 2),
                per_r(&|i| format!("{}/{}", o.horizon[i][c].0, o.horizon[i][c].1)),
                per_r(&|i| {
                    let (m, lo, hi) = o.ratios[i][c];
                    format!("{m:.0} [{lo:.0}-{hi:.0}]")
                }),
                per_r(&|i| format!("{:.2}", o.psi[i][c])),
            ]);
            for kind in ["lru10", "adp", "adp-derived"] {
                let x = o.sums[&(kind, class)];
                let k = kind.replace('-', "_");
                let base = format!("fig16.model.{}.{k}.{class}", o.name);
                line_quiet_opt(ctx, &format!("{base}.iopf_reduction_pct"), x.red(), "%");
                line_quiet(ctx, &format!("{base}.pinned_pct"), x.pin(), "%");
            }
            for kind in ["adp", "adp-derived"] {
                let label = format!(
                    "fig16.model.{}.{}.rpr_ratio.{class}",
                    o.name,
                    kind.replace('-', "_")
                );
                line_quiet_opt(ctx, &label, o.rpr_ratio(kind, class), "x");
            }
            for (i, r) in B5_RS.iter().enumerate() {
                let base = format!("fig16.model.{}.r{:.0}.{class}", o.name, r * 100.0);
                line_quiet(
                    ctx,
                    &format!("{base}.reclaim_age_p10_s"),
                    o.horizon[i][c].0 as f64,
                    "s",
                );
                line_quiet(
                    ctx,
                    &format!("{base}.reclaim_age_p50_s"),
                    o.horizon[i][c].1 as f64,
                    "s",
                );
                line_quiet(
                    ctx,
                    &format!("{base}.vm_ratio_min_pct"),
                    o.ratios[i][c].1,
                    "%",
                );
                line_quiet(
                    ctx,
                    &format!("{base}.vm_ratio_max_pct"),
                    o.ratios[i][c].2,
                    "%",
                );
                line_quiet(ctx, &format!("{base}.psi_some_pct"), o.psi[i][c], "%");
            }
        }
    }
    print_table(
        &[
            "model",
            "class",
            "LRU 10% red/pin %",
            "ADP red/pin %",
            "ADP-derived red/pin %",
            "RPR ADP/LRU",
            "RPR ADP-d/LRU",
            "horizon P10/P50 s (r=10,20,30)",
            "VM reclaim % mean [min-max] (r=10,20,30)",
            "PSI some % (r=10,20,30)",
        ],
        &rows,
    );
    for o in outs {
        let held: Vec<String> = o
            .server
            .iter()
            .flatten()
            .map(|(cap, max)| format!("{max} of {cap}"))
            .collect();
        if !held.is_empty() {
            println!(
                "{}: server memory (units, r=10,20,30, no pinning): the VMs held at most {}",
                o.name,
                held.join(", ")
            );
        }
    }
}

/// B5's per-mechanism accounting: each policy's pinned memory (% of the
/// VM, averaged over r like Fig 16's) split by why the unit was pinned
/// (ADP: age scan or active overflow; LRU: on access) and what the pin's
/// time was spent on ([`PinUse`]).
fn print_accounting(ctx: &mut BenchCtx, acct: &HashMap<(&str, &str), PinLedger>) {
    println!("\nPinned memory by mechanism (% of VM, mean over r; pins/protected accesses/unpins summed over the 3 rounds):");
    let mut rows = Vec::new();
    for kind in ["lru10", "adp", "adp-derived"] {
        for class in ["nic", "block"] {
            let Some(l) = acct.get(&(kind, class)) else {
                continue;
            };
            for cause in [PinCause::Access, PinCause::Age, PinCause::Overflow] {
                let pins = l.pins.get(&cause).copied().unwrap_or(0);
                if pins == 0 {
                    continue;
                }
                let pct = |u| l.secs.get(&(cause, u)).copied().unwrap_or(0.0);
                let uses = [
                    PinUse::Protected,
                    PinUse::Demotion,
                    PinUse::Unused,
                    PinUse::Open,
                ];
                let total: f64 = uses.iter().map(|&u| pct(u)).sum();
                let cname = format!("{cause:?}").to_lowercase();
                let mut row = vec![
                    kind.to_string(),
                    class.to_string(),
                    cname.clone(),
                    pins.to_string(),
                    format!("{total:.3}"),
                ];
                for u in uses {
                    row.push(format!("{:.3}", pct(u)));
                    let label =
                        format!("fig16.acct.{kind}.{class}.{cname}.{u:?}_pct").to_lowercase();
                    line_quiet(ctx, &label, pct(u), "%");
                }
                rows.push(row);
            }
            rows.push(vec![
                kind.to_string(),
                class.to_string(),
                "(events)".into(),
                format!("protected {}", l.protected),
                format!("unpin idle {}", l.unpinned_idle),
                format!("unpin hot {}", l.unpinned_hot),
                format!("same-tick {}", l.transient),
                String::new(),
                String::new(),
            ]);
        }
    }
    print_table(
        &[
            "policy",
            "class",
            "pinned by",
            "pins",
            "pinned %",
            "then accessed %",
            "wait demotion %",
            "unpinned unused %",
            "unused at end %",
        ],
        &rows,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round without I/O faults to reduce (none without pinning either:
    /// "IOPF none 0 -> 0") has no reduction, not 100%, and is left out of
    /// the mean over r; no pinned memory, no RPR.
    #[test]
    fn a_round_without_io_faults_has_no_reduction() {
        let mut s = Sums::default();
        s.add(reduction_pct(0.0, 0.0), 0.0);
        assert_eq!((s.red(), s.pin(), s.rpr()), (None, 0.0, None));
        s.add(reduction_pct(1.0, 10.0), 3.0);
        s.add(reduction_pct(4.0, 10.0), 3.0);
        assert_eq!(s.red(), Some(75.0));
        assert_eq!(s.pin(), 2.0);
        assert_eq!(s.rpr(), Some(37.5));
        let mut sums = HashMap::new();
        sums.insert(("adp", "nic"), s);
        sums.insert(("lru10", "nic"), Sums::default());
        assert_eq!(rpr_ratio(&sums, "adp", "nic"), None);
    }

    /// A model is printed and labelled as its flag names it (`psi`, not
    /// a name of its own).
    #[test]
    fn models_are_named_as_their_flag_value() {
        for v in [
            "static",
            "redraw",
            "psi",
            "psi-avg10",
            "psi-avg60",
            "psi-avg300",
            "psi-abs",
        ] {
            let m = B5Model::parse(v, 600).unwrap();
            assert_eq!(m.name(), v);
            assert_eq!(B5Model::parse(&m.name(), 600).unwrap(), m);
        }
        assert!(B5Model::parse("redraw", 600)
            .unwrap()
            .describe()
            .contains("600 s"));
    }
}
