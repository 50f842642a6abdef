"""No host read on the training hot path: every aten op of real training, validation and optimizer steps and of the
per-step callbacks is recorded (a TorchDispatchMode sees each op, whoever calls it), and any op whose result the host
must wait for fails the test. On a GPU each of these is a synchronisation that stalls the device.

Allowed, for a reason: the non-finite guard's record (`NonFiniteGuard.take`), read on purpose at the logging interval
(`log_every_n_steps`), at the end of the epoch and before a checkpoint, where Lightning waits for the device anyway.
(torchmetrics' top-k accuracy, whose `one_hot` read the host on CPUs, is no longer used: vit/training/metrics.py.)
"""

import traceback

import lightning as L
import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from vit.data.digits import DigitsDataModule
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier

# aten ops whose output the host reads: .item()/bool()/int() of a tensor, data-dependent shapes
HOST_READS = {
    "aten._local_scalar_dense",
    "aten.nonzero",
    "aten._unique2",
    "aten.unique_dim",
    "aten.unique_consecutive",
    "aten.masked_select",
    "aten.repeat_interleave",  # with a tensor of repeats: the output size is read
    "aten._assert_async",
}


class HostReads(TorchDispatchMode):
    """Records each host-read op (with the Python frames that led to it) while `depth` > 0."""

    def __init__(self):
        super().__init__()
        self.depth, self.found = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if self.depth and name in HOST_READS:
            frames = traceback.extract_stack()[:-1]
            allowed = any(f.name == "take" for f in frames)
            if not allowed:
                where = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames[-8:]]
                self.found.append((name, where))
        return func(*args, **(kwargs or {}))


def _watch(obj, method: str, mode: HostReads, monkeypatch) -> None:
    original = getattr(obj, method)

    def watched(*a, **k):
        mode.depth += 1
        try:
            return original(*a, **k)
        finally:
            mode.depth -= 1

    monkeypatch.setattr(obj, method, watched)


class _WatchSteps(L.Callback):
    """Puts the mode around the optimizer's step and every per-step hook of the callbacks (its own excepted)."""

    def __init__(self, mode: HostReads, monkeypatch):
        self.mode, self.mp = mode, monkeypatch

    def on_train_start(self, trainer, module):
        for opt in trainer.optimizers:
            _watch(opt, "step", self.mode, self.mp)
        for cb in trainer.callbacks:
            if cb is self:
                continue
            for hook in (
                "on_train_batch_start",
                "on_train_batch_end",
                "on_before_optimizer_step",
                "on_before_backward",
                "on_after_backward",
                "on_validation_batch_end",
            ):
                if type(cb).__dict__.get(hook) or any(hook in vars(k) for k in type(cb).__mro__[1:-2]):
                    _watch(cb, hook, self.mode, self.mp)


OPTIONS = {
    "adamw": ({}, {}),
    "muon": ({"optimizer": "muon"}, {}),
    "patch_dropout": ({}, {"patch_drop_rate": 0.5}),
    "ema": ({"ema_decay": 0.9}, {}),
    "moe": ({}, {"moe_experts": 4, "moe_top_k": 2}),
    "clipping": ({}, {}),  # with --trainer.gradient_clip_val
}


@pytest.mark.parametrize("option", OPTIONS)
def test_training_and_validation_steps_read_nothing_on_the_host(option, monkeypatch):
    module_kwargs, arch_kwargs = OPTIONS[option]
    arch = ViTConfig(embed_dim=32, depth=2, num_heads=2, patch_size=8, drop_path_rate=0.1, **arch_kwargs)
    module = ViTClassifier(arch=arch, **module_kwargs)
    mode = HostReads()
    for hook in (
        "training_step",
        "validation_step",
        "on_before_optimizer_step",
        "configure_gradient_clipping",
        "on_train_batch_end",
        "backward",
    ):
        _watch(module, hook, mode, monkeypatch)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        log_every_n_steps=2,  # one deliberate read of the non-finite record (allowed above) on the way
        gradient_clip_val=1.0 if option == "clipping" else None,
        callbacks=[_WatchSteps(mode, monkeypatch)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with mode:
        trainer.fit(module, datamodule=DigitsDataModule(batch_size=16, eval_batch_size=32))
    assert trainer.global_step == 4
    assert mode.found == [], "\n".join(f"{op} at {' <- '.join(reversed(where))}" for op, where in mode.found[:5])
