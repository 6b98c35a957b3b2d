"""The example and the benchmark run, and say what they claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from faultline.bench import free_page_reporting
from faultline.testing import huge_pages_free

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "numpy_budget.py"


def test_the_budget_example_runs_from_a_file_and_redis():
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--size", "16MiB", "--budget", "1MiB"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "every run computed the same means" in out.stdout
    rows = {l.split("  ")[0].strip(): l for l in out.stdout.splitlines() if l.startswith(("numpy", "faultline"))}
    assert set(rows) == {"numpy.memmap (file)", "faultline FileStore", "faultline RedisStore"}
    for name in ("faultline FileStore", "faultline RedisStore"):
        resident_mib = float(rows[name].split()[3])
        # 1 MiB budget, 64 KiB pages: slack is max(budget/4, 4 windows of
        # up to 256 pages) past it, far below the 16 MiB table.
        assert resident_mib < 16, rows[name]


def test_the_benchmark_writes_its_table_and_json(tmp_path):
    out_json = tmp_path / "bench.json"
    huge_free = huge_pages_free()
    out = subprocess.run(
        [sys.executable, "-m", "faultline.bench", "--size", "4MiB", "--reps", "1", "--json", str(out_json),
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out_json.read_text())
    cases = {c["case"]: c for c in doc["cases"]}
    assert {"seq-sum warm", "seq-sum resident", "gather warm", "seq-sum cold", "gather cold",
            "redis seq-sum", "redis gather", "python seq-sum"} <= set(cases)
    warm = cases["seq-sum warm"]
    # The hugetlb row runs when the pool has the array's two 2 MiB pages.
    # The default engine runs a populator: the region without it too.
    rows = {"memmap", "faultline", "installed first", "numpy.fromfile", "run_ahead=0"}
    if huge_free >= 2:
        rows.add("hugetlb")
        assert np.isclose(warm["values"]["hugetlb"], warm["values"]["memmap"])
    assert set(warm["median"]) == rows
    assert warm["ratio"]["faultline"] > 0 and warm["target"] == 1.3
    assert "run_ahead=0" in cases["gather warm"]["median"]
    assert len(doc["load_before"]) == 3
    assert doc["free_page_reporting"] == free_page_reporting()
    assert "seq-sum warm" in out.stdout and "ratio" in out.stdout
    assert not any(p.name.startswith("faultline-bench-") for p in tmp_path.iterdir()), "work files removed"
    assert not os.path.exists(str(out_json) + ".tmp")


def test_a_benchmark_json_path_that_cannot_be_written_is_refused_first(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "faultline.bench", "--size", "4MiB", "--json", str(tmp_path / "no" / "such" / "dir.json")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert "No such file or directory" in out.stderr
    assert "writing" not in out.stderr, "refused before any work"
