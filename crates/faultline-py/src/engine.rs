//! Engines shared by a process's regions, and which one a region gets.
//!
//! One engine of each kind serves every region of the process that asks
//! for that kind: the table holds it weakly, so its threads (a `spin`
//! handler busy-polls a CPU) stop when the last region using it closes,
//! and the next region starts a new one.
//!
//! The default engine is `poll` (one handler thread) for every store. The
//! `signal` engine (the faulting thread resolves its own fault: no
//! wake-up, 1.35x faster on a warm sequential sum) is asked for by name:
//! with it a *system call* that touches a page not yet loaded (`write(2)`
//! of the array: `ndarray.tofile`, `numpy.save`, `file.write`, a socket's
//! `send`; `read(2)` into it) fails with `EFAULT` or, having copied part,
//! returns a short count, since the kernel cannot run a user-space
//! handler for its own access. Python code hands arrays to the kernel
//! too often for that to be the default; it is refused for stores that
//! cannot resolve inside a SIGBUS handler (Redis, a Python store).

use std::sync::{Arc, Mutex, Weak};

use faultline::caps::{capabilities, feature_names};
use faultline::engine::{self, EngineConfig};
use faultline::{Engine, EngineKind, MemoryKind};
use faultline_sys::uffd::feature;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::error::region_error;

/// The live engines, by kind.
static ENGINES: Mutex<Vec<(EngineKind, Weak<dyn Engine>)>> = Mutex::new(Vec::new());

/// The engine of `kind` that the process's regions share, started if none
/// is running.
pub fn shared(kind: EngineKind) -> Result<Arc<dyn Engine>, faultline::Error> {
    let mut engines = ENGINES.lock().unwrap_or_else(|p| p.into_inner());
    engines.retain(|(_, w)| w.strong_count() > 0);
    if let Some(e) = engines
        .iter()
        .find(|(k, _)| *k == kind)
        .and_then(|(_, w)| w.upgrade())
    {
        // Replaced when its threads are gone, or in a forked child (its
        // parent's engine serves the parent's memory).
        if e.check_alive().is_ok() {
            return Ok(e);
        }
    }
    engines.retain(|(k, _)| *k != kind);
    let e = engine::create(kind, EngineConfig::default())?;
    engines.push((kind, Arc::downgrade(&e)));
    Ok(e)
}

/// Parses an engine name, or picks the default for a store (module docs).
pub fn choose(name: Option<&str>) -> PyResult<EngineKind> {
    match name {
        Some(n) => EngineKind::from_name(n).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown engine {n:?}: expected one of {}",
                names().join(", ")
            ))
        }),
        None => Ok(EngineKind::Poll),
    }
}

fn names() -> Vec<&'static str> {
    EngineKind::ALL.iter().map(|k| k.name()).collect()
}

/// `faultline.info()`: see the Python docstring.
#[pyfunction]
pub fn info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = capabilities();
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    d.set_item("kernel", &c.kernel)?;
    d.set_item("userfaultfd", c.path.map(|p| p.name()))?;
    let creation = PyDict::new(py);
    for (p, r) in &c.creation {
        creation.set_item(p.name(), r.as_ref().err().map_or("ok", |e| e.as_str()))?;
    }
    d.set_item("creation_paths", creation)?;
    d.set_item("features", feature_names(c.features))?;
    let engines = PyDict::new(py);
    for kind in EngineKind::ALL {
        let e = PyDict::new(py);
        let usable = kind.usable_on(MemoryKind::PrivateAnon);
        e.set_item("usable", usable.is_ok())?;
        e.set_item("reason", usable.err())?;
        e.set_item(
            "resolves_on",
            if kind.delivery().on_faulting_thread {
                "the faulting thread (SIGBUS handler)"
            } else {
                "a handler thread"
            },
        )?;
        e.set_item("python_stores", !kind.delivery().on_faulting_thread)?;
        engines.set_item(kind.name(), e)?;
    }
    d.set_item("engines", engines)?;
    let kinds = PyDict::new(py);
    for kind in MemoryKind::ALL {
        kinds.set_item(
            kind.name(),
            match &c.kind(kind).ioctls {
                Ok(_) => "usable".to_string(),
                Err(why) => format!("unusable: {why}"),
            },
        )?;
    }
    d.set_item("memory_kinds", kinds)?;
    d.set_item(
        "budget",
        c.has(feature::PAGEFAULT_FLAG_WP) && c.kind(MemoryKind::PrivateAnon).ioctls.is_ok(),
    )?;
    d.set_item("poison", c.has(feature::POISON))?;
    let mut stores = vec!["file", "memory", "zero", "python"];
    if cfg!(feature = "redis") {
        stores.push("redis");
    }
    d.set_item("stores", PyList::new(py, stores)?)?;
    d.set_item("default_engine", choose(None)?.name())?;
    Ok(d)
}

/// Starts (or finds) the engine `kind`, as a Python exception on failure.
pub fn shared_py(kind: EngineKind) -> PyResult<Arc<dyn Engine>> {
    shared(kind).map_err(region_error)
}
