"""An exponential moving average of the weights that reads nothing on the host at each step.

Lightning's `EMAWeightAveraging` keeps the average in torch's `AveragedModel`, whose `update_parameters` does
`bool(self.n_averaged == 0)` and `if self.n_averaged > 0` on a device tensor at every step: two synchronisations a step
on a GPU (tests/training/test_host_reads.py finds them). `DeviceEMA` is the same average, the same state dict
(`n_averaged` included, so checkpoints are unchanged) and the same swap-in for validation and saving (Lightning's
callback does that part), with a host-side flag for "first update" and one `_foreach_lerp_` for the rest.
"""

import itertools

import torch
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.optim.swa_utils import AveragedModel


class DeviceEMA(AveragedModel):
    """`AveragedModel` with EMA of `decay`: W_avg <- decay * W_avg + (1 - decay) * W, the first update a copy."""

    def __init__(self, model: torch.nn.Module, decay: float, device=None, use_buffers: bool = True):
        super().__init__(model, device=device, use_buffers=use_buffers)
        self.decay = decay
        self._started = False  # host mirror of n_averaged > 0

    def _pairs(self, model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self.use_buffers:
            mine = itertools.chain(self.module.parameters(), self.module.buffers())
            theirs = itertools.chain(model.parameters(), model.buffers())
        else:
            mine, theirs = self.parameters(), model.parameters()
        mine = [p.detach() for p in mine]
        return mine, [p.detach().to(a.device) for a, p in zip(mine, theirs)]

    @torch.no_grad()
    def update_parameters(self, model: torch.nn.Module) -> None:
        mine, theirs = self._pairs(model)
        floats = [i for i, t in enumerate(mine) if t.is_floating_point()]
        if not self._started:
            torch._foreach_copy_(mine, theirs)
            self._started = True
        else:  # integer buffers (counters) are copied, as AveragedModel's EMA leaves them to the model
            torch._foreach_lerp_([mine[i] for i in floats], [theirs[i] for i in floats], 1.0 - self.decay)
            others = [i for i, t in enumerate(mine) if not t.is_floating_point()]
            if others:
                torch._foreach_copy_([mine[i] for i in others], [theirs[i] for i in others])
        self.n_averaged += 1

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        self._started = bool(state_dict["n_averaged"] > 0)  # once, when a checkpoint is restored
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class EMA(EMAWeightAveraging):
    """Lightning's `EMAWeightAveraging` (validation and checkpoints use the average) over `DeviceEMA`."""

    def __init__(self, decay: float = 0.999):
        super().__init__(decay=decay)
        self.decay = decay

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        if is_overridden("configure_model", pl_module):  # as Lightning's: build the layers before copying them
            pl_module.configure_model()
        self._average_model = DeviceEMA(pl_module, self.decay, device=self._device or pl_module.device)
