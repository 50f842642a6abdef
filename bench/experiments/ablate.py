"""Ablation: each variant of configs/variants/ on digits against the plain recipe, same epochs and seeds.

    python bench/experiments/ablate.py --epochs 10 --seeds 0 1 2      # about 7 minutes on 2 CPU cores; writes bench/experiments/ablation.json

Each run is configs/digits.yaml's model with the variant's `model:` section on top, trained with the in-memory data
path for the same number of epochs. Columns: parameters, forward FLOPs per image (FlopCounterMode), training
images/s (wall time of fit, validation included, over training images seen), peak memory of one training step
(CPU: torch's profiler; CUDA: max_memory_allocated), final val/acc mean +- std over the seeds.
"""

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.run import _peak_memory, machine  # noqa: E402
from vit.data.digits import DigitsDataModule
from vit.training.module import ViTClassifier

ROOT = Path(__file__).resolve().parents[2]


def model_config(variant: Path | None) -> dict:
    cfg = dict(yaml.safe_load((ROOT / "configs" / "digits.yaml").read_text())["model"])
    cfg["arch"] = dict(cfg.get("arch", {}))
    if variant is not None:
        extra = dict(yaml.safe_load(variant.read_text())["model"])
        cfg["arch"].update(extra.pop("arch", {}))
        cfg.update(extra)
    return cfg


def run(name: str, cfg: dict, epochs: int, seeds: list[int]) -> dict:
    accs, speeds = [], []
    for seed in seeds:
        L.seed_everything(seed, verbose=False)
        module = ViTClassifier(**cfg)
        dm = DigitsDataModule(batch_size=64)
        trainer = L.Trainer(
            max_epochs=epochs,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        t = time.perf_counter()
        trainer.fit(module, datamodule=dm)
        speeds.append(epochs * len(dm.memory["train"][0]) / (time.perf_counter() - t))
        accs.append(trainer.callback_metrics["val/acc"].item())
    model = module.model.eval()
    x = torch.randn(1, 3, 32, 32)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    batch = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step():
        model.train()
        torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()

    return {
        "variant": name,
        "params": sum(p.numel() for p in model.parameters()),
        "mflops_per_image": counter.get_total_flops() / 1e6,
        "train_img_s": statistics.median(speeds),
        "peak_mib": _peak_memory(step, torch.device("cpu")) / 2**20,
        "acc_mean": statistics.mean(accs),
        "acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "accs": accs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="*", help="variant names (file stems); default: all")
    ap.add_argument("--out", default=str(Path(__file__).parent / "ablation.json"))
    args = ap.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    variants = [None] + sorted((ROOT / "configs" / "variants").glob("*.yaml"))
    run("warm-up", model_config(None), 1, [0])  # first-fit costs (imports, allocator) must not land on the baseline
    rows = []
    print(" | ".join(f"{k}: {v}" for k, v in machine(torch.device("cpu")).items()))
    head = f"{'variant':10s} {'params':>8s} {'MFLOP/img':>10s} {'img/s':>7s} {'peak MiB':>9s}"
    print(f"{head}  val/acc ({args.epochs} epochs, seeds {args.seeds})")
    for v in variants:
        name = "baseline" if v is None else v.stem
        if args.only and name not in args.only:
            continue
        r = run(name, model_config(v), args.epochs, args.seeds)
        rows.append(r)
        print(
            f"{name:10s} {r['params']:8d} {r['mflops_per_image']:10.1f} {r['train_img_s']:7.0f} {r['peak_mib']:9.1f}"
            f"  {r['acc_mean']:.4f} +- {r['acc_std']:.4f}",
            flush=True,
        )
    Path(args.out).write_text(
        json.dumps({"epochs": args.epochs, "seeds": args.seeds, "results": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
