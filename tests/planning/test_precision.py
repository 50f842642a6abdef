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
