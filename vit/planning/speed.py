"""This machine and its speed: training images/s of candidate models, timed on a few real steps."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer
from vit.training.optim import MuonWithAdamW, split_for_muon

# The CPU feature names that make bf16 native: x86's in /proc/cpuinfo's `flags` (AVX512-BF16, AMX-BF16), Arm's in
# its `Features` line (FEAT_BF16, Armv8.6 and later: Graviton 3, Apple M2)
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# oneDNN's instruction sets below bf16 arithmetic: with ONEDNN_MAX_CPU_ISA set to one of them, oneDNN (torch's bf16
# matmuls and convolutions on a CPU) emulates bf16 whatever the flags say. `ONEDNN_MAX_CPU_ISA=AVX2` is how a laptop's
# CPU is imitated on a newer one, and how the tests train at the same precision on every machine (tests/conftest.py).
ISA_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")


def native_bf16_cpu(cpuinfo: str | None = None, onednn_isa: str | None = None) -> bool | None:
    """Whether this CPU computes bf16 natively (its flags name AVX512-BF16 or AMX-BF16, or Arm's BF16) and oneDNN may
    use it (`onednn_isa`, read from ONEDNN_MAX_CPU_ISA when the flags are this machine's, is not below bf16); None
    where the flags cannot be read (not Linux)."""
    if cpuinfo is None and onednn_isa is None:
        onednn_isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if (onednn_isa or "").strip().upper() in ISA_WITHOUT_BF16:
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    lines = [line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line]
    flags = next((value.split() for key, value in lines if key.strip() in ("flags", "Features")), [])
    return any(f in flags for f in BF16_FLAGS)


@dataclass
class Machine:
    device: str  # "cpu" or "cuda"
    cores: int
    gpu: str = ""
    gpu_mem_gb: float = 0.0
    native_bf16: bool | None = None  # a CPU's flags name native bf16 (native_bf16_cpu); None: not read

    @staticmethod
    def here() -> Machine:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return Machine("cuda", cores, p.name, p.total_memory / 2**30)
        return Machine("cpu", cores, native_bf16=native_bf16_cpu())

    def __str__(self) -> str:
        return f"{self.gpu} ({self.gpu_mem_gb:.0f} GB)" if self.device == "cuda" else f"CPU, {self.cores} cores"


def calibrate(
    archs: list[ViTConfig],
    batch_size: int,
    device: str = "cpu",
    precision: str = "32-true",
    optimizer: str = "adamw",
    steps: int = 3,
    warmup: int = 2,
) -> list[float]:
    """Training images/s of each architecture on this machine at `precision` (Lightning's name: "32-true", or
    "bf16-mixed" for bf16 autocast): `warmup` + `steps` steps of `optimizer` ("adamw" or "muon": Muon costs ~15% of a
    64x3 step on a 2-core CPU) on a random batch, the median step. The global RNG is left as it was, so that planning
    does not change the seeded run that follows."""
    speeds = []
    # the CUDA generator too (dropout and DropPath of the calibration steps draw from it on a GPU)
    with torch.random.fork_rng(devices=[torch.device(device)] if torch.device(device).type == "cuda" else []):
        for cfg in archs:
            model = VisionTransformer(cfg).to(device)
            if optimizer == "muon":
                opt = MuonWithAdamW(*split_for_muon(model, [{"params": list(model.parameters())}]), lr=1e-4)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randn(batch_size, cfg.in_chans, cfg.img_size, cfg.img_size, device=device)
            y = torch.randint(0, max(1, cfg.num_classes), (batch_size,), device=device)
            times = []
            for i in range(warmup + steps):
                t = time.perf_counter()
                with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if device == "cuda":
                    torch.cuda.synchronize()  # calibration only: the training hot path never waits
                if i >= warmup:
                    times.append(time.perf_counter() - t)
            speeds.append(batch_size / statistics.median(times))
            del model, opt
    return speeds
