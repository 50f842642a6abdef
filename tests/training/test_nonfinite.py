"""The device-side non-finite guard: what it tells the fused optimizer and what it reports, without a training run."""

import torch
from torch.nn.utils import get_total_norm

from vit.training.nonfinite import NonFiniteGuard, supports_found_inf


def _setup(grad_value: float):
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    p.grad = torch.full((3,), grad_value)
    return p, opt


def test_a_nan_loss_skips_the_update_and_is_reported_with_its_position():
    guard = NonFiniteGuard()
    p, opt = _setup(float("nan"))
    guard.on_loss(torch.tensor(float("nan")), step=7, epoch=1, batch=3)
    guard.before_optimizer_step(opt, get_total_norm([p.grad]), step=7)
    assert opt.found_inf.item() == 1.0
    opt.step()
    assert torch.equal(p.detach(), torch.ones(3)) and int(opt.state[p]["step"]) == 0  # update and step count undone
    count, step, epoch, batch, loss = guard.take()
    assert (count, step, epoch, batch) == (1, 7, 1, 3) and loss != loss  # NaN
    assert guard.take() is None  # cleared


def test_finite_steps_update_and_report_nothing():
    guard = NonFiniteGuard()
    p, opt = _setup(1.0)
    guard.on_loss(torch.tensor(2.5), step=0, epoch=0, batch=0)
    guard.before_optimizer_step(opt, get_total_norm([p.grad]), step=0)
    assert opt.found_inf.item() == 0.0
    opt.step()
    assert not torch.equal(p.detach(), torch.ones(3))
    assert guard.take() is None


def test_with_several_processes_the_shared_gradients_decide():
    """Under DDP a rank whose own loss is finite still skips when the all-reduced gradients carry a NaN; a rank whose
    own loss is NaN follows the shared gradients (every rank must take the same decision), and still reports it."""
    guard = NonFiniteGuard()
    p, opt = _setup(float("inf"))
    guard.on_loss(torch.tensor(0.3), step=4, epoch=0, batch=4)
    guard.before_optimizer_step(opt, get_total_norm([p.grad]), step=4, world_size=2)
    assert opt.found_inf.item() == 1.0 and guard.take()[1] == 4
    guard.on_loss(torch.tensor(float("nan")), step=5, epoch=0, batch=5)
    guard.before_optimizer_step(opt, torch.tensor(1.0), step=5, world_size=2)
    assert opt.found_inf.item() == 0.0 and guard.take()[1] == 5


def test_a_finite_loss_with_infinite_gradients_is_skipped_on_one_process():
    guard = NonFiniteGuard()
    p, opt = _setup(float("inf"))
    guard.on_loss(torch.tensor(0.3), step=2, epoch=0, batch=2)
    guard.before_optimizer_step(opt, get_total_norm([p.grad]), step=2)
    assert opt.found_inf.item() == 1.0
    opt.step()
    assert torch.equal(p.detach(), torch.ones(3))
    count, step, _, _, loss = guard.take()
    assert (count, step) == (1, 2) and abs(loss - 0.3) < 1e-6


def test_a_nan_in_an_earlier_micro_batch_skips_the_accumulated_step():
    """accumulate_grad_batches=3: the NaN came in the first micro-batch, the last one's loss is finite."""
    guard = NonFiniteGuard()
    p, opt = _setup(1.0)  # finite gradients, as if the NaN had been masked downstream: the loss alone must decide
    for batch, value in enumerate((float("nan"), 0.5, 0.4)):
        guard.on_loss(torch.tensor(value), step=9, epoch=0, batch=batch)
    guard.before_optimizer_step(opt, get_total_norm([p.grad]), step=9)
    assert opt.found_inf.item() == 1.0
    count, step, _, _, loss = guard.take()
    assert (count, step) == (1, 9) and loss != loss  # the NaN micro-batch's loss names it


def test_only_fused_adam_reads_found_inf():
    params = [torch.nn.Parameter(torch.ones(2))]
    assert supports_found_inf(torch.optim.AdamW(params, fused=True))
    assert supports_found_inf(torch.optim.Adam(params, fused=True))
    assert not supports_found_inf(torch.optim.AdamW(params))
    assert not supports_found_inf(torch.optim.SGD(params, lr=0.1))
