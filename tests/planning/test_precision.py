"""`precision: auto` (vit/planning/precision.py): the rule for each kind of device, with the capabilities mocked; the
warning for a slow precision typed by hand; the resolved value in the saved config."""

import pytest
import torch
import yaml
from conftest import SMOKE

import train
from vit.model.config import ViTConfig
from vit.planning import precision as P

ARCH = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)


def never(*_):
    raise AssertionError("measured where the rule needs no measurement")


def test_a_gpu_takes_bf16_where_it_has_it_else_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert P.resolve_precision("auto", "auto", ARCH, measure=never)[0] == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert P.resolve_precision("auto", "gpu", ARCH, measure=never)[0] == "16-mixed"
    # a CPU run asked for on a GPU machine follows the CPU's rule
    assert P.resolve_precision("auto", "cpu", ARCH, native=lambda: False, measure=never)[0] == "32-true"


def test_a_cpu_without_native_bf16_takes_fp32_without_measuring(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    value, why = P.resolve_precision("auto", "auto", ARCH, native=lambda: False, measure=never)
    assert value == "32-true" and "without native bf16" in why


@pytest.mark.parametrize("speeds, want", [((100.0, 150.0), "bf16-mixed"), ((100.0, 105.0), "32-true")])
def test_a_cpu_with_native_bf16_takes_what_measures_faster(monkeypatch, speeds, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    value, why = P.resolve_precision("auto", None, ARCH, native=lambda: True, measure=lambda arch: speeds)
    assert value == want and "fp32 100 img/s" in why


def test_an_explicit_precision_is_kept_and_a_slow_one_warned_about(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.resolve_precision("bf16-mixed", None, ARCH, measure=never) == ("bf16-mixed", "as given")
    warning = P.precision_warning("bf16-mixed", None, native=lambda: False)
    assert warning.startswith("warning: precision bf16-mixed on a CPU without native bf16") and "\n" not in warning
    assert P.precision_warning("32-true", None, native=lambda: False) is None
    assert P.precision_warning("bf16-mixed", None, native=lambda: True) is None  # measured at train start instead


def test_cpu_flags_are_read_from_cpuinfo():
    assert P.native_bf16_cpu("processor: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n") is True
    assert P.native_bf16_cpu("processor: 0\nflags\t\t: fpu sse avx2 fma\n") is False
    # Arm names its features in a `Features` line: Graviton 3 (Neoverse V1) has bf16, Graviton 2 (N1) has not
    assert P.native_bf16_cpu("processor\t: 0\nFeatures\t: fp asimd sve asimddp sha512 bf16 i8mm\n") is True
    assert P.native_bf16_cpu("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n") is False


def test_onednn_held_below_bf16_makes_bf16_emulated_whatever_the_flags(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 (a laptop imitated on a newer CPU; the suite's setting) leaves oneDNN no bf16
    arithmetic: fp32, untimed, on this machine too."""
    amx = "processor: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n"
    assert P.native_bf16_cpu(amx, onednn_isa="AVX2") is False
    assert P.native_bf16_cpu(amx, onednn_isa="avx512_core_vnni") is False
    assert P.native_bf16_cpu(amx, onednn_isa="AVX512_CORE_AMX") is True
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert P.native_bf16_cpu() is False  # this machine's flags, held below bf16 by the environment
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.resolve_precision("auto", None, ARCH, measure=never)[0] == "32-true"


def test_the_plan_follows_the_same_rule_and_times_bf16_only_where_the_flags_leave_it_open():
    """One rule for `auto`, the plan and the run's check (decide_precision): a CPU whose flags say bf16 is emulated
    gets fp32 without a bf16 step timed; where bf16 is native the chosen model is timed in both."""
    from fake_speeds import speeds_like_2_cores

    from vit.planning.fingerprint import Fingerprint
    from vit.planning.plan import make_plan
    from vit.planning.speed import Machine

    digits = Fingerprint("digits", 8000, 2000, [800] * 10, 28, 28, 28, 1.0, 0.49, 5.0)
    for native, bf16_factor, want in [(False, 3.0, "32-true"), (True, 3.0, "bf16-mixed"), (True, 0.7, "32-true")]:
        asked = []

        def speeds(archs, batch, precision="32-true", factor=bf16_factor, asked=asked):
            asked.append(precision)
            return [s * (factor if precision == "bf16-mixed" else 1.0) for s in speeds_like_2_cores(archs, batch)]

        plan = make_plan(digits, Machine("cpu", 2, native_bf16=native), budget_s=300, elapsed_s=3.0, speed_fn=speeds)
        assert plan.overrides["trainer.precision"] == want
        assert ("bf16-mixed" in asked) == native  # the flags answered: no bf16 step timed
        why = dict((r[0], r[2]) for r in plan.rows)["precision"]
        assert ("without native bf16" in why) != native and ("bf16 not timed" in why) != native


def test_a_precision_you_set_is_the_one_the_plan_times_and_sizes_its_epochs_by():
    """`--trainer.precision 32-true --budget B` on a CPU with native bf16: the run trains in fp32 (yours wins), so the
    plan times no bf16 step and sizes its epochs at fp32's speed, not at the bf16 it would have chosen."""
    from fake_speeds import speeds_like_2_cores

    from vit.planning.fingerprint import Fingerprint
    from vit.planning.plan import make_plan
    from vit.planning.speed import Machine

    digits = Fingerprint("digits", 8000, 2000, [800] * 10, 28, 28, 28, 1.0, 0.49, 5.0)
    asked = []

    def speeds(archs, batch, precision="32-true"):
        asked.append(precision)
        return [s * (2.0 if precision == "bf16-mixed" else 1.0) for s in speeds_like_2_cores(archs, batch)]

    machine = Machine("cpu", 2, native_bf16=True)
    chosen = make_plan(digits, machine, budget_s=300, elapsed_s=3.0, speed_fn=speeds)
    asked.clear()
    yours = make_plan(digits, machine, budget_s=300, elapsed_s=3.0, speed_fn=speeds, precision="32-true")
    assert chosen.overrides["trainer.precision"] == "bf16-mixed" and "bf16-mixed" not in asked
    assert yours.overrides["trainer.precision"] == "32-true" and yours.epoch_s > chosen.epoch_s
    assert "yours" in dict((r[0], r[2]) for r in yours.rows)["precision"]


def test_the_runs_check_of_a_bf16_it_was_given_follows_the_rule(monkeypatch):
    """bf16-mixed set by hand on a CPU: the flags answer where bf16 is emulated (no steps timed, the line says so);
    where it is native, a few steps at the probe's batch decide."""
    from types import SimpleNamespace

    from vit.run.estimate import RunEstimate

    timed = []
    monkeypatch.setattr(P, "probe", lambda arch: timed.append(arch) or (100.0, 10.0))
    trainer = SimpleNamespace(precision="bf16-mixed", estimated_stepping_batches=100, is_global_zero=False)
    module = SimpleNamespace(device=torch.device("cpu"), model=SimpleNamespace(cfg=ARCH))
    for native, slowdown in [(False, float("inf")), (True, 10.0)]:
        monkeypatch.setattr(P, "native_bf16_cpu", lambda native=native: native)
        estimate = RunEstimate()
        estimate.on_train_start(trainer, module)
        assert estimate.bf16_slowdown == slowdown and len(timed) == int(native)
        assert ("emulated on this CPU" in estimate._bf16_note()) != native


def test_auto_is_resolved_printed_and_saved_and_a_typed_bf16_warns(in_tmp, monkeypatch, capsys):
    monkeypatch.setattr(P, "native_bf16_cpu", lambda: False)  # the CPU most people have
    args = ["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--attention_maps.every_n_epochs", "0",
            "--trainer.max_epochs", "1"]  # fmt: skip
    cli = train.main([*args, "--trainer.precision", "auto"])
    assert cli.trainer.precision == "32-true"
    assert "precision: 32-true (a CPU without native bf16" in capsys.readouterr().out
    saved = yaml.safe_load(next(in_tmp.glob("logs/smoke/version_0/config.yaml")).read_text())
    assert saved["trainer"]["precision"] == "32-true"  # the resolved value: a rerun from it trains the same way
    cli = train.main([*args, "--trainer.precision", "bf16-mixed", "--trainer.max_steps", "1"])
    assert cli.trainer.precision == "bf16-mixed"  # honoured
    assert "warning: precision bf16-mixed on a CPU without native bf16" in capsys.readouterr().err


def test_old_configs_with_an_explicit_precision_keep_it(in_tmp):
    cli = train.main(["fit", "--config", SMOKE, "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1",
                      "--attention_maps.every_n_epochs", "0"])  # fmt: skip
    assert cli.trainer.precision == "32-true"  # smoke.yaml says nothing: Lightning's default, not auto
