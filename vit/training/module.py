"""The LightningModule: loss, metrics, optimizer and schedule around the plain `VisionTransformer`.

Its `__init__` takes the `model:` section of the YAML configs as two config objects: `arch` (vit.model.ViTConfig)
and the training recipe's fields, flat (vit.training.recipe.TrainingRecipe). Everything predict needs to rebuild
the model and preprocess an image (architecture, class names, image size, mean, std) is saved as plain types in the
checkpoint's `hyper_parameters`, so checkpoints load with `torch.load(weights_only=True)`.
"""

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch.nn.utils import get_total_norm

from vit.data.device import IGNORE
from vit.model.config import ViTConfig
from vit.model.moe import MoEMlp
from vit.model.record import rng_states_of
from vit.model.start_weights import forget_weight_files, load_start_weights
from vit.model.vision_transformer import VisionTransformer
from vit.training.drloc import RelativeLocalization
from vit.training.freezing import frozen_names, hold_batchnorm
from vit.training.losses import LossTerms
from vit.training.metrics import ConfusionCounts, TopKAccuracy, expert_usage_histograms
from vit.training.multilabel import multilabel_loss, multilabel_metrics
from vit.training.nonfinite import NonFiniteGuard, NonFiniteLossError, supports_found_inf
from vit.training.optim import build_optimizer, clip_on_device, grads_of
from vit.training.recipe import RECIPE_FIELDS, TrainingRecipe
from vit.training.rng import restore_rng_states, rng_states
from vit.training.schedules import lr_factor, schedule_warmup, train_side
from vit.training.teacher import LocalityGuidance, TeacherFit


class ViTClassifier(L.LightningModule):
    """Image classification with a ViT.

    Args:
        arch: the architecture (`vit.model.ViTConfig`; a dict of its fields also works): `model.arch` in YAML.
        **recipe: the training recipe's fields (`vit.training.recipe.TrainingRecipe`: lr, schedule, losses, starting
            weights, class names...), flat: `model.lr` in YAML, `--model.lr` on the command line. Kept typed as
            `self.recipe` and saved, with `arch` as a dict, as the checkpoint's `hyper_parameters`.
    """

    def __init__(
        self,
        arch: ViTConfig = ViTConfig(),  # noqa: B008 (a frozen-by-convention default: replaced, never mutated)
        **recipe,
    ):
        super().__init__()
        if isinstance(arch, dict):  # load_from_checkpoint passes the saved hyper-parameters back: arch is a dict
            arch = ViTConfig.from_dict(arch)
        unknown = sorted(set(recipe) - RECIPE_FIELDS)
        if unknown:  # a TypeError from the dataclass would not say where the name came from
            raise ValueError(f"model argument {unknown[0]!r} is neither a training recipe field nor arch")
        self.recipe = TrainingRecipe(**recipe)  # checked: one ValueError naming the field and the value
        self.recipe.check_with(arch)
        # Plain types only (lists, not tuples of objects): the checkpoint must load with weights_only=True.
        self.save_hyperparameters()
        self.hparams.update(arch=arch.to_dict(), **self.recipe.to_dict())
        self.model = VisionTransformer(arch)
        self._moe_layers = [m for m in self.model.modules() if isinstance(m, MoEMlp)]  # a list: not re-registered
        self._expert_counts = torch.zeros(len(self._moe_layers), arch.moe_experts, dtype=torch.long)
        r = self.recipe
        load_start_weights(self.model, r.init_from, r.stem_from, r.class_names)  # on_save_checkpoint forgets the files
        # DRLoc's MLP and locality guidance's maps: trained beside the ViT (drloc.*, guidance.*), never exported
        self.drloc = RelativeLocalization(arch.embed_dim) if r.drloc_weight > 0 else None
        self.guidance = LocalityGuidance.of(r.teacher, arch) if r.guidance_weight > 0 else None
        self.losses = LossTerms(
            num_classes=arch.num_classes,
            task=r.task,
            label_smoothing=r.label_smoothing,
            mixup_alpha=r.mixup_alpha,
            cutmix_alpha=r.cutmix_alpha,
            mixup_prob=r.mixup_prob,
            distill_weight=r.distill_weight,
            moe_aux_weight=r.moe_aux_weight,
        )
        self._add_metrics(arch.num_classes)
        if r.task == "multilabel":
            self.val_multi, self.test_multi = multilabel_metrics(arch.num_classes), multilabel_metrics(arch.num_classes)
        self._add_training_state()

    def _add_training_state(self) -> None:
        """What the hooks set during fit, empty until then."""
        self._guard, self._guard_on_device, self._skipped = NonFiniteGuard(), False, 0
        self._grad_norm: torch.Tensor | None = None  # () of this step's gradients, set in on_before_optimizer_step
        self._frozen: list[torch.nn.Parameter] = []  # frozen parameters whose gradients a DDP step drops
        self._held: set[str] = set()  # names of the parameters frozen this epoch (training/freezing.py)
        # The frozen teacher, set by TeacherFit; in __dict__, outside the module tree: not in the state dict, not
        # moved by .to(), not seen by the optimizer
        self.__dict__["teacher"] = None
        self.teacher_scores, self.teacher_record = {}, {}  # logged as teacher/*; saved as the checkpoints' `teacher`

    def _add_metrics(self, num_classes: int) -> None:
        """Top-1 / top-5 and the confusion counts, counted on the device without a host read (training/metrics.py)."""
        top5 = min(5, num_classes)
        self.train_acc = TopKAccuracy(1)
        self.val_acc = TopKAccuracy(1)
        self.val_acc5 = TopKAccuracy(top5)
        self.val_counts = ConfusionCounts(num_classes)  # val/acc_balanced and val/f1_macro, once an epoch
        self.test_acc = TopKAccuracy(1)
        self.test_acc5 = TopKAccuracy(top5)

    def configure_model(self) -> None:
        # In place, so that state-dict keys stay `model.*` (self.model = torch.compile(...) would add `_orig_mod.`).
        if self.recipe.compile and not getattr(self, "_compiled", False):
            self.model.compile()
            self._compiled = True

    def configure_callbacks(self) -> list[L.Callback]:
        callbacks: list[L.Callback] = []
        if self.recipe.ema_decay > 0:
            from vit.training.ema import EMA  # Lightning's EMAWeightAveraging without its two host reads a step

            callbacks.append(EMA(decay=self.recipe.ema_decay))
        if self.recipe.teacher:
            hp = self.recipe
            callbacks.append(TeacherFit(hp.teacher, hp.teacher_share, img_size=hp.teacher_img_size))
        return callbacks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def forward_train(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float, tuple | None]:
        """A training batch's logits (B, C) (the class head's), the weighted auxiliary losses (DRLoc on the final
        tokens, locality guidance on every block's; 0 without) and, with a teacher, what distillation compares: the
        distillation token's head's logits (else the same logits) and the teacher's on the batch."""
        teacher_logits, maps = None, None
        if self.teacher is not None:
            with torch.no_grad():
                seen = self.teacher.renormalise(x, *self._teacher_norm)
                guided = self.guidance is not None
                teacher_logits, maps = self.teacher.with_features(seen) if guided else (self.teacher(seen), None)
        if self.drloc is None and maps is None and self.model.dist_token is None:
            logits = self(x)  # through the model's forward: the compiled one under --model.compile
            return logits, 0.0, None if teacher_logits is None else (logits, teacher_logits)
        taps = [] if maps is not None else None  # each block's tokens (B, prefix + N, D)
        tokens = self.model.forward_features(x, taps)  # (B, prefix + N, D)
        grid, prefix = self.model.patch_embed.grid(x), self.model.num_prefix_tokens
        aux = self.recipe.drloc_weight * self.drloc(tokens[:, prefix:], grid) if self.drloc is not None else 0.0
        if maps is not None:
            aux = aux + self.recipe.guidance_weight * self.guidance([t[:, prefix:] for t in taps], maps, grid)
        logits, dist = self.model.forward_heads(tokens)  # dist (B, C): None without a distillation token
        return logits, aux, None if teacher_logits is None else (logits if dist is None else dist, teacher_logits)

    def set_teacher(self, teacher: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor, record: dict) -> None:
        """The frozen teacher, the student's normalisation (mean, std: (1, C, 1, 1) on the device) and what the
        teacher scored alone (logged as teacher/*, saved in the checkpoints' `teacher` key)."""
        self.__dict__["teacher"] = teacher
        self._teacher_norm = (mean, std)
        self.teacher_record = record
        self.teacher_scores = {f"teacher/{k}": float(record[k]) for k in ("val_acc", "val_acc_balanced")}

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        side = getattr(self, "_train_side", None)
        if side is not None and side != x.shape[-1]:  # progressive resizing: (B, C, H, W) -> (B, C, side, side)
            x = F.interpolate(x, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
        x, target, mixed = self.losses.mix(x, y)
        logits, aux, distill = self.forward_train(x)
        moe_aux = None
        if self._moe_layers:  # load balancing across experts, weighted into the loss
            moe_aux = torch.stack([m.aux_loss for m in self._moe_layers]).sum()
            self.log("train/moe_aux_loss", moe_aux)
            counts = torch.stack([m.expert_counts for m in self._moe_layers])  # (blocks, E) on the device
            self._expert_counts = self._expert_counts.to(counts.device) + counts
        loss = self.losses(logits, target, mixed=mixed, distill=distill, aux=aux, moe_aux=moe_aux)
        if not mixed and self.recipe.task != "multilabel":
            # update only: one log of the epoch's accuracy in on_train_epoch_end instead of a self.log per step
            # (each costs Lightning an apply_to_collection over the metric), and no per-batch compute
            self.train_acc.update(logits.detach(), y.argmax(-1) if y.is_floating_point() else y)
        if self._guard_on_device:  # checked on the device before the update (on_before_optimizer_step)
            self._guard.on_loss(loss, self.global_step, self.current_epoch, batch_idx)
        elif not torch.isfinite(loss):  # an optimizer without `found_inf`: a host check (a sync) per step
            if self.recipe.skip_nonfinite:
                self._skipped += 1
                return None  # Lightning skips backward and the optimizer step
            raise NonFiniteLossError.at(loss.item(), self.global_step, self.current_epoch, batch_idx)
        # Only on the steps Lightning writes to the logger: each self.log costs ~1 ms of Lightning's bookkeeping on
        # CPU (5% of a digits step), and the progress bar shows the latest logged value.
        trainer = self._trainer  # None when a user calls training_step by hand: log every step (self.log warns)
        if trainer is None or (self.global_step + 1) % max(1, trainer.log_every_n_steps) == 0:
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        for p in self._frozen:  # freeze_*_epochs under DDP (on_train_epoch_start)
            p.grad = None
        # The gradients' total norm, once per step on the device: the non-finite check and clipping by norm share it.
        trainer, self._grad_norm = self._trainer, None
        clip_norm = trainer is not None and trainer.gradient_clip_val and trainer.gradient_clip_algorithm != "value"
        if self._guard_on_device or clip_norm:
            opt = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer inside a LightningOptimizer
            self._grad_norm = get_total_norm(grads_of(opt), foreach=True)  # (): one _foreach_norm, no host read
        if self._guard_on_device:
            world = trainer.world_size if trainer is not None else 1
            self._guard.before_optimizer_step(opt, self._grad_norm, self.global_step, world)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """`--trainer.gradient_clip_val` (by "norm", the default, or "value"), on the device for every optimizer and
        precision. Lightning clips through its precision plugin, which under bf16-mixed refuses every optimizer that
        "unscales internally" (fused AdamW, our default: `RuntimeError: ... does not allow for gradient clipping`).
        bf16 has no loss scale, so clipping is plain arithmetic on the gradients: torch's own functions, with the
        total norm computed once a step in on_before_optimizer_step (shared with the non-finite check)."""
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            # 16-mixed: the gradients are still multiplied by the loss scale here; Lightning unscales before clipping
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        clip_on_device(
            getattr(optimizer, "optimizer", optimizer), gradient_clip_val, gradient_clip_algorithm, self._grad_norm
        )

    def _check_nonfinite(self) -> None:
        """Read the device record (a sync; only where Lightning syncs anyway): stop naming the step, or count it."""
        found = self._guard.take() if self._guard_on_device else None
        if found is None:
            return
        count, step, epoch, batch, loss = found
        if not self.recipe.skip_nonfinite:
            raise NonFiniteLossError.at(loss, step, epoch, batch)
        self._skipped += count

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            self._check_nonfinite()

    def on_train_epoch_end(self) -> None:
        """train/acc of the epoch (synced across ranks by torchmetrics); expert usage, a histogram per MoE block."""
        self._check_nonfinite()
        if self._skipped:
            self.log("train/skipped_nonfinite", float(self._skipped))
            self._skipped = 0
        if self.teacher_scores:  # constant: the teacher alone, beside the student's curves
            self.log_dict(self.teacher_scores)
        if self.train_acc.update_called:  # Mixup/CutMix batches have no hard labels to score
            self.log("train/acc", self.train_acc.compute())
            self.train_acc.reset()
        if not self._moe_layers:
            return
        tb = next((lg for lg in self.loggers if isinstance(lg, TensorBoardLogger)), None)
        if tb is not None and self.trainer.is_global_zero:
            expert_usage_histograms(tb.experiment, self._expert_counts.cpu(), self.global_step)  # once an epoch
        self._expert_counts.zero_()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self._check_nonfinite()  # before anything is written: no checkpoint holds a step the record flags
        forget_weight_files(checkpoint)  # the weights are in the state dict; their files are named for the record
        if self.teacher_record:  # the teacher's name, epochs, seconds and scores alone, for the record
            checkpoint["teacher"] = dict(self.teacher_record)
        checkpoint["rng_states"] = rng_states()  # resuming continues the exact random stream (vit/training/rng.py)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Applied in on_train_start: the sanity-check validation in between must not shift the random stream.
        self._rng_to_restore = rng_states_of(checkpoint)
        # Lightning restores a stateful train loader only if it did not build the loader earlier, and
        # `estimated_stepping_batches` (configure_optimizers) does build it: hand the position over ourselves.
        fit_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        self._loader_state = fit_state.get("combined_loader") or None

    def on_fit_start(self) -> None:
        tau = self.recipe.logit_adjust_tau
        if tau > 0:
            counts = self.trainer.datamodule.class_counts() if self.trainer.datamodule is not None else None
            if counts is None:
                raise ValueError(
                    "logit_adjust_tau needs the training set's class counts, which this data does not give"
                )
            self.losses.set_prior(counts, tau, self.device)

    def on_train_start(self) -> None:
        self._guard_on_device = supports_found_inf(self.optimizers(use_pl_optimizer=False))
        loader_state, self._loader_state = getattr(self, "_loader_state", None), None
        loader = self.trainer.train_dataloader
        if loader_state and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(loader_state[0])  # the in-memory path resumes mid-epoch at the right batch
        rng, self._rng_to_restore = getattr(self, "_rng_to_restore", None), None
        if rng:
            restore_rng_states(rng)

    def _eval_step(self, batch, stage: str) -> None:
        x, y = batch
        logits = self(x)
        if self.recipe.task == "multilabel":  # (B, C) 0/1 targets: mAP and F1 instead of accuracy
            scores = self.val_multi if stage == "val" else self.test_multi
            scores.update(logits, y.long())
            self.log(f"{stage}/loss", multilabel_loss(logits, y), prog_bar=True, sync_dist=True)
            self.log_dict({f"{stage}/{k}": m for k, m in scores.items()}, prog_bar=False)
            return
        acc, acc5 = (self.val_acc, self.val_acc5) if stage == "val" else (self.test_acc, self.test_acc5)
        acc.update(logits, y)
        acc5.update(logits, y)
        if stage == "val":
            self.val_counts.update(logits, y)
        # sync_dist: the mean over all ranks' batches (torchmetrics objects sync themselves)
        loss = F.cross_entropy(logits, y, ignore_index=IGNORE)  # DDP padding of the in-memory path left out
        self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)
        self.log(f"{stage}/acc5", acc5)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        """The mean recall over classes (what accuracy hides on an imbalanced folder) and macro F1, from the epoch's
        confusion counts (summed over ranks by torchmetrics)."""
        if self.recipe.task == "multilabel":
            return
        if self.val_counts.update_called:
            balanced, f1 = self.val_counts.compute()
            self.log("val/acc_balanced", balanced)
            self.log("val/f1_macro", f1)
        self.val_counts.reset()

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def train(self, mode: bool = True):
        """nn.Module.train, with the BatchNorm layers of frozen parameters held in eval mode (training/freezing.py):
        Lightning calls it at the start of fit and after each validation."""
        super().train(mode)
        hold_batchnorm(self.model, getattr(self, "_held", set()), mode)
        return self

    def on_train_epoch_start(self) -> None:
        frozen = self._held = frozen_names(self.model, self.current_epoch, self.recipe)
        hold_batchnorm(self.model, frozen, self.training)
        # One process: no gradients for the frozen parameters at all (no backward through them). Under DDP the
        # parameters that take part were fixed when the model was wrapped, so they keep requires_grad and their
        # gradients are dropped before the optimizer step instead (fused AdamW and Muon skip a parameter without one).
        ddp = self._trainer is not None and self.trainer.world_size > 1
        for name, p in self.model.named_parameters():
            p.requires_grad_(name not in frozen or ddp)
        self._frozen = [p for name, p in self.model.named_parameters() if name in frozen] if ddp else []
        # Phases by the share of the epochs done (max_epochs as it stands: FitBudget may resize it).
        done = self.current_epoch / max(1, self.trainer.max_epochs or 1)
        hp = self.recipe
        self._train_side = train_side(self.model.cfg, hp.resize_from, hp.resize_until, done)
        if self.model.patch_drop is not None:
            on = done < self.recipe.patch_drop_until
            self.model.patch_drop.prob = self.model.cfg.patch_drop_rate if on else 0.0

    def configure_optimizers(self):
        hp = self.recipe
        optimizer = build_optimizer(
            self.model,
            [aux for aux in (self.drloc, self.guidance) if aux is not None],
            optimizer=hp.optimizer,
            lr=hp.lr,
            weight_decay=hp.weight_decay,
            layer_decay=hp.layer_decay,
            betas=tuple(hp.betas),
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        steps_per_epoch = total / max(1, self.trainer.max_epochs or 1)
        warmup = schedule_warmup(hp.warmup_epochs, steps_per_epoch, total, self.trainer.max_epochs)
        if any(type(cb).__name__ == "Timer" for cb in getattr(self.trainer, "callbacks", ())):  # --trainer.max_time
            rank_zero_warn(
                "trainer.max_time can stop training before the learning-rate schedule (planned over max_epochs) "
                "completes: the run would end mid-cosine. Lower max_epochs so that it fits the time instead."
            )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(hp, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
