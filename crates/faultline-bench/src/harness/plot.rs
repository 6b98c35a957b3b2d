//! Figures for the benchmarks, each written as `NAME.svg` and `NAME.png`.
//!
//! How it works:
//! 1. Each figure is drawn by one function generic over the plotters backend and
//!    called twice, once with the SVG and once with the bitmap backend.
//! 2. Text needs a font: plotters' `ab_glyph` feature has none built in, so the
//!    first figure registers DejaVu Sans from `/usr/share/fonts/truetype/dejavu/`
//!    (or the TTF named by `FAULTLINE_PLOT_FONT`). Without a font the figures are
//!    still written, only without any text: a missing font never fails a benchmark.
//! 3. Both are drawn in memory (an SVG string, an RGB buffer encoded as PNG)
//!    and written through `faultline_cli_support::OutputPath`: a temporary in
//!    the `--plot` directory renamed over `NAME.svg`/`NAME.png` once whole (a
//!    device or FIFO there is refused, a symlink followed).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context};
use faultline_cli_support::OutputPath;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::stats::percentile_sorted;

/// Default figure size in pixels (SVG user units).
const SIZE: (u32, u32) = (1000, 640);

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Register a font for plot text once per process; `false` if none was found.
pub fn font_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let candidates: Vec<PathBuf> = match std::env::var_os("FAULTLINE_PLOT_FONT") {
            Some(p) => vec![PathBuf::from(p)],
            None => FONT_PATHS.iter().map(PathBuf::from).collect(),
        };
        for p in candidates {
            if let Ok(bytes) = std::fs::read(&p) {
                // The font registry wants 'static bytes; one font (~700 KiB) is
                // leaked once per process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

fn perr<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Closures cannot be generic, so each figure is a small struct implementing this.
trait Figure {
    fn size(&self) -> (u32, u32) {
        SIZE
    }
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> anyhow::Result<()>;
}

/// Draws the legend of the chart's labelled series at `at`.
fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(at)
        .draw()
        .map_err(perr)
}

fn write_figure<F: Figure>(dir: &Path, name: &str, fig: &F, text: bool) -> anyhow::Result<()> {
    let svg = dir.join(format!("{name}.svg"));
    let png = dir.join(format!("{name}.png"));
    let svg_out = OutputPath::check(&svg, "--plot")?;
    let png_out = OutputPath::check(&png, "--plot")?;
    let (w, h) = fig.size();
    let mut svg_text = String::new();
    {
        let root = SVGBackend::with_string(&mut svg_text, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(perr)?;
        fig.draw(&root, text)
            .with_context(|| format!("drawing {}", svg.display()))?;
        root.present().map_err(perr)?;
    }
    svg_out.write_bytes(svg_text.as_bytes())?;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(perr)?;
        fig.draw(&root, text)
            .with_context(|| format!("drawing {}", png.display()))?;
        root.present().map_err(perr)?;
    }
    png_out.write(|out| {
        let mut enc = png::Encoder::new(out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().map_err(std::io::Error::other)?;
        wr.write_image_data(&rgb).map_err(std::io::Error::other)?;
        wr.finish().map_err(std::io::Error::other)
    })
}

/// Series `i`'s colour: twenty distinct ones (a figure of a full `bench
/// restore` run has more than twelve series: the thirteenth took the
/// first's colour), then hues a golden angle apart.
fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 20] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 128),
        RGBColor(0, 0, 0),
        RGBColor(128, 0, 0),
        RGBColor(0, 128, 128),
        RGBColor(128, 128, 0),
        RGBColor(255, 200, 0),
        RGBColor(199, 21, 133),
        RGBColor(255, 0, 255),
        RGBColor(140, 190, 240),
        RGBColor(210, 180, 140),
    ];
    match C.get(i) {
        Some(c) => *c,
        None => {
            let hue = (i as f64 * 0.381_966_011_250_105).fract();
            let l = if i.is_multiple_of(2) { 0.35 } else { 0.6 };
            let (r, g, b) = HSLColor(hue, 0.8, l).rgb();
            RGBColor(r, g, b)
        }
    }
}

/// Pad a range so a zero-width one still draws.
fn padded(lo: f64, hi: f64) -> Range<f64> {
    if hi > lo {
        lo..hi
    } else {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.05 };
        lo - d..hi + d
    }
}

/// A histogram of latency samples, ready to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Hist {
    /// `(bin start, bin end, fraction of the kept samples)`; fractions sum to 1.
    pub bins: Vec<(f64, f64, f64)>,
    /// Median of all samples.
    pub median: f64,
    /// Bins are log-spaced (the kept samples span more than [`LOG_SPAN`]x).
    pub log: bool,
}

/// Kept samples spanning more than this factor get log-spaced bins and a log axis.
pub const LOG_SPAN: f64 = 20.0;

/// Bin `samples` at or below their p99 into `bins` bins: linear bins, or
/// log-spaced ones when the kept samples span more than [`LOG_SPAN`]x.
pub fn histogram_bins(samples: &[f64], bins: usize) -> Hist {
    let mut s: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if s.is_empty() || bins == 0 {
        return Hist {
            bins: Vec::new(),
            median: 0.0,
            log: false,
        };
    }
    s.sort_unstable_by(f64::total_cmp);
    let median = percentile_sorted(&s, 50.0);
    let cut = percentile_sorted(&s, 99.0);
    s.retain(|&v| v <= cut);
    let log = s[0] > 0.0 && cut / s[0] > LOG_SPAN;
    // Bin in log10 space when `log`; `f` maps a sample into the binning space.
    let f = |v: f64| if log { v.log10() } else { v };
    let finv = |v: f64| if log { 10f64.powf(v) } else { v };
    let r = padded(f(s[0]), f(cut));
    let w = (r.end - r.start) / bins as f64;
    let mut counts = vec![0usize; bins];
    for &v in &s {
        let i = (((f(v) - r.start) / w).max(0.0) as usize).min(bins - 1);
        counts[i] += 1;
    }
    let n = s.len() as f64;
    let bins = counts
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let lo = r.start + i as f64 * w;
            (finv(lo), finv(lo + w), c as f64 / n)
        })
        .collect();
    Hist { bins, median, log }
}

struct Histograms<'a> {
    sets: &'a [(String, Vec<f64>)],
}

impl Figure for Histograms<'_> {
    fn size(&self) -> (u32, u32) {
        (1000, (220 * self.sets.len() as u32).max(300))
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> anyhow::Result<()> {
        let k = self.sets.len().max(1);
        let panels = root.split_evenly((k, 1));
        for (i, ((label, samples), area)) in self.sets.iter().zip(panels.iter()).enumerate() {
            let h = histogram_bins(samples, 60);
            let (Some(first), Some(last)) = (h.bins.first(), h.bins.last()) else {
                continue;
            };
            // Drawn in log10 space when the bins are log-spaced.
            let tx = |v: f64| {
                if h.log {
                    v.max(f64::MIN_POSITIVE).log10()
                } else {
                    v
                }
            };
            let ymax = h.bins.iter().map(|b| b.2).fold(0.0, f64::max) * 1.15;
            let mut b = ChartBuilder::on(area);
            b.margin(8);
            if text {
                b.caption(
                    format!(
                        "{label}: n = {}, median {:.0} ns (samples above p99 removed{})",
                        samples.len(),
                        h.median,
                        if h.log { ", log scale" } else { "" }
                    ),
                    ("sans-serif", 18),
                )
                .x_label_area_size(if i + 1 == k { 50 } else { 30 })
                .y_label_area_size(70);
            }
            let xr = padded(tx(first.0), tx(last.1));
            let keys = if h.log {
                log_ticks(&[], xr.start, xr.end)
            } else {
                plotters::coord::types::RangedCoordf64::from(xr.clone()).key_points(10)
            };
            let x_axis = KeyedAxis {
                inner: xr.into(),
                keys,
            };
            let mut chart = b
                .build_cartesian_2d(x_axis, 0.0..ymax.max(1e-9))
                .map_err(perr)?;
            let log = h.log;
            let xfmt = move |v: &f64| {
                if log {
                    fmt_axis(10f64.powf(*v).round())
                } else {
                    fmt_axis(*v)
                }
            };
            // Without a font the mesh is left out: its labels need text layout.
            if text {
                let mut mesh = chart.configure_mesh();
                mesh.disable_x_mesh()
                    .light_line_style(TRANSPARENT)
                    .label_style(("sans-serif", 14))
                    .y_labels(4)
                    .x_label_formatter(&xfmt)
                    .y_label_formatter(&|v| format!("{v:.2}"))
                    .y_desc("fraction");
                if i + 1 == k {
                    mesh.x_desc("latency (ns)")
                        .axis_desc_style(("sans-serif", 15));
                }
                mesh.draw().map_err(perr)?;
            }
            let median = tx(h.median);
            let bins: Vec<(f64, f64, f64)> = h
                .bins
                .iter()
                .map(|&(lo, hi, fr)| (tx(lo), tx(hi), fr))
                .collect();
            let c = color(i);
            chart
                .draw_series(
                    bins.iter().map(|&(lo, hi, f)| {
                        Rectangle::new([(lo, 0.0), (hi, f)], c.mix(0.75).filled())
                    }),
                )
                .map_err(perr)?;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(median, 0.0), (median, ymax)],
                    BLACK.stroke_width(1),
                )))
                .map_err(perr)?;
        }
        Ok(())
    }
}

/// One latency histogram panel per mechanism, stacked vertically, written as
/// `dir/name.svg` and `dir/name.png`. Samples are ns; those above each set's p99
/// are dropped; y is the fraction of the kept samples per bin; a black line marks
/// the median.
pub fn latency_histograms(
    dir: &Path,
    name: &str,
    sets: &[(String, Vec<f64>)],
) -> anyhow::Result<()> {
    write_figure(dir, name, &Histograms { sets }, font_available())
}

struct PhaseBars<'a> {
    bars: &'a [(String, f64, f64, f64)],
}

const PHASES: [&str; 3] = ["trigger", "resolve", "return"];

/// Height of one bar's row in the phase figure, pixels.
const PHASE_ROW: u32 = 26;

impl PhaseBars<'_> {
    /// Pixels the longest label takes (about 8 a character at 14 px).
    fn label_width(&self) -> u32 {
        let chars = self.bars.iter().map(|b| b.0.chars().count()).max();
        (chars.unwrap_or(0) as u32 * 8 + 20).clamp(60, 420)
    }
}

impl Figure for PhaseBars<'_> {
    /// One row a bar: the labels are on the left, one a row, never
    /// overlapping however many bars there are.
    fn size(&self) -> (u32, u32) {
        let k = self.bars.len().max(1) as u32;
        (
            SIZE.0.max(2 * self.label_width() + 700),
            120 + PHASE_ROW * k,
        )
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> anyhow::Result<()> {
        let k = self.bars.len().max(1) as u32;
        let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
        for (panel, area) in [left, right].iter().enumerate() {
            let percent = panel == 1;
            // Room on the right of the cycles panel for the legend.
            let xmax = if percent {
                100.0
            } else {
                self.bars
                    .iter()
                    .map(|b| b.1 + b.2 + b.3)
                    .fold(0.0, f64::max)
                    .max(1.0)
                    * 1.45
            };
            let mut b = ChartBuilder::on(area);
            b.margin(10);
            if text {
                b.caption(
                    if percent {
                        "share of each phase (%)"
                    } else {
                        "phase cost (cycles)"
                    },
                    ("sans-serif", 18),
                )
                .x_label_area_size(40)
                .y_label_area_size(self.label_width());
            }
            let mut chart = b
                .build_cartesian_2d(0.0..xmax, (0u32..k - 1).into_segmented())
                .map_err(perr)?;
            // The first bar at the top.
            let row = |i: usize| k - 1 - i as u32;
            let fmt = |v: &SegmentValue<u32>| match v {
                SegmentValue::CenterOf(r) => self
                    .bars
                    .get((k - 1 - *r) as usize)
                    .map_or_else(String::new, |b| b.0.clone()),
                _ => String::new(),
            };
            if text {
                chart
                    .configure_mesh()
                    .disable_y_mesh()
                    .light_line_style(TRANSPARENT)
                    .label_style(("sans-serif", 14))
                    .y_labels(k as usize + 1)
                    .y_label_formatter(&fmt)
                    .x_labels(6)
                    .x_label_formatter(&|v| fmt_axis(*v))
                    .x_desc(if percent { "%" } else { "cycles" })
                    .draw()
                    .map_err(perr)?;
            }
            for (p, phase) in PHASES.iter().enumerate() {
                let c = color(p);
                let rects = self.bars.iter().enumerate().map(|(i, b)| {
                    let vals = [b.1, b.2, b.3];
                    let total = (b.1 + b.2 + b.3).max(f64::MIN_POSITIVE);
                    let scale = if percent { 100.0 / total } else { 1.0 };
                    let x0: f64 = vals[..p].iter().sum::<f64>() * scale;
                    let x1 = x0 + vals[p] * scale;
                    let mut r = Rectangle::new(
                        [
                            (x0, SegmentValue::Exact(row(i))),
                            (x1, SegmentValue::Exact(row(i) + 1)),
                        ],
                        c.filled(),
                    );
                    r.set_margin(4, 4, 0, 0);
                    r
                });
                let series = chart.draw_series(rects).map_err(perr)?;
                if text && !percent {
                    series.label(*phase).legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled())
                    });
                }
            }
            if text && !percent {
                // Each bar's total beside it: a short bar (a clustered
                // restore's beside a sweep's) stays readable.
                let style = TextStyle::from(("sans-serif", 12).into_font())
                    .pos(Pos::new(HPos::Left, VPos::Center));
                let totals = self.bars.iter().enumerate().map(|(i, b)| {
                    let total = b.1 + b.2 + b.3;
                    Text::new(
                        fmt_axis(total.round()),
                        (total + xmax * 0.01, SegmentValue::CenterOf(row(i))),
                        style.clone(),
                    )
                });
                chart.draw_series(totals).map_err(perr)?;
                legend(&mut chart, SeriesLabelPosition::UpperRight)?;
            }
        }
        Ok(())
    }
}

/// Stacked bars of the trigger / resolve / return phases of each mechanism
/// (`(label, trigger, resolve, return)` in cycles), one horizontal bar a
/// row with its label on the left (the figure grows a row a bar):
/// absolute cycles on the left, percentage shares on the right. Written
/// as `dir/name.svg` and `dir/name.png`.
pub fn phase_bars(dir: &Path, name: &str, bars: &[(String, f64, f64, f64)]) -> anyhow::Result<()> {
    write_figure(dir, name, &PhaseBars { bars }, font_available())
}

struct Lines<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    series: &'a [(String, Vec<(f64, f64)>)],
    log_x: bool,
}

impl Figure for Lines<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> anyhow::Result<()> {
        let tx = |x: f64| {
            if self.log_x {
                x.max(f64::MIN_POSITIVE).log10()
            } else {
                x
            }
        };
        let pts = || self.series.iter().flat_map(|s| s.1.iter().copied());
        let (xmin, xmax) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(tx(p.0)), b.max(tx(p.0)))
        });
        let ymax = pts().map(|p| p.1).fold(0.0, f64::max);
        if !xmin.is_finite() {
            return Ok(());
        }
        let xr = padded(xmin, xmax);
        let pad = (xr.end - xr.start) * 0.03;
        let mut b = ChartBuilder::on(root);
        b.margin(15);
        if text {
            b.caption(self.title, ("sans-serif", 22))
                .x_label_area_size(45)
                .y_label_area_size(80);
        }
        let x_range = xr.start - pad..xr.end + pad;
        let keys = if self.log_x {
            log_ticks(&pts().map(|p| p.0).collect::<Vec<_>>(), xmin, xmax)
        } else {
            plotters::coord::types::RangedCoordf64::from(x_range.clone()).key_points(10)
        };
        let mut chart = b
            .build_cartesian_2d(
                KeyedAxis {
                    inner: x_range.into(),
                    keys,
                },
                0.0..(ymax * 1.1).max(1e-9),
            )
            .map_err(perr)?;
        let log_x = self.log_x;
        let xfmt = move |v: &f64| {
            if log_x {
                fmt_axis((10f64.powf(*v) * 1000.0).round() / 1000.0)
            } else {
                fmt_axis(*v)
            }
        };
        let yfmt = |v: &f64| fmt_axis(*v);
        if text {
            chart
                .configure_mesh()
                .light_line_style(RGBColor(235, 235, 235))
                .label_style(("sans-serif", 14))
                .axis_desc_style(("sans-serif", 16))
                .x_desc(self.x_label)
                .y_desc(self.y_label)
                .x_label_formatter(&xfmt)
                .y_label_formatter(&yfmt)
                .draw()
                .map_err(perr)?;
        }
        for (i, (label, points)) in self.series.iter().enumerate() {
            let c = color(i);
            let p: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (tx(x), y)).collect();
            let s = chart
                .draw_series(LineSeries::new(p.clone(), c.stroke_width(2)))
                .map_err(perr)?;
            if text {
                s.label(label.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            }
            chart
                .draw_series(p.iter().map(|&xy| Circle::new(xy, 4, c.filled())))
                .map_err(perr)?;
        }
        if text {
            legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        }
        Ok(())
    }
}

/// A linear f64 axis whose ticks are exactly `keys` (plotters' own
/// `WithKeyPoints` cannot be used with `configure_mesh`).
struct KeyedAxis {
    inner: plotters::coord::types::RangedCoordf64,
    keys: Vec<f64>,
}

impl Ranged for KeyedAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.max_num_points() == 0 {
            Vec::new()
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

/// Tick positions (log10 of x) for a log axis: the data's own x values when
/// there are few of them (1, 2, 4, ... 64 pages per fault), else 1-2-5 per decade.
fn log_ticks(xs: &[f64], lo_log: f64, hi_log: f64) -> Vec<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|&x| x > 0.0).collect();
    v.sort_unstable_by(f64::total_cmp);
    v.dedup();
    if !v.is_empty() && v.len() <= 12 {
        return v.iter().map(|x| x.log10()).collect();
    }
    let mut out = Vec::new();
    for d in lo_log.floor() as i32..=hi_log.ceil() as i32 {
        for m in [1.0, 2.0, 5.0] {
            let t = (m * 10f64.powi(d)).log10();
            if t >= lo_log - 1e-9 && t <= hi_log + 1e-9 {
                out.push(t);
            }
        }
    }
    out
}

/// Axis tick text: `0.5`, `16`, `1.2k`, `3.4M`.
fn fmt_axis(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A line chart (one line with markers per series), written as `dir/name.svg` and
/// `dir/name.png`. With `log_x` the x axis is logarithmic (x must be > 0).
pub fn line_chart(
    dir: &Path,
    name: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> anyhow::Result<()> {
    let fig = Lines {
        title,
        x_label,
        y_label,
        series,
        log_x,
    };
    write_figure(dir, name, &fig, font_available())
}

struct GroupBars<'a> {
    title: &'a str,
    y_label: &'a str,
    groups: &'a [String],
    series: &'a [(String, Vec<f64>)],
}

/// [`GroupBars`]' legend: below the chart, never over a bar, in columns
/// of this width (a floor's label is some 60 characters), rows this tall.
const KEY_COLUMN: u32 = 480;
const KEY_ROW: u32 = 20;

impl GroupBars<'_> {
    /// Rows of the legend.
    fn key_rows(&self) -> u32 {
        let cols = ((SIZE.0 - 40) / KEY_COLUMN).max(1) as usize;
        self.series.len().div_ceil(cols) as u32
    }

    /// The legend: a swatch and the name of every series, in columns,
    /// left to right then down.
    fn key<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        let cols = ((SIZE.0 - 40) / KEY_COLUMN).max(1) as usize;
        let font = ("sans-serif", 13).into_font().color(&BLACK);
        for (i, (label, _)) in self.series.iter().enumerate() {
            let x = 40 + (i % cols) as i32 * KEY_COLUMN as i32;
            let y = 8 + (i / cols) as i32 * KEY_ROW as i32;
            area.draw(&Rectangle::new(
                [(x, y), (x + 14, y + 10)],
                color(i).filled(),
            ))
            .map_err(perr)?;
            area.draw(&Text::new(label.as_str(), (x + 20, y - 1), font.clone()))
                .map_err(perr)?;
        }
        Ok(())
    }
}

impl Figure for GroupBars<'_> {
    fn size(&self) -> (u32, u32) {
        (SIZE.0, SIZE.1 + self.key_rows() * KEY_ROW + 16)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> anyhow::Result<()> {
        // The chart above, the legend below it: a legend inside the chart
        // covered the bars of its first groups.
        let (root, below) = root.split_vertically(SIZE.1);
        if text {
            self.key(&below)?;
        }
        let root = &root;
        let vals = || {
            self.series
                .iter()
                .flat_map(|s| s.1.iter().copied())
                .filter(|v| *v > 0.0)
        };
        let (lo, hi) = vals().fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
        if !lo.is_finite() || self.groups.is_empty() {
            return Ok(());
        }
        let ylo = (lo.log10() - 0.5).floor();
        let yhi = hi.log10().ceil().max(ylo + 1.0);
        let mut b = ChartBuilder::on(root);
        b.margin(15);
        if text {
            b.caption(self.title, ("sans-serif", 22))
                .x_label_area_size(45)
                .y_label_area_size(80);
        }
        let n = self.groups.len();
        let mut chart = b
            .build_cartesian_2d(0.0..n as f64, ylo..yhi)
            .map_err(perr)?;
        let groups = self.groups;
        let xfmt = move |v: &f64| {
            let i = v.floor() as usize;
            if (v - i as f64 - 0.5).abs() < 1e-6 && i < groups.len() {
                groups[i].clone()
            } else {
                String::new()
            }
        };
        let yfmt = |v: &f64| fmt_axis(10f64.powf(*v));
        if text {
            chart
                .configure_mesh()
                .disable_x_mesh()
                .light_line_style(RGBColor(235, 235, 235))
                .x_labels(2 * n + 1)
                .label_style(("sans-serif", 14))
                .axis_desc_style(("sans-serif", 16))
                .y_desc(self.y_label)
                .x_label_formatter(&xfmt)
                .y_label_formatter(&yfmt)
                .draw()
                .map_err(perr)?;
        }
        let k = self.series.len().max(1) as f64;
        let width = 0.8 / k;
        for (si, (_, values)) in self.series.iter().enumerate() {
            let c = color(si);
            let bars = values
                .iter()
                .enumerate()
                .filter(|(_, v)| **v > 0.0)
                .map(|(g, v)| {
                    let x0 = g as f64 + 0.1 + si as f64 * width;
                    Rectangle::new([(x0, ylo), (x0 + width * 0.9, v.log10())], c.filled())
                });
            chart.draw_series(bars).map_err(perr)?;
        }
        Ok(())
    }
}

/// [`group_bars`]' groups and series from bar groups given as (group,
/// [(series, value)]): a series per name met in any group, in the order
/// first met, 0 (no bar) where a group lacks it.
pub type BarGroups = (Vec<String>, Vec<(String, Vec<f64>)>);

/// See [`BarGroups`].
pub fn bar_groups(groups: &[(String, Vec<(String, f64)>)]) -> BarGroups {
    let names: Vec<String> = groups.iter().map(|g| g.0.clone()).collect();
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    for (_, bars) in groups {
        for (cfg, _) in bars {
            if !series.iter().any(|s| &s.0 == cfg) {
                series.push((cfg.clone(), Vec::new()));
            }
        }
    }
    for (name, values) in &mut series {
        *values = groups
            .iter()
            .map(|(_, bars)| bars.iter().find(|b| &b.0 == name).map_or(0.0, |b| b.1))
            .collect();
    }
    (names, series)
}

/// Grouped bars on a log10 y axis: one group per `groups` entry, one bar
/// per series in each (values `<= 0` are left out), written as
/// `dir/name.svg` and `dir/name.png`.
pub fn group_bars(
    dir: &Path,
    name: &str,
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, Vec<f64>)],
) -> anyhow::Result<()> {
    let fig = GroupBars {
        title,
        y_label,
        groups,
        series,
    };
    write_figure(dir, name, &fig, font_available())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("faultline-plot-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn sets() -> Vec<(String, Vec<f64>)> {
        vec![
            (
                "a".into(),
                (0..1000).map(|i| 1000.0 + (i % 97) as f64 * 10.0).collect(),
            ),
            (
                "b".into(),
                (0..500)
                    .map(|i| 50_000.0 + (i % 13) as f64 * 900.0)
                    .collect(),
            ),
            ("c".into(), (1..2000).map(|i| 1e7 / i as f64).collect()),
        ]
    }

    fn check(dir: &Path, name: &str) {
        for ext in ["svg", "png"] {
            let len = std::fs::metadata(dir.join(format!("{name}.{ext}")))
                .unwrap()
                .len();
            assert!(len > 500, "{name}.{ext} is only {len} bytes");
        }
    }

    #[test]
    fn bins_sum_to_one_and_drop_outliers() {
        let mut v: Vec<f64> = (1..=1000).map(f64::from).collect();
        v.push(1e9);
        let h = histogram_bins(&v, 10);
        assert_eq!(h.bins.len(), 10);
        let total: f64 = h.bins.iter().map(|b| b.2).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(h.bins.last().unwrap().1 < 1e6);
        assert_eq!(h.median, 501.0);
        // 1..=991 spans more than LOG_SPAN: log-spaced bins.
        assert!(h.log);
        assert!((h.bins[0].0 - 1.0).abs() < 1e-9);
        let lin = histogram_bins(&[100.0, 150.0, 200.0], 4);
        assert!(!lin.log);
        assert!((lin.bins[1].0 - 125.0).abs() < 1e-9);
        assert!(histogram_bins(&[], 10).bins.is_empty());
        assert_eq!(histogram_bins(&[5.0, 5.0], 4).bins.len(), 4);
    }

    #[test]
    fn phase_figure_labels_never_overlap() {
        if !font_available() {
            return;
        }
        // As many bars as a full `bench restore` run gives, with its
        // labels: each drawn once a panel, a row apart.
        let labels: Vec<String> = (0..28)
            .map(|i| format!("{}% sweep cold on-demand-w{}-shared", 10 * (i % 4), i))
            .collect();
        let bars: Vec<(String, f64, f64, f64)> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), 1000.0 + i as f64, 5000.0, 800.0))
            .collect();
        let fig = PhaseBars { bars: &bars };
        let (w, _) = fig.size();
        let svg = svg_of(&fig);
        let texts = svg_texts(&svg);
        // Each bar's total beside it in the cycles panel.
        for b in &bars {
            let total = fmt_axis((b.1 + b.2 + b.3).round());
            assert!(
                texts.iter().any(|t| t.2 == total && t.0 < w as f64 / 2.0),
                "total {total} not drawn"
            );
        }
        let mut ys: Vec<(f64, f64)> = Vec::new();
        for l in &labels {
            let hits: Vec<(f64, f64)> = texts
                .iter()
                .filter(|t| t.2 == l)
                .map(|t| (t.0, t.1))
                .collect();
            assert_eq!(hits.len(), 2, "{l} drawn {} times", hits.len());
            ys.extend(hits);
        }
        for panel in [0.0..w as f64 / 2.0, w as f64 / 2.0..w as f64] {
            let mut y: Vec<f64> = ys
                .iter()
                .filter(|p| panel.contains(&p.0))
                .map(|p| p.1)
                .collect();
            assert_eq!(y.len(), labels.len());
            y.sort_by(f64::total_cmp);
            let gap = y
                .windows(2)
                .map(|p| p[1] - p[0])
                .fold(f64::INFINITY, f64::min);
            // 14 px text: rows at least 18 px apart.
            assert!(gap >= 18.0, "labels {gap} px apart");
        }
    }

    /// `fig` drawn as SVG, its texts included.
    fn svg_of<F: Figure>(fig: &F) -> String {
        let (w, h) = fig.size();
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
            fig.draw(&root, true).unwrap();
            root.present().unwrap();
        }
        svg
    }

    /// Every `<text x=".." y=".." ...>CONTENT</text>` of an SVG.
    fn svg_texts(svg: &str) -> Vec<(f64, f64, &str)> {
        svg.split("<text")
            .skip(1)
            .map(|t| {
                let attr = |name: &str| -> f64 {
                    let v = &t[t.find(&format!(" {name}=\"")).unwrap() + name.len() + 3..];
                    v[..v.find('"').unwrap()].parse().unwrap()
                };
                let body = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
                (attr("x"), attr("y"), body.trim())
            })
            .collect()
    }

    /// Every `<rect>` of an SVG: x, y, width, height, fill.
    fn svg_rects(svg: &str) -> Vec<(f64, f64, f64, f64, &str)> {
        svg.split("<rect")
            .skip(1)
            .map(|t| {
                let raw = |name: &str| {
                    let v = &t[t.find(&format!(" {name}=\"")).unwrap() + name.len() + 3..];
                    &v[..v.find('"').unwrap()]
                };
                let num = |name: &str| raw(name).parse::<f64>().unwrap();
                (num("x"), num("y"), num("width"), num("height"), raw("fill"))
            })
            .collect()
    }

    /// The restore figure's legend hid the bars of its first groups (the
    /// tallest: baseline, on-demand, eager), and its thirteenth series took
    /// the first's colour: now every series is a bar of its own colour,
    /// named in a legend below the chart that covers none of them.
    #[test]
    fn every_bar_series_is_visible_and_labelled() {
        if !font_available() {
            return;
        }
        let groups: Vec<String> = ["10% warm", "10% cold", "30% warm"]
            .map(String::from)
            .to_vec();
        // Tall bars in the first group, where the legend was.
        let series: Vec<(String, Vec<f64>)> = (0..14)
            .map(|i| {
                let name = if i < 8 {
                    format!("config-{i}")
                } else {
                    format!("floor: UFFDIO_CONTINUE of the recorded set runs, 1 thread, case {i}")
                };
                (name, vec![40.0 - i as f64, 1.0 + i as f64, 5.0])
            })
            .collect();
        let fig = GroupBars {
            title: "t",
            y_label: "ms (log scale)",
            groups: &groups,
            series: &series,
        };
        let (w, h) = fig.size();
        let svg = svg_of(&fig);
        let texts = svg_texts(&svg);
        let rects = svg_rects(&svg);
        // The bars: rects of a series' colour taller than a swatch.
        let colors: Vec<String> = (0..series.len())
            .map(|i| {
                let c = color(i);
                format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
            })
            .collect();
        let mut distinct = colors.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), series.len(), "a colour per series");
        let bars: Vec<_> = rects
            .iter()
            .filter(|r| colors.iter().any(|c| c == r.4) && r.3 > 12.0)
            .collect();
        assert_eq!(bars.len(), 3 * series.len(), "every bar drawn");
        let bottom = bars.iter().map(|r| r.1 + r.3).fold(0.0, f64::max);
        for (name, _) in &series {
            let at: Vec<_> = texts.iter().filter(|t| t.2 == name).collect();
            assert_eq!(at.len(), 1, "{name} labelled once");
            let (x, y) = (at[0].0, at[0].1);
            assert!(
                y > bottom,
                "{name}'s label at y {y}, over the bars (down to {bottom})"
            );
            assert!(
                x >= 0.0 && x < w as f64 && y < h as f64,
                "{name} at {x},{y} in {w}x{h}"
            );
        }
    }

    #[test]
    fn figures_with_and_without_text() {
        for text in [true, false] {
            if text && !font_available() {
                continue;
            }
            let dir = tmpdir(if text { "text" } else { "notext" });
            let s = sets();
            write_figure(&dir, "hist", &Histograms { sets: &s }, text).unwrap();
            check(&dir, "hist");
            let bars = vec![
                ("poll".to_string(), 1000.0, 5000.0, 800.0),
                ("spin".into(), 900.0, 2000.0, 700.0),
            ];
            write_figure(&dir, "phases", &PhaseBars { bars: &bars }, text).unwrap();
            check(&dir, "phases");
            write_figure(&dir, "phases1", &PhaseBars { bars: &bars[..1] }, text).unwrap();
            check(&dir, "phases1");
            let series = vec![
                (
                    "kernel".to_string(),
                    vec![(1.0, 1500.0), (16.0, 100.0), (64.0, 80.0)],
                ),
                (
                    "copy".into(),
                    vec![(1.0, 3200.0), (16.0, 1350.0), (64.0, 1200.0)],
                ),
            ];
            let fig = Lines {
                title: "t",
                x_label: "x",
                y_label: "y",
                series: &series,
                log_x: true,
            };
            write_figure(&dir, "lines", &fig, text).unwrap();
            check(&dir, "lines");
            let groups = vec!["a".to_string(), "b".into()];
            let bars = GroupBars {
                title: "t",
                y_label: "ms",
                groups: &groups,
                series: &[
                    ("x".to_string(), vec![1.0, 20.0]),
                    ("y".to_string(), vec![3.0, 0.5]),
                    ("z".to_string(), vec![7.0, 9.0]),
                    ("w".to_string(), vec![2.0, 4.0]),
                ],
            };
            write_figure(&dir, "bars", &bars, text).unwrap();
            check(&dir, "bars");
            // FAULTLINE_KEEP_TEST_PLOTS=1 keeps the figures for a look.
            if std::env::var_os("FAULTLINE_KEEP_TEST_PLOTS").is_none() {
                std::fs::remove_dir_all(&dir).unwrap();
            } else {
                eprintln!("kept {}", dir.display());
            }
        }
    }
}
