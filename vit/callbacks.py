"""Lightning callbacks: attention maps in TensorBoard."""

import io
import logging
from contextlib import contextmanager

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from torchvision.utils import make_grid

from vit.attention_maps import MeanDistancePlot, _resize, attention_panels, denormalize, overlay_batch, relevance
from vit.device_data import IGNORE
from vit.faithfulness import auc, curves, patch_scores

log = logging.getLogger(__name__)


def _uint8(image: torch.Tensor) -> torch.Tensor:
    """[0, 1] float CHW -> uint8, rounded (values are >= 0, so + 0.5 then truncation rounds)."""
    return image.mul(255).add_(0.5).to(torch.uint8)


def add_png(writer: SummaryWriter, tag: str, image: torch.Tensor, step: int) -> None:
    """`writer.add_image` for a (C, H, W) uint8 image, PNG-encoded by PIL at compression level 1.

    add_image encodes at PIL's default level 6: 118 ms for the six grids of a digits epoch on a 2-core CPU, against
    about a quarter of that here (files ~5% larger). The event is the same Summary.Image that add_image writes.
    """
    c, h, w = image.shape
    buffer = io.BytesIO()
    pixels = image.permute(1, 2, 0).cpu().numpy()
    Image.fromarray(pixels[..., 0] if c == 1 else pixels).save(buffer, format="PNG", compress_level=1)
    value = Summary.Value(
        tag=tag, image=Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=buffer.getvalue())
    )
    writer._get_file_writer().add_summary(Summary(value=[value]), step)  # what add_image itself does with its Summary


@contextmanager
def eager(model: torch.nn.Module):
    """Run a model compiled in place (`model.compile()`, the module's `compile: true`) without its compiled graph:
    the maps hook the attention modules, switch them to the manual path and take gradients of captured tensors,
    which a compiled graph would not see (and each switch of `fused_attn` would compile it again)."""
    compiled = getattr(model, "_compiled_call_impl", None)
    model._compiled_call_impl = None
    try:
        yield model
    finally:
        model._compiled_call_impl = compiled


class AttentionMapCallback(L.Callback):
    """Every `every_n_epochs` validation epochs (0: off), log where the model looks for a fixed set of validation
    images.

    The same `num_images` images every time (the first of the validation set, chosen once), so change over
    training is visible. TensorBoard tags: `attention/rollout` (images over their rollout overlays),
    `attention/layer_{i}` (a row per image, a tile per head: attention each patch receives in block i),
    `attention/query_patch` (where the centre patch looks, per head, in the last block), `attention/mean_distance`
    (figure: mean attention distance per head against depth), scalars `attention/entropy/layer_{i}`,
    `attention/relevance` (the images, the class-specific relevance of the predicted class, and of the true class
    where the prediction is wrong), and the deletion AUC (vit.faithfulness) of relevance and rollout on the first
    `faithfulness_images` validation images: `attention/faithfulness/relevance_deletion`, `.../rollout_deletion`
    (lower: the map finds what the decision rests on).
    Runs only at the end of logged validation epochs (no cost on training steps), on rank zero, without gradients;
    with no TensorBoard logger it does nothing and says so once.
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        num_images: int = 8,
        display_size: int | None = None,
        cmap: str = "inferno",
        faithfulness_images: int = 32,
    ):
        """display_size: each image tile's side in pixels; null: twice the training size, 64-256 px."""
        super().__init__()
        self.faithfulness_images = faithfulness_images
        if every_n_epochs < 0:
            raise ValueError(f"every_n_epochs={every_n_epochs} must be >= 0 (0: off)")
        if num_images < 1:
            raise ValueError(f"num_images={num_images} must be >= 1")
        self.every_n_epochs, self.num_images = every_n_epochs, num_images
        if display_size is not None and display_size < 8:
            raise ValueError(f"display_size={display_size} must be >= 8 px (null: from the image size)")
        self.display_size, self.cmap = display_size, cmap
        self._images: torch.Tensor | None = None
        self._plot: MeanDistancePlot | None = None
        self._warned = False

    def tile_size(self, img_size: int) -> int:
        """Side of each image tile in pixels: `display_size`, or by default twice the training size between 64 and
        256 px (a 32-px image at 64 as before; a 64- or 128-px photo at 128 or 256, where a thin defect and the map
        over it can be seen)."""
        return self.display_size or min(256, max(64, 2 * img_size))

    def _tensorboard(self, trainer: L.Trainer) -> TensorBoardLogger | None:
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger
        if not self._warned:
            log.warning("AttentionMapCallback: no TensorBoardLogger among the loggers, so no attention maps are logged")
            self._warned = True
        return None

    def _fixed_images(self, trainer: L.Trainer) -> torch.Tensor:
        if self._images is None:
            # The first images of the (unshuffled, unaugmented) validation loader: the same ones every epoch; the
            # first num_images are drawn, the first faithfulness_images measured.
            loaders = trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
            want = max(self.num_images, self.faithfulness_images)
            xs, ys, n = [], [], 0
            for x, y in loader:
                xs.append(x[: want - n].detach().cpu())
                ys.append(y[: want - n].detach().cpu())
                n += len(xs[-1])
                if n >= want:
                    break
            keep = torch.cat(ys) != IGNORE  # DDP padding of the in-memory path is no image to show
            self._all_images, self._labels = torch.cat(xs)[keep], torch.cat(ys)[keep]
            self._images = self._all_images[: self.num_images]
        return self._images

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        if self.every_n_epochs == 0 or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        tb = self._tensorboard(trainer)
        if tb is None:
            return
        x = self._fixed_images(trainer).to(pl_module.device)
        hp = pl_module.hparams
        was_training = pl_module.training
        pl_module.eval()
        try:
            with eager(pl_module.model):
                size = self.tile_size(pl_module.model.cfg.img_size)
                panels = attention_panels(pl_module.model, x, hp.mean, hp.std, size, cmap=self.cmap)
                self._log_maps(panels, pl_module, x, tb.experiment, trainer.global_step)
        finally:
            pl_module.train(was_training)

    def _log_maps(self, panels: dict, pl_module: L.LightningModule, x: torch.Tensor, writer, step: int) -> None:
        add_png(writer, "attention/rollout", _uint8(panels["rollout"]), step)
        for i, grid in enumerate(panels["layers"]):
            add_png(writer, f"attention/layer_{i}", _uint8(grid), step)
        add_png(writer, "attention/query_patch", _uint8(panels["query_patch"]), step)
        if self._plot is None:
            self._plot = MeanDistancePlot(*panels["mean_distance"].shape, img_size=pl_module.model.cfg.img_size)
        add_png(writer, "attention/mean_distance", self._plot.render(panels["mean_distance"]), step)
        for i, h in enumerate(panels["entropy"].tolist()):
            writer.add_scalar(f"attention/entropy/layer_{i}", h, step)
        self._log_relevance(pl_module, x, writer, step)

    def _log_relevance(self, pl_module: L.LightningModule, x: torch.Tensor, writer, step: int) -> None:
        """attention/relevance: the images, the relevance of the predicted class, and of the true class where it
        differs (else a blank tile); and the deletion AUC of relevance and rollout on the fixed measuring set."""
        model, hp = pl_module.model, pl_module.hparams
        y = self._labels[: len(x)].to(x.device)
        rel_pred, logits, _ = relevance(model, x)
        rel_true, _, _ = relevance(model, x, target=y)
        images = _resize(denormalize(x.float(), hp.mean, hp.std).cpu(), self.tile_size(model.cfg.img_size))
        wrong = (logits.argmax(-1) != y).cpu()
        true_row = torch.where(wrong[:, None, None, None], overlay_batch(images, rel_true, self.cmap), 1.0)
        rows = torch.cat([images, overlay_batch(images, rel_pred, self.cmap), true_row])
        add_png(writer, "attention/relevance", _uint8(make_grid(rows, nrow=len(x), padding=2, pad_value=1.0)), step)
        if self.faithfulness_images > 0:
            fx = self._all_images[: self.faithfulness_images].to(x.device)
            scores, classes = patch_scores(model, fx)
            for name in ("relevance", "rollout"):
                value = auc(curves(model, fx, scores[name], classes, "deletion")).mean().item()
                writer.add_scalar(f"attention/faithfulness/{name}_deletion", value, step)


class DataRecord(L.Callback):
    """Writes the data config of the run into every checkpoint, as `checkpoint["data"]` ({"class_path", "init_args"},
    plain values, local paths made absolute): `vit-eval --split val` rebuilds the validation split exactly as
    training saw it from the file alone."""

    def __init__(self, data: dict):
        self.data = data

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["data"] = self.data


def plain_data_config(data, cwd=None) -> dict | None:
    """A LightningCLI `data` entry (jsonargparse Namespace or dict) -> {"class_path", "init_args"} of plain values,
    with `root`-like fields that name an existing local path resolved against `cwd` (default: the working folder)."""
    import os
    from pathlib import Path

    if data is None:
        return None
    data = data.as_dict() if hasattr(data, "as_dict") else dict(data)
    args = dict(data.get("init_args") or {})
    for key in ("root", "input_dir"):
        value = args.get(key)
        if isinstance(value, str) and "://" not in value and Path(cwd or os.getcwd(), value).exists():
            args[key] = str(Path(cwd or os.getcwd(), value).resolve())
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}
    return {"class_path": data.get("class_path"), "init_args": plain}


class RunEstimate(L.Callback):
    """One line, early in the first epoch of a fixed recipe: how long the whole run will take on this machine, from
    a few timed training steps (the first `skip` left out: allocation, lazy initialisation), and how many epochs
    would fit in an hour. Two clock reads in the whole run (each a device synchronisation on a GPU); nothing after."""

    def __init__(self, skip: int = 2, timed: int = 5):
        self.skip, self.timed = skip, timed
        self._t0: float | None = None
        self.estimate_s: float | None = None  # the whole run's estimated seconds, once printed
        self.bf16_slowdown: float | None = None  # fp32's speed over bf16's, measured when a CPU run asks for bf16

    def on_train_start(self, trainer, pl_module) -> None:
        """bf16-mixed on a CPU: a few steps of the model at batch 2 in fp32 and in bf16 first. CPUs without bf16
        instructions (AVX2 only) run bf16 ~12x slower (docs/performance.md); say so before the first real step, which
        would otherwise be the first sign. GPUs are not checked: bf16 is their fast path."""
        if pl_module.device.type != "cpu" or "bf16" not in str(trainer.precision):
            return
        from vit.plan import BF16_GAIN, calibrate

        cfg = pl_module.model.cfg
        fp32, bf16 = (calibrate([cfg], 2, "cpu", p, steps=2, warmup=1)[0] for p in ("32-true", "bf16-mixed"))
        if fp32 > BF16_GAIN * bf16:
            self.bf16_slowdown = fp32 / bf16
            if trainer.is_global_zero:
                print(f"bf16-mixed {self._bf16_note()}", flush=True)

    def _bf16_note(self) -> str:
        return f"measured {self.bf16_slowdown:.1f}x slower than fp32 on this CPU: --trainer.precision 32-true"

    @staticmethod
    def _now(pl_module) -> float:
        import time

        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        n = trainer.num_training_batches  # inf for an iterable without a length
        n = self.skip + self.timed if n == float("inf") else int(n)
        # a short epoch (limit_train_batches) times what it has: at least one step, skipping fewer first
        self._timed = max(1, min(self.timed, n - self.skip))
        self._skip = max(0, min(self.skip, n - self._timed))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and self.estimate_s is None and batch_idx == self._skip:
            self._t0 = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.current_epoch != 0 or self.estimate_s is not None or self._t0 is None:
            return
        if batch_idx == self._skip + self._timed - 1:
            self._report(trainer, pl_module, (self._now(pl_module) - self._t0) / self._timed)

    def _report(self, trainer, pl_module, step_s: float) -> None:
        from vit.plan import EPOCH_OVERHEAD

        train_batches = trainer.num_training_batches
        val_batches = sum(trainer.num_val_batches) if trainer.num_val_batches else 0
        # validation is forward-only, about a third of a training step per batch of the same size (vit/plan.py)
        epoch_s = train_batches * step_s * EPOCH_OVERHEAD + val_batches * step_s / 3
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
        self.estimate_s = epochs * epoch_s
        device = pl_module.device
        where = f"{device.type}, {torch.cuda.get_device_name(device)}" if device.type == "cuda" else f"cpu, {cores()}"
        line = (
            f"this recipe: {epochs} epochs of {train_batches} steps, about {duration(self.estimate_s)} on this "
            f"machine ({where}; {step_s:.2f} s a step)"
        )
        if self.estimate_s > 3600:
            from vit.sources import PLANNED

            dm = getattr(trainer, "datamodule", None)
            if dm is not None and f"{type(dm).__module__}.{type(dm).__name__}" in PLANNED:
                line += "; --budget 1h plans a run that fits"  # the planner reads this data source (vit/sources.py)
            fit = max(1, int(3600 // epoch_s))
            line += f"; --trainer.max_epochs {fit} fits in about an hour"
        if self.bf16_slowdown:
            line += f"; bf16-mixed {self._bf16_note()}"
        if trainer.is_global_zero:
            print(line, flush=True)


def cores() -> str:
    import os

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{n} cores"


def duration(seconds: float) -> str:
    """4000 -> '1.1 h', 300 -> '5 min', 40 -> '40 s'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
