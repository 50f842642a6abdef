"""The attention-map callback: maps, overlays, mean attention distance and faithfulness in TensorBoard during fit."""

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

from vit.data.device import IGNORE
from vit.evaluation.attention_maps import (
    MeanDistancePlot,
    attention_panels,
    denormalize,
    display_side,
    overlay_batch,
    relevance,
    resize_tiles,
)
from vit.evaluation.faithfulness import auc, curves, patch_scores

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
    where the prediction is wrong), and the deletion AUC (vit.evaluation.faithfulness) of relevance and rollout on the
    first
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
        """Side of each image tile in pixels: `display_size`, or display_side's (vit/evaluation/attention_maps.py:
        a 64- or 128-px photo at 128 or 256, where a thin defect and the map over it can be seen)."""
        return self.display_size or display_side(img_size)

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
            labels = torch.cat(ys)
            if labels.ndim == 2:  # multi-label (N, C) 0/1: the "true class" map is of the image's first label
                labels = torch.where((labels == IGNORE).any(-1), IGNORE, labels.argmax(-1))
            keep = labels != IGNORE  # DDP padding of the in-memory path is no image to show
            self._all_images, self._labels = torch.cat(xs)[keep], labels[keep]
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
        hp = pl_module.recipe
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
        model, hp = pl_module.model, pl_module.recipe
        y = self._labels[: len(x)].to(x.device)
        rel_pred, logits, _ = relevance(model, x)
        rel_true, _, _ = relevance(model, x, target=y)
        images = resize_tiles(denormalize(x.float(), hp.mean, hp.std).cpu(), self.tile_size(model.cfg.img_size))
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
