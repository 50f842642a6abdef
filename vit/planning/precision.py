"""The precision a run trains at: `precision: auto` (the shipped configs) resolved for this machine, and a warning when
a precision typed by hand is known or measured to be slower than fp32 here.

    value, why = resolve_precision("auto", "auto", arch)   # ("32-true", "CPU without native bf16 ...")
    warning = precision_warning("bf16-mixed", "auto", arch)  # a line, or None

The rule (docs/performance.md has the measurements):
- a GPU: bf16-mixed where it has bf16 (Ampere and newer), else 16-mixed (fp16 autocast with a gradient scaler);
- a CPU without native bf16 (no AVX512-BF16 or AMX: most laptops and many cloud CPUs, e.g. AVX2-only AMD EPYC; or
  ONEDNN_MAX_CPU_ISA below them): fp32.
  bf16 autocast is emulated there: the CIFAR config's first step took 150 s against 5 s in fp32 (a 2-core EPYC);
- a CPU with native bf16: a few timed training steps of the run's own model in each (the planner's `calibrate`), and
  bf16-mixed only when it is BF16_GAIN faster (on a 2-core Xeon with AMX: 0.65x at 64x3, 0.96x at 128x6).
The CLI resolves it before anything is built, prints one line, and the saved config.yaml and plan.yaml hold the
resolved value, so that a rerun from them trains the same way.
"""

from __future__ import annotations

import torch

from vit.model.config import ViTConfig
from vit.planning.speed import native_bf16_cpu

# The one probe of both precisions on a CPU that has bf16: a few training steps of the run's model at this batch
PROBE_BATCH, PROBE_STEPS = 8, 3
BF16_GAIN = 1.1  # bf16 is taken where its training step is this much faster than fp32's: it rounds, so it must buy


def decide_precision(device: str, measure, *, native=None) -> tuple[str, str]:
    """The precision rule, for `precision: auto`, the plan and the run's first check alike: (Lightning's precision,
    why). `device` "cuda" or "cpu"; `measure()` -> (fp32, bf16) training images/s of the run's model, called only on a
    CPU whose bf16 is native or unknown (elsewhere the flags answer); `native`: native_bf16_cpu unless given."""
    if device == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16-mixed", "a GPU with bf16"
        return "16-mixed", "a GPU without bf16: fp16 autocast with a gradient scaler"
    has = (native or native_bf16_cpu)()
    if has is False:
        return (
            "32-true",
            "a CPU without native bf16 (no AVX512-BF16, AMX or Arm BF16, or oneDNN held below them): bf16 would be "
            "emulated, ~30x slower",
        )
    fp32, bf16 = measure()
    chosen = "bf16-mixed" if bf16 > BF16_GAIN * fp32 else "32-true"
    kind = "native bf16" if has else "unknown bf16 support"
    return (
        chosen,
        f"a CPU with {kind}: measured fp32 {fp32:.0f} img/s, bf16 {bf16:.0f} img/s (bf16 when > {BF16_GAIN}x)",
    )


def _device(accelerator: str | None) -> str:
    wants_cpu = str(accelerator or "auto") == "cpu"
    return "cuda" if torch.cuda.is_available() and not wants_cpu else "cpu"


def probe(arch: ViTConfig) -> tuple[float, float]:
    """Training images/s of the run's model at fp32 and at bf16-mixed on this CPU: a few steps at a small batch."""
    from vit.planning.speed import calibrate  # looked up at call time: tests replace it

    return tuple(
        calibrate([arch], PROBE_BATCH, "cpu", p, steps=PROBE_STEPS, warmup=1)[0] for p in ("32-true", "bf16-mixed")
    )


def resolve_precision(
    requested, accelerator: str | None, arch: ViTConfig | None, *, native=None, measure=None
) -> tuple[str, str]:
    """(Lightning's precision, why) for `requested` ("auto" resolves; anything else is kept as given). `native`,
    `measure`: native_bf16_cpu and probe unless given (tests pass fakes)."""
    if str(requested) != "auto":
        return str(requested), "as given"
    device = _device(accelerator)
    if arch is None and device == "cpu" and (native or native_bf16_cpu)() is not False:
        return "32-true", "a CPU: fp32 (no model to time bf16 on)"
    return decide_precision(device, lambda: (measure or probe)(arch), native=native)


def precision_warning(requested, accelerator: str | None, *, native=None) -> str | None:
    """A one-line warning for a precision typed by hand that is known to be slower than fp32 here (bf16 or fp16 on a
    CPU without native bf16); None otherwise. A CPU with native bf16 is measured when training starts instead
    (vit/run/estimate.py RunEstimate)."""
    text, native = str(requested), native or native_bf16_cpu
    if _device(accelerator) != "cpu" or not any(k in text for k in ("bf16", "16-")) or text.startswith("32"):
        return None
    if native() is False:
        return (
            f"warning: precision {text} on a CPU without native bf16 (no AVX512-BF16 or AMX) is emulated and ~30x "
            "slower than fp32 here: --trainer.precision 32-true (or auto)"
        )
    return None
