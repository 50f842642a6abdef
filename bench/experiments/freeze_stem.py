"""A screening callback, not a product flag: the hybrid's pretrained CNN stem held still for the first epochs.

python train.py fit ... --trainer.callbacks+=freeze_stem.FreezeStem   (this folder on PYTHONPATH)

LP-FT's argument (Kumar et al., ICLR 2022, "Fine-tuning can distort pretrained features"): a randomly initialised
head sends large, noisy gradients into pretrained features, which fine-tuning end to end then distorts. In the hybrid
the whole transformer on top of the stem is new, so the stem's parameters (`model.patch_embed.stem`, a CnnStem) take
no gradient while `trainer.current_epoch < epochs`; its projection to the blocks' width and the blocks train as
usual, and its BatchNorm keeps adapting its running statistics (train mode throughout). AdamW skips parameters
without a gradient, so the stem's optimizer state starts when it thaws.

The switch is made at each epoch's first batch: Lightning calls the callbacks' on_train_epoch_start before the
module's, and the module's (freeze_backbone_epochs) sets requires_grad on every parameter but the head's, which
would undo a switch made there.
"""

from lightning.pytorch.callbacks import Callback


class FreezeStem(Callback):
    def __init__(self, epochs: int = 1):
        self.epochs = epochs

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx:
            return
        stem = pl_module.model.patch_embed.stem
        frozen = trainer.current_epoch < self.epochs
        for p in stem.parameters():
            p.requires_grad_(not frozen)
        if trainer.current_epoch <= self.epochs:
            print(f"freeze_stem: epoch {trainer.current_epoch}, stem {'frozen' if frozen else 'trained'}", flush=True)
