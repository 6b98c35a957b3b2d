//! Graph files and the BFS benchmark.
//!
//! - `faultline graph gen`: R-MAT graph (`rmat`) written as a headerless
//!   binary CSR file (`csr`), the layout UMap's BFS reads.
//! - `faultline graph import`: text edge list (`import`) to the same
//!   format.
//! - `faultline bfs`: level-synchronous BFS (`bfs`) over the file mapped
//!   through the kernel or faultline (`source`), validated against an
//!   in-memory reference BFS, reported as a table and JSON lines.
//!
//! In faultline mode the file is one region backed by a `File` store
//! (`source::FaultlineSource`). `--compare` runs the warm kernel mmap
//! baseline and then one faultline run per engine on the same file, and
//! reports each run's time relative to the mmap run.
//!
//! ```text
//!   gen_cmd (graph gen/import)      bfs_cmd (bfs)          bench store
//!      │          │                  │       │                 │
//!      │          └──► output ◄──────┘       │                 │
//!      ▼                                     ▼                 ▼
//!   rmat, import ──► csr ◄── source (mmap | faultline region) ◄┘, bfs
//!      └─► rng                 units (sizes, budgets)
//! ```
//!
//! The formats and the search (`csr`, `rmat`, `import`, `source`, `bfs`)
//! are shared with `bench store`; the commands sit on top of them.

mod bfs_cmd;
mod gen_cmd;
mod output;

pub(crate) mod bfs;
pub(crate) mod csr;
mod import;
pub(crate) mod rmat;
mod rng;
pub(crate) mod source;
mod units;

pub use bfs_cmd::{run_bfs, BfsArgs};
pub use gen_cmd::{run_graph, GraphCmd};
