"""The convergence levers measured at 60,000 images (docs/recipes.md): Muon, warmup-stable-decay, progressive
resizing, PatchDropout. Each off by default, each checked against what it promises."""

import lightning as L
import pytest
import torch
from conftest import SMOKE

import train
from vit.data.digits import DigitsDataModule
from vit.model.config import ViTConfig
from vit.model.vision_transformer import VisionTransformer
from vit.training.module import ViTClassifier
from vit.training.optim import Muon, MuonWithAdamW
from vit.training.schedules import train_side, warmup_stable_decay

TINY = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def _fit(module: ViTClassifier, epochs: int) -> None:
    """Four training batches an epoch, no validation, nothing written."""
    trainer = L.Trainer(
        max_epochs=epochs, limit_train_batches=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=8))


def _optimizer(**hparams):
    module = ViTClassifier(arch=TINY, **hparams)
    module.trainer = type("T", (), {"estimated_stepping_batches": 100, "max_epochs": 10})()
    return module, module.configure_optimizers()


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    module, conf = _optimizer(optimizer="muon", weight_decay=0.05)
    opt = conf["optimizer"]
    assert isinstance(opt, MuonWithAdamW)
    names = {id(p): n for n, p in module.model.named_parameters()}
    muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert muon == {n for n, p in module.model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")}
    assert {"blocks.0.attn.qkv.weight", "blocks.1.mlp.fc2.weight"} <= muon
    assert {"patch_embed.proj.weight", "head.weight", "pos_embed", "blocks.0.norm1.weight"} <= adamw
    assert muon.isdisjoint(adamw) and len(muon) + len(adamw) == len(names)
    assert all(g["weight_decay"] == 0.05 for g in opt.muon.param_groups)  # matrices are decayed
    assert opt.adamw.defaults["fused"]


def test_the_schedule_sets_the_lr_of_both_optimizers_and_a_step_moves_every_weight():
    module, conf = _optimizer(optimizer="muon", lr=1e-2, warmup_epochs=1)
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    lrs = [g["lr"] for o in (opt.muon, opt.adamw) for g in o.param_groups]
    assert lrs == pytest.approx([1e-2 / 10] * len(lrs))  # warmup step 0 of 10, written through the shared groups
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(x), y)
        loss.backward()
        return loss

    assert torch.isfinite(opt.step(closure))
    sched.step()
    moved = {n for n, p in module.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == set(before)
    lrs = [g["lr"] for o in (opt.muon, opt.adamw) for g in o.param_groups]
    assert lrs == pytest.approx([1e-2 * 2 / 10] * len(lrs))
    state = opt.state_dict()
    assert set(state) == {"muon", "adamw"} and state["muon"]["state"] and state["adamw"]["state"]
    _, fresh = _optimizer(optimizer="muon", lr=1e-2)
    fresh["optimizer"].load_state_dict(state)  # round trip: what resuming needs
    with pytest.raises(ValueError, match="not a MuonWithAdamW state"):
        fresh["optimizer"].load_state_dict(_optimizer()[1]["optimizer"].state_dict())


def test_warmup_stable_decay_holds_the_peak_then_decays_in_the_last_fifth():
    f = warmup_stable_decay(warmup_steps=10, total_steps=110, min_ratio=0.01)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == f(60) == f(88) == 1.0  # stable until 110 - 22 = 88
    assert f(99) == pytest.approx(1 - 0.99 * 0.5)
    assert f(110) == pytest.approx(0.01)


def test_progressive_resizing_grows_by_one_patch_per_phase():
    cfg = ViTConfig(img_size=28, patch_size=7, embed_dim=32, depth=1, num_heads=2)
    sides = [train_side(cfg, 14, 0.5, done) for done in (0.0, 0.24, 0.25, 0.49, 0.5, 0.9)]
    assert sides == [14, 14, 21, 21, None, None]
    assert train_side(cfg, 0, 0.5, 0.0) is None  # off
    with pytest.raises(ValueError, match="resize_from=10 must be a multiple of patch_size=7"):
        ViTClassifier(arch=cfg, resize_from=10)


def test_a_resized_run_trains_on_the_smaller_grid_then_the_full_one(in_tmp):
    module = ViTClassifier(arch=TINY, resize_from=16, resize_until=0.5)
    seen = []
    module.model.patch_embed.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[-1]))
    _fit(module, epochs=4)
    # 32 px, patch 8, sides 16 and 24 over the first half of 4 epochs: one epoch each, then 32
    assert seen == [16] * 4 + [24] * 4 + [32] * 8


def test_patch_dropout_drops_tokens_in_training_only_and_only_early(in_tmp):
    model = VisionTransformer(TINY, patch_drop_rate=0.5)
    tokens = []
    model.blocks[0].register_forward_pre_hook(lambda m, args: tokens.append(args[0].shape[1]))
    model.train()(torch.randn(2, 3, 32, 32))
    model.eval()(torch.randn(2, 3, 32, 32))
    assert tokens == [8, 16]
    with pytest.raises(ValueError, match="patch_drop_rate=0.5 needs attn_pattern='global'"):
        ViTConfig(patch_drop_rate=0.5, attn_pattern="local")
    module = ViTClassifier(arch=ViTConfig(**{**TINY.to_dict(), "patch_drop_rate": 0.5}), patch_drop_until=0.5)
    tokens.clear()
    module.model.blocks[0].register_forward_pre_hook(lambda m, args: tokens.append(args[0].shape[1]))
    _fit(module, epochs=2)
    assert tokens == [8] * 4 + [16] * 4  # 4x4 patches: half dropped in the first of two epochs, none after


def test_muon_and_wsd_train_from_the_command_line_and_resume(in_tmp):
    args = ["fit", "--config", SMOKE, "--model.optimizer", "muon", "--model.schedule", "wsd",
            "--attention_maps.every_n_epochs", "0"]  # fmt: skip
    train.main(args)
    last = in_tmp / "checkpoints" / "smoke" / "version_0" / "last.ckpt"
    assert set(torch.load(last, weights_only=True)["optimizer_states"][0]) == {"muon", "adamw"}
    assert torch.load(last, weights_only=True)["epoch"] == 1
    cli = train.main([*args, "--trainer.max_epochs", "3", "--ckpt_path", str(last)])
    assert cli.trainer.current_epoch == 3 and torch.load(last, weights_only=True)["epoch"] == 2  # resumed, went on
    with pytest.raises(SystemExit, match="optimizer='sgd' must be 'adamw' or 'muon'|optimizer"):
        train.main(["fit", "--config", SMOKE, "--model.optimizer", "sgd"])


@pytest.mark.parametrize("ns_dtype, tol", [(torch.bfloat16, 1e-6), (torch.float32, 3e-4)])
def test_our_muon_steps_as_torch_muon_does(ns_dtype, tol):
    """Same algorithm as torch.optim.Muon (match_rms_adamw): with bf16 Newton-Schulz steps, the same weights after
    three steps; in fp32 (our CPU default), within bf16's rounding of torch's."""
    torch.manual_seed(0)
    shapes = [(48, 16), (16, 16), (48, 16), (16, 64)]  # two of one shape: stacked together; tall and wide
    ours = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = Muon(ours, lr=1e-2, weight_decay=0.1, ns_dtype=ns_dtype)
    ref_opt = torch.optim.Muon(ref, lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grads = [torch.randn(s) for s in shapes]
        for params, o in ((ours, opt), (ref, ref_opt)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            o.step()
    for p, r in zip(ours, ref):
        moved = (r.detach() - p.detach()).abs().max().item()
        assert moved <= tol, (p.shape, moved)
    assert set(opt.state[ours[0]]) == set(ref_opt.state[ref[0]]) == {"momentum_buffer"}  # state dicts interchange
    with pytest.raises(ValueError, match="2D matrices only; got a parameter of shape \\(16,\\)"):
        Muon([torch.nn.Parameter(torch.zeros(16))])


def test_muon_with_adamw_skips_a_flagged_step_on_the_device():
    """The non-finite guard's `found_inf` (vit/training/nonfinite.py): a flagged step with NaN gradients changes no
    weight and no momentum, in both optimizers; the next clean step trains again. No host read decides it."""
    from vit.training.nonfinite import supports_found_inf

    module, conf = _optimizer(optimizer="muon", lr=1e-2, warmup_epochs=0)
    opt = conf["optimizer"]
    assert supports_found_inf(opt)
    params = dict(module.model.named_parameters())

    def step(grad_fill: float, flagged: bool):
        for p in params.values():
            p.grad = torch.full_like(p, grad_fill)
        opt.found_inf = torch.tensor(1.0 if flagged else 0.0)
        opt.step()

    step(0.1, flagged=False)  # momentum exists now
    before = {n: p.detach().clone() for n, p in params.items()}
    momentum = opt.muon.state[params["blocks.0.attn.qkv.weight"]]["momentum_buffer"].clone()
    step(float("nan"), flagged=True)
    assert all(torch.equal(p, before[n]) for n, p in params.items())
    assert torch.equal(opt.muon.state[params["blocks.0.attn.qkv.weight"]]["momentum_buffer"], momentum)
    step(0.1, flagged=False)
    assert not torch.equal(params["blocks.0.attn.qkv.weight"], before["blocks.0.attn.qkv.weight"])
    assert not torch.equal(params["head.weight"], before["head.weight"])


def test_the_logit_adjusted_loss_adds_tau_log_prior_to_the_training_logits_only():
    """Menon et al. (2021): the loss sees logits + tau * log(class shares); the model's own logits are unchanged."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from vit.data.digits import DigitsDataModule

    dm = DigitsDataModule(img_size=16)
    counts = dm.class_counts()
    assert counts == torch.bincount(dm.memory["train"][1], minlength=10).tolist() and sum(counts) > 1000
    module = ViTClassifier(arch=TINY, logit_adjust_tau=2.0, label_smoothing=0.0)
    module._trainer = SimpleNamespace(datamodule=dm, log_every_n_steps=10**9)
    module.on_fit_start()
    module._trainer = None
    prior = torch.tensor(counts, dtype=torch.float32)
    torch.testing.assert_close(module.losses.log_prior, 2.0 * (prior / prior.sum()).log())
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 5])
    module.eval()  # no dropout: the same logits twice
    with torch.no_grad():
        loss = module.training_step((x, y), 0)
        logits = module(x)
    torch.testing.assert_close(loss, F.cross_entropy(logits + module.losses.log_prior, y))
    assert not torch.allclose(loss, F.cross_entropy(logits, y))
