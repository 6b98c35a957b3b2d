//! What every bench shares: the run's context, the clock, statistics,
//! records and tables, figures and progress.
//!
//! ```text
//!   a sub-bench ──► BenchCtx (context) ──► report (Record, Report: tables, JSON)
//!        │              │                    │
//!        │              ├──► progress        └──► stats (Summary) ──► tsc
//!        └──► plot ─────┘ (figures under --plot)
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`context`] | [`BenchCtx`]: the report, the `--plot` and `--json` outputs of one run |
//! | [`tsc`] | the time-stamp counter every latency is taken with |
//! | [`stats`] | summaries of latency samples (nearest-rank percentiles) |
//! | [`report`] | JSON records, the machine description, text tables |
//! | [`plot`] | figures as SVG and PNG |
//! | [`paper`] | a figure measured next to the paper's, printed and recorded |
//! | [`parallel`] | work on several threads at once, timed from the first start to the last end |
//! | [`progress`] | a step counter on stderr |
//!
//! Nothing here knows a particular bench: the benches import the harness,
//! never the other way round.

pub mod context;
pub mod paper;
pub mod parallel;
pub mod plot;
pub mod progress;
pub mod report;
pub mod stats;
pub mod tsc;

pub use context::BenchCtx;
