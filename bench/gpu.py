"""What a GPU owner runs once (under 5 minutes): does training stay on the device, which attention kernel runs, and
how fast the CIFAR config trains. Each row is printed and appended to the output file as soon as it is measured, so
a run cut short keeps what it got.

    python bench/gpu.py                      # cuda; rows to bench/gpu.jsonl
    python bench/gpu.py --device cpu --quick # the parts that run on a CPU (tests/test_bench_gpu.py runs this)

Rows:
- `sync`: real Lightning training steps (fused AdamW, Muon, clipping, the non-finite guard) under
  `torch.cuda.set_sync_debug_mode("error")` from the start of each batch to its end: any synchronising call raises.
- `sdpa_kernel`: the kernel the real `vit.model.vision_transformer.Attention` runs under bf16 autocast, read from
torch.profiler's trace of a forward (flash, memory-efficient, cuDNN or math), not forced.
- `throughput`: training images/s and model FLOP utilisation (the step's FLOPs counted by FlopCounterMode over the
  time, against a large matmul's FLOP/s measured in the same process) of configs/cifar10.yaml's model, batch
  128-512, fp32 (TF32 off: true fp32) and bf16 autocast, eager and compiled.
- `devices`: 1 vs 2 GPUs is left to `python train.py --trainer.devices 2`; the row says how many GPUs are present.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CIFAR = dict(img_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=6, num_classes=10)  # configs/cifar10.yaml
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)


class Rows:
    """Print each row and append it to a JSON-lines file at once."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def add(self, **row) -> None:
        print(json.dumps(row), flush=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()  # the benchmark's clock, never the training path


def case_sync(rows: Rows, device: torch.device, quick: bool) -> None:
    import lightning as L

    from vit.data.digits import DigitsDataModule
    from vit.training.module import ViTClassifier

    class SyncDebug(L.Callback):
        """Errors on any synchronising CUDA call from the start of a batch to its end (training_step, backward, the
        guard, clipping, the optimizer step and every per-step callback)."""

        def on_train_batch_start(self, *args):
            torch.cuda.set_sync_debug_mode("error")

        def on_train_batch_end(self, *args):
            torch.cuda.set_sync_debug_mode("default")

    for name, kwargs in (("adamw", {}), ("muon", {"optimizer": "muon"}), ("ema", {"ema_decay": 0.99})):
        if device.type != "cuda":
            rows.add(case="sync", option=name, result="skipped: set_sync_debug_mode needs CUDA")
            continue
        module = ViTClassifier(arch=dict(TINY, drop_path_rate=0.1), **kwargs)
        trainer = L.Trainer(
            accelerator="cuda",
            devices=1,
            max_steps=5 if quick else 20,
            precision="bf16-mixed",
            gradient_clip_val=1.0,
            log_every_n_steps=10_000,  # the deliberate reads at the logging interval left out
            limit_val_batches=0,
            callbacks=[SyncDebug()],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        try:
            trainer.fit(module, datamodule=DigitsDataModule(batch_size=64))
            rows.add(case="sync", option=name, result="no synchronising call", steps=trainer.global_step)
        except RuntimeError as e:
            rows.add(case="sync", option=name, result="SYNC", error=" ".join(str(e).split())[:300])
        finally:
            torch.cuda.set_sync_debug_mode("default")


def case_sdpa_kernel(rows: Rows, device: torch.device) -> None:
    from torch.profiler import ProfilerActivity, profile

    from vit.model.vision_transformer import Attention

    attn = Attention(dim=384, num_heads=6, qk_norm=True).to(device)  # configs/cifar10.yaml's: head_dim 64
    x = torch.randn(64, 65, 384, device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16), profile(activities=activities) as prof:
        attn(x)
        sync(device)
    names = [e.key for e in prof.key_averages()]
    kinds = {
        "flash": [n for n in names if "flash" in n.lower()],
        "memory-efficient": [n for n in names if "efficient" in n.lower() or "mem_eff" in n.lower()],
        "cudnn": [n for n in names if "cudnn" in n.lower() and "attention" in n.lower()],
        "math": [n for n in names if n in ("aten::_scaled_dot_product_attention_math", "aten::_softmax")],
    }
    found = [k for k, v in kinds.items() if v]
    rows.add(
        case="sdpa_kernel", device=device.type, kernel=found[0] if found else "unknown", ops=sum(kinds.values(), [])
    )


def _flops_per_step(model, x, y) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def _matmul_flops(device: torch.device, dtype: torch.dtype, quick: bool) -> float:
    # --quick: 256 (on an AVX2-only CPU, six bf16 1024x1024 matmuls took ~18 s of the test's 19 s)
    n = 256 if quick else 1024 if device.type == "cpu" else 8192
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(5):
        a @ b
    sync(device)
    return 5 * 2 * n**3 / (time.perf_counter() - t)


def case_throughput(rows: Rows, device: torch.device, quick: bool) -> None:
    arch = TINY if quick else CIFAR
    batches = (16,) if quick else (128, 256, 512)
    steps = 3 if quick else 20
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # "fp32" rows are fp32, not TF32
        torch.backends.cudnn.allow_tf32 = False
    peak = {p: _matmul_flops(device, d, quick) for p, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    for compiled in (False, True):
        if compiled and (quick or device.type != "cuda"):
            rows.add(case="throughput", compiled=True, result="skipped: compiled rows on a GPU only")
            continue
        for precision in ("fp32", "bf16"):
            for batch in batches if not compiled else batches[1:2]:  # one compile per precision: 5 minutes in all
                seconds, flops = _time_steps(arch, batch, precision, compiled, device, steps)
                rows.add(
                    case="throughput",
                    model="tiny" if quick else "cifar10 (384 x 7, 65 tokens)",
                    precision=precision,
                    compiled=compiled,
                    batch=batch,
                    img_s=round(batch / seconds, 1),
                    mfu=round(flops / seconds / peak[precision], 3),
                    matmul_tflops=round(peak[precision] / 1e12, 2),
                )


def _time_steps(arch: dict, batch: int, precision: str, compiled: bool, device, steps: int) -> tuple[float, int]:
    """Seconds per training step (fused AdamW, as the toolkit trains) and the step's FLOPs."""
    from vit.model.vision_transformer import VisionTransformer

    model = VisionTransformer(**arch).to(device)
    if compiled:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, 3, arch["img_size"], arch["img_size"], device=device)
    y = torch.randint(0, arch["num_classes"], (batch,), device=device)
    flops = _flops_per_step(VisionTransformer(**arch).to(device), x, y)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up (and compilation)
        step()
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t) / steps, flops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="bench/gpu.jsonl")
    ap.add_argument("--quick", action="store_true", help="tiny model and batches: checks the script, measures little")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here (--device cpu runs the CPU parts)", file=sys.stderr)
        return 2
    rows = Rows(Path(args.out))
    info = {"torch": torch.__version__, "cores": os.cpu_count()}
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), gpus=torch.cuda.device_count())
    rows.add(case="machine", **info)
    case_sync(rows, device, args.quick)
    case_sdpa_kernel(rows, device)
    case_throughput(rows, device, args.quick)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    rows.add(case="devices", gpus=gpus, result="2-GPU DDP: python train.py --trainer.devices 2" if gpus > 1 else "one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
