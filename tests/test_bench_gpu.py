"""bench/gpu.py's parts that run on a CPU: every row written to the file as it is measured, the kernel read from the
profiler, throughput and FLOP utilisation computed; the GPU-only rows say they were skipped."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import gpu  # noqa: E402


def test_the_cpu_parts_write_every_row(tmp_path):
    out = tmp_path / "gpu.jsonl"
    assert gpu.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = [r["case"] for r in rows]
    assert cases[0] == "machine" and cases[-1] == "devices"
    assert [r["result"] for r in rows if r["case"] == "sync"] == ["skipped: set_sync_debug_mode needs CUDA"] * 3
    kernel = next(r for r in rows if r["case"] == "sdpa_kernel")
    assert kernel["kernel"] != "unknown" and kernel["ops"], kernel  # observed on the real Attention's forward
    measured = [r for r in rows if r["case"] == "throughput" and "img_s" in r]
    assert {r["precision"] for r in measured} == {"fp32", "bf16"}
    assert all(r["img_s"] > 0 and r["mfu"] > 0 for r in measured), measured
    # fp32's measured matmul rate is a ceiling on any CPU; bf16's is not where the CPU has no bf16 instructions (AVX2
    # only: the 256x256 bf16 matmul of --quick takes a slow fallback that the tiny model's small ones avoid, mfu
    # measured 1.43 with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2; 1.51 at 1024 on an EPYC)
    assert all(r["mfu"] < 1.5 for r in measured if r["precision"] == "fp32"), measured


def test_rows_reach_the_file_before_the_run_ends(tmp_path):
    rows = gpu.Rows(tmp_path / "r.jsonl")
    rows.add(case="a", value=1)
    assert json.loads((tmp_path / "r.jsonl").read_text()) == {"case": "a", "value": 1}
