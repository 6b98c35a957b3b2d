//! The C and C++ examples under `examples/` compile against the installed
//! libraries and do what they say: the BFS through `umap()` agrees with the
//! same BFS through `mmap` (it checks every level itself), the callback
//! store writes every dirtied page back, the `Umap::Store` plug-in reads a
//! scrambled file and scrambles the edits back.

#[path = "../../faultline-capi/tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_secs(120);

fn example(rel: &str) -> PathBuf {
    root().join("examples").join(rel)
}

fn tmp() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = fresh_dir("examples");
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

/// A CSR file (the `faultline graph gen` format) of `n` vertices with three
/// out-edges each: a few BFS levels, every vertex reachable.
fn small_graph(n: u64) -> PathBuf {
    let mut index = vec![0u64];
    let mut edges = Vec::new();
    for v in 0..n {
        for w in [(v + 1) % n, (v * 7 + 3) % n, (v * 131 + 17) % n] {
            edges.push(w);
        }
        index.push(edges.len() as u64);
    }
    let bytes: Vec<u8> = index
        .iter()
        .chain(edges.iter())
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let path = tmp().join("small.csr");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn bfs_through_umap_agrees_with_mmap() {
    if let Err(why) = toolchain() {
        eprintln!("skipping: {why}");
        return;
    }
    let exe = compile(
        prefix(),
        "bfs_umap",
        &[example("c/bfs_umap.c")],
        "umap",
        false,
        &[],
    );
    let g = small_graph(50_000);
    let out = run(
        &exe,
        &[
            g.to_str().unwrap(),
            "--compare",
            "--reps",
            "1",
            "--threads",
            "3",
        ],
        &[("UMAP_BUFSIZE", "64")],
        LIMIT,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("50000 vertices reached"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn callback_store_example_writes_every_page_back() {
    if let Err(why) = toolchain() {
        eprintln!("skipping: {why}");
        return;
    }
    let exe = compile(
        prefix(),
        "callback_store",
        &[example("c/callback_store.c")],
        "faultline",
        false,
        &[],
    );
    let out = run(&exe, &["512"], &[], LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("512 write-backs"),
        "{stdout}"
    );
}

#[test]
fn umap_store_example_serves_and_scrambles() {
    if let Err(why) = toolchain() {
        eprintln!("skipping: {why}");
        return;
    }
    let exe = compile(
        prefix(),
        "xor_store",
        &[example("cpp/xor_store.cpp")],
        "umap",
        true,
        &[],
    );
    let plain: Vec<u8> = b"hello, scrambled world\n".repeat(1000);
    let path = tmp().join("xor.bin");
    std::fs::write(&path, plain.iter().map(|b| b ^ 9).collect::<Vec<u8>>()).unwrap();
    let out = run(&exe, &[path.to_str().unwrap(), "9"], &[], LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("first bytes: hello, scrambled"),
        "{stdout}"
    );
    let back: Vec<u8> = std::fs::read(&path)
        .unwrap()
        .iter()
        .map(|b| b ^ 9)
        .collect();
    for (i, (&got, &was)) in back.iter().zip(&plain).enumerate() {
        let want = if i % 4096 == 0 {
            was.to_ascii_uppercase()
        } else {
            was
        };
        assert_eq!(got, want, "byte {i}");
    }
}
