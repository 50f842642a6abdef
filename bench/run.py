# ruff: noqa: B023  (closures in the case loops are called within their own iteration)
"""The benchmark: every figure a ratio against a reference measured in this process, interleaved, median of rounds.

    python bench/run.py                 # CPU, about 5 minutes on 2 cores; writes bench/results.json
    python bench/run.py --device cuda   # the same cases on a GPU, plus the FlashAttention kernel check
    python bench/run.py --only train,attention --rounds 7

Cases (goal in brackets):
  train      training step (forward, backward, AdamW) of our ViT / timm's VisionTransformer, identical configuration
             (configs/cifar10.yaml's width, depth and heads, patch 4, 32 px, avg pool, QK-Norm), fp32 and bf16; ours
             with the fused AdamW the toolkit trains with, timm with torch's default AdamW [>= 1.0, 1.3 aim]
  data       images/s of the in-memory device path / torchvision's CIFAR10 + DataLoader(2 workers), same
             augmentation (crop with padding 4, flip) on a CIFAR-format archive written here [>= 10]
  attention  fused SDPA / manual softmax attention at 1,024 and 4,096 tokens: time and peak memory of forward +
             backward [memory <= 0.25 at 4,096, time <= 1.0]
  mfu        training FLOP/s (FlopCounterMode) / measured matmul FLOP/s of the same precision [>= 50% on CPU]
  lightning  an epoch of digits through trainer.fit (Trainer built beforehand) / a bare PyTorch loop, same model
             and data path [<= 1.10]
  predict    predict CLI images/s / bare forward at the same batch size, CIFAR-size model [>= 0.8]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CIFAR = dict(img_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=6, num_classes=10)


def interleaved(a, b, rounds: int) -> tuple[float, float, float]:
    """Run a() and b() alternately; return median seconds of each and the median of the per-round ratios b/a."""
    a(), b()  # warm-up
    ta, tb = [], []
    for _ in range(rounds):
        for f, out in ((a, ta), (b, tb)):
            t = time.perf_counter()
            f()
            out.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb), statistics.median(y / x for x, y in zip(ta, tb))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def case_train(device, rounds: int) -> list[dict]:
    import timm

    from vit.model.vision_transformer import VisionTransformer

    rows = []
    # (precision, our optimizer fused): the toolkit's step at fp32 and bf16, then the models alone (same optimizer)
    for precision, fused in (("fp32", True), ("bf16", True), ("fp32", None)):
        torch.manual_seed(0)
        ours = VisionTransformer(**CIFAR).to(device)
        ref = timm.models.VisionTransformer(
            img_size=32,
            patch_size=4,
            embed_dim=384,
            depth=7,
            num_heads=6,
            num_classes=10,
            global_pool="avg",
            fc_norm=False,
            class_token=False,
            qk_norm=True,
        ).to(device)
        batch = 128 if device.type == "cuda" else 16
        x = torch.randn(batch, 3, 32, 32, device=device)
        y = torch.randint(0, 10, (batch,), device=device)

        def stepper(model, fused):
            # ours: the toolkit's step (ViTClassifier's fused AdamW); timm: torch's default AdamW, as a plain loop has
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

            def step():
                for _ in range(3 if device.type == "cpu" else 20):
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                sync(device)

            return step

        t_ref, t_ours, ratio = interleaved(stepper(ref, None), stepper(ours, fused), rounds)
        rows.append(
            {
                "case": f"train step {precision}" + ("" if fused else ", same AdamW (models alone)"),
                "ours": t_ours,
                "reference": t_ref,
                "speedup": 1 / ratio,
                "goal": ">= 1.0 (1.3 aim)",
                "unit": "s per round",
            }
        )
    return rows


def _write_cifar(root: Path, n: int) -> None:
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}
        (folder / name).write_bytes(pickle.dumps(data))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))


def _cifar_train(tmp: Path, transform):
    """torchvision's CIFAR10 over our small archive in its on-disk format (md5 checks skipped: not the real files)."""
    from torchvision import datasets

    if not (tmp / "cifar-10-batches-py").is_dir():
        _write_cifar(tmp, 2000)  # 10,000 training images

    class cls(datasets.CIFAR10):
        meta = {**datasets.CIFAR10.meta, "md5": None}

        def _check_integrity(self) -> bool:
            return True

    return cls(str(tmp), train=True, transform=transform, download=False)


def _loader_vs_batches(loader, batches, device, rounds: int, case: str, goal: str) -> list[dict]:
    """Images/s of a DataLoader (reference) and of DeviceBatches (ours), every batch moved to the device."""

    def run(it):
        def f():
            for x, _ in it:
                x = x.to(device, non_blocking=True)
            sync(device)

        return f

    t_ref, t_ours, ratio = interleaved(run(loader), run(batches), rounds)
    n = len(batches) * batches.batch_size
    return [
        {"case": case, "ours": n / t_ours, "reference": n / t_ref, "speedup": 1 / ratio, "goal": goal, "unit": "img/s"}
    ]


def case_data(device, rounds: int, tmp: Path) -> list[dict]:
    from torch.utils.data import DataLoader
    from torchvision.transforms import v2

    from vit.data.device import DeviceBatches
    from vit.data.transforms import Augmentation

    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    tf = v2.Compose(
        [
            v2.RandomCrop(32, padding=4),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )
    ds = _cifar_train(tmp, tf)
    loader = DataLoader(
        ds,
        batch_size=256,
        shuffle=True,
        num_workers=2,
        drop_last=True,
        persistent_workers=True,
        pin_memory=device.type == "cuda",
    )
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous().to(device)
    crop_flip = Augmentation(crop_padding=4, hflip=True)
    fast = DeviceBatches(images, torch.tensor(ds.targets, device=device), 256, mean, std, True, crop_flip)

    return _loader_vs_batches(loader, fast, device, rounds, "data path img/s", ">= 10")


def case_augment(device, rounds: int, tmp: Path) -> list[dict]:
    """The CIFAR recipe's augmentation (crop 4 + flip, AutoAugment CIFAR10 policy, Random Erasing 0.25): batched on
    the device, every image drawing its own operations, vs torchvision's per-image policies through a DataLoader."""
    from torch.utils.data import DataLoader
    from torchvision.transforms import v2

    from vit.data.device import DeviceBatches
    from vit.data.transforms import Augmentation

    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    tf = v2.Compose(
        [
            v2.RandomCrop(32, padding=4),
            v2.RandomHorizontalFlip(),
            v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
            v2.RandomErasing(0.25, value=0),
        ]
    )
    ds = _cifar_train(tmp, tf)
    loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=2, drop_last=True, persistent_workers=True)
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous().to(device)
    ours = DeviceBatches(
        images,
        torch.tensor(ds.targets, device=device),
        256,
        mean,
        std,
        train=True,
        augmentation=Augmentation(
            crop_padding=4, hflip=True, auto_augment="autoaugment", autoaugment_policy="cifar10", erasing=0.25
        ),
    )

    return _loader_vs_batches(loader, ours, device, rounds, "augmentation img/s, CIFAR recipe", ">= 20 (floor 10)")


def _peak_memory(fn, device) -> float:
    """Peak bytes allocated during fn: CUDA's counter on GPU, torch's CPU profiler on CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # running total of allocations and frees, in event order: its maximum is the peak
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    total = peak = 0
    for e in events:
        total += e.cpu_memory_usage
        peak = max(peak, total)
    return peak


def case_attention(device, rounds: int) -> list[dict]:
    from vit.model.vision_transformer import Attention

    rows = []
    for tokens in (1024, 4096):
        attn = Attention(384, num_heads=6).to(device)
        x = torch.randn(1, tokens, 384, device=device, requires_grad=True)

        def run(fused):
            def f():
                attn.fused_attn = fused
                # bf16 on a GPU: FlashAttention runs only in half precision (fp32 would compare the math kernels)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    attn(x).sum().backward()
                sync(device)

            return f

        t_manual, t_fused, ratio = interleaved(run(False), run(True), max(3, rounds // 2))
        mem_manual, mem_fused = _peak_memory(run(False), device), _peak_memory(run(True), device)
        rows.append(
            {
                "case": f"attention time, {tokens} tokens",
                "ours": t_fused,
                "reference": t_manual,
                "speedup": 1 / ratio,
                "goal": "time <= 1.0 (speedup >= 1)",
                "unit": "s",
            }
        )
        rows.append(
            {
                "case": f"attention peak memory, {tokens} tokens",
                "ours": mem_fused / 2**20,
                "reference": mem_manual / 2**20,
                "ratio": mem_fused / max(mem_manual, 1),
                "goal": "<= 0.25 at 4096",
                "unit": "MiB",
            }
        )
    return rows


def case_mfu(device, rounds: int) -> list[dict]:
    from torch.utils.flop_counter import FlopCounterMode

    from vit.model.vision_transformer import VisionTransformer

    rows = []
    batch = 128 if device.type == "cuda" else 16
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = VisionTransformer(**CIFAR).to(device)
        opt = torch.optim.AdamW(model.parameters(), fused=True)  # the toolkit's step
        x = torch.randn(batch, 3, 32, 32, device=device)
        y = torch.randint(0, 10, (batch,), device=device)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        with FlopCounterMode(display=False) as counter:
            step()
        flops = counter.get_total_flops()
        n = 1024 if device.type == "cpu" else 8192
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)

        def matmul():
            for _ in range(3):
                a @ b
            sync(device)

        def train():
            step()
            sync(device)

        t_mm, t_train, _ = interleaved(matmul, train, rounds)
        peak = 3 * 2 * n**3 / t_mm
        achieved = flops / t_train
        rows.append(
            {
                "case": f"MFU {precision}",
                "ours": achieved / 1e9,
                "reference": peak / 1e9,
                "ratio": achieved / peak,
                "goal": ">= 0.5 on CPU",
                "unit": "GFLOP/s",
            }
        )
    return rows


def case_lightning(device, rounds: int) -> list[dict]:
    import logging
    import warnings

    import lightning as L

    from vit.data.digits import DigitsDataModule
    from vit.model.config import ViTConfig
    from vit.training.module import ViTClassifier

    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    kw = dict(patch_size=8, embed_dim=64, depth=3, num_heads=2)  # configs/digits.yaml
    dm = DigitsDataModule(batch_size=64)
    module = ViTClassifier(arch=ViTConfig(**kw))
    accel = "gpu" if device.type == "cuda" else "cpu"

    def make_trainer() -> L.Trainer:
        return L.Trainer(
            accelerator=accel,
            devices=1,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )

    # Built ahead, one per call (warm-up + rounds): constructing a Trainer probes the accelerators (7 ms of CUDA/NVML
    # probing here), a one-off per process, not a cost of the epoch. fit's own setup and teardown stay timed.
    trainers = [make_trainer() for _ in range(rounds + 1)]

    def with_lightning():
        trainers.pop().fit(module, datamodule=dm)

    def bare():
        model = module.model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # as ViTClassifier
        batches = dm._device_batches("train")
        for x, y in batches:
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device), label_smoothing=0.1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync(device)

    t_bare, t_l, ratio = interleaved(bare, with_lightning, rounds)
    return [
        {
            "case": "Lightning epoch / bare loop",
            "ours": t_l,
            "reference": t_bare,
            "ratio": ratio,
            "goal": "<= 1.10",
            "unit": "s per epoch",
        }
    ]


def case_predict(device, rounds: int) -> list[dict]:
    from bench.predict_speed import measure

    r = measure(None, 512 if device.type == "cpu" else 4096, 64, rounds)
    return [
        {
            "case": "predict CLI / bare forward",
            "ours": r["predict_img_s"],
            "reference": r["bare_img_s"],
            "ratio": r["ratio"],
            "goal": ">= 0.8",
            "unit": "img/s",
        }
    ]


def machine(device) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="train,data,augment,attention,mfu,lightning,predict")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results.json"))
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":  # the fp32 rows are true fp32 (train.py turns TF32 on for training; not here)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    import tempfile

    rows, info = [], machine(device)
    print(" | ".join(f"{k}: {v}" for k, v in info.items()))
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "train": lambda: case_train(device, args.rounds),
            "data": lambda: case_data(device, args.rounds, Path(tmp)),
            "augment": lambda: case_augment(device, args.rounds, Path(tmp)),
            "attention": lambda: case_attention(device, args.rounds),
            "mfu": lambda: case_mfu(device, args.rounds),
            "lightning": lambda: case_lightning(device, args.rounds),
            "predict": lambda: case_predict(device, args.rounds),
        }
        for name in args.only.split(","):
            t = time.perf_counter()
            new = cases[name]()
            rows.extend(new)
            for r in new:
                fig = r.get("speedup", r.get("ratio"))
                label = "speedup" if "speedup" in r else "ratio"
                print(
                    f"{r['case']:40s} ours {r['ours']:10.3f}  ref {r['reference']:10.3f} {r['unit']:12s} "
                    f"{label} {fig:6.2f}  goal {r['goal']}",
                    flush=True,
                )
            print(f"  ({name}: {time.perf_counter() - t:.0f} s)", flush=True)
            # after every case: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps({"machine": info, "rounds": args.rounds, "results": rows}, indent=2))
    print(f"wrote {args.out} (the attention kernel a GPU runs, observed: bench/gpu.py)")


if __name__ == "__main__":
    main()
