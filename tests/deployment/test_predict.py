"""The predict CLI on a real training checkpoint: formats, image modes, every kind of bad input, unsafe checkpoints."""

import csv
import io
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.commands.predict import main
from vit.data.digits import DigitsDataModule
from vit.data.images import expand_inputs
from vit.model.checkpoint import load_model

SMOKE = str(Path(__file__).parents[2] / "configs" / "smoke.yaml")


@pytest.fixture(scope="module")
def ckpt(smoke_ckpt) -> Path:
    return smoke_ckpt


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@pytest.fixture
def images(tmp_path) -> Path:
    """A folder of good images in many modes and sizes, and one of each kind of bad file."""
    rng = np.random.default_rng(0)
    good = tmp_path / "imgs" / "good"
    (good / "nested").mkdir(parents=True)
    rgb = Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8))
    rgb.save(good / "rgb.jpg")
    rgb.convert("L").save(good / "gray.png")
    rgb.convert("RGBA").save(good / "rgba.png")
    rgb.convert("P").save(good / "palette.png")
    rgb.convert("CMYK").save(good / "cmyk.jpg")
    Image.fromarray((rng.integers(0, 65535, (20, 25))).astype(np.uint16)).save(good / "nested" / "deep16.png")
    bad = tmp_path / "imgs" / "bad"
    bad.mkdir()
    (bad / "text.png").write_text("this is not an image")
    (bad / "zero.jpg").write_bytes(b"")
    full = io.BytesIO()
    rgb.save(full, format="PNG")
    (bad / "truncated.png").write_bytes(full.getvalue()[: len(full.getvalue()) // 2])
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)  # declares 10^10 pixels
    (bad / "bomb.png").write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + _png_chunk(b"IEND", b"")
    )
    (bad / "dangling.png").symlink_to(tmp_path / "gone.png")
    return tmp_path / "imgs"


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_for_a_folder_with_good_and_bad_images(ckpt, images, capsys):
    code, out, err = _run(capsys, "--ckpt", ckpt, "--format", "json", "--topk", "3", images)
    records = {Path(r["path"]).name: r for r in json.loads(out)}  # stdout is exactly one JSON document
    assert code == 1  # some failed
    good = ["rgb.jpg", "gray.png", "rgba.png", "palette.png", "cmyk.jpg", "deep16.png"]
    for name in good:
        r = records[name]
        assert r["error"] is None and len(r["predictions"]) == 3, name
        assert r["predictions"][0]["label"] in [str(i) for i in range(10)]
        probs = [p["prob"] for p in r["predictions"]]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-5
    reasons = {
        "text.png": "not an image",
        "zero.jpg": "not an image",
        "truncated.png": "truncated",
        "bomb.png": "decompression bomb",
        "dangling.png": "no such file",
    }
    for name, reason in reasons.items():
        assert reason in records[name]["error"] and records[name]["predictions"] == [], name
        assert f"{name}: error: " in err and str(images) in err
    assert len(records) == len(good) + len(reasons)


def test_classify_pil_images_in_memory_as_vit_predict_does_their_files(ckpt, images, capsys):
    """The README's Python example: load_model, then classify PIL images: the same records as the command's."""
    from vit.deployment.predict import classify

    names = ["rgb.jpg", "gray.png", "rgba.png", "palette.png", "cmyk.jpg"]
    files = [images / "good" / n for n in names]
    code, out, _ = _run(capsys, "--ckpt", ckpt, "--format", "json", "--topk", "3", *files)
    assert code == 0
    expected = [{"predictions": r["predictions"], "unknown": r["unknown"]} for r in json.loads(out)]
    model, hparams = load_model(ckpt)
    got = classify(model, [Image.open(f) for f in files], hparams, topk=3)
    assert [[p["label"] for p in r["predictions"]] for r in got] == [
        [p["label"] for p in r["predictions"]] for r in expected
    ]
    for g, e in zip(got, expected):
        assert g["unknown"] == e["unknown"] and isinstance(g["unknown"], bool)
        np.testing.assert_allclose([p["prob"] for p in g["predictions"]], [p["prob"] for p in e["predictions"]],
                                   atol=1e-5)  # fmt: skip


def test_table_and_csv(ckpt, images, tmp_path, capsys):
    code, out, _ = _run(capsys, "--ckpt", ckpt, "--topk", "2", images / "good")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["path", "predictions"] and len(lines) == 7
    assert len({line.index(line.split()[1]) for line in lines[1:]}) == 1  # aligned column
    target = tmp_path / "out.csv"
    code, out, _ = _run(capsys, "--ckpt", ckpt, "--format", "csv", "--topk", "2", "--output", target, images)
    assert out == "" and code == 1
    rows = list(csv.DictReader(target.open()))
    assert list(rows[0]) == ["path", "label1", "prob1", "label2", "prob2", "unknown", "error"]
    assert {r["unknown"] for r in rows if r["label1"]} <= {"true", "false"} and not any(
        r["unknown"] for r in rows if r["error"]
    )
    assert sum(1 for r in rows if r["error"]) == 5 and sum(1 for r in rows if r["label1"]) == 6


def test_preprocessing_comes_from_the_checkpoint(ckpt, tmp_path, capsys):
    """A validation digit saved as a PNG is classified exactly as training's validation tensor is."""
    dm = DigitsDataModule()
    model, hparams = load_model(ckpt)
    files = []
    for i in range(4):
        Image.fromarray(dm.val_set.images[i].permute(1, 2, 0).numpy()).save(tmp_path / f"{i}.png")
        files.append(tmp_path / f"{i}.png")
    code, out, _ = _run(capsys, "--ckpt", ckpt, "--format", "json", "--topk", "10", *files)
    with torch.no_grad():  # the served probabilities: calibrated by the temperature fitted after training
        expect = (model(torch.stack([dm.val_set[i][0] for i in range(4)])) / hparams.temperature).softmax(-1)
    for i, rec in enumerate(json.loads(out)):
        got = {p["label"]: p["prob"] for p in rec["predictions"]}
        np.testing.assert_allclose([got[str(c)] for c in range(10)], expect[i].numpy(), atol=1e-5)


def test_globs_and_folders_expand_recursively(images):
    found = expand_inputs([str(images / "good"), str(images / "**" / "*.jpg")])
    names = [Path(p).name for p in found]
    assert "deep16.png" in names and "zero.jpg" in names and len(names) == len(set(names))


def test_attention_out_writes_an_overlay_per_image(ckpt, images, tmp_path, capsys):
    code, _, _ = _run(capsys, "--ckpt", ckpt, "--attention-out", tmp_path / "att", images / "good")
    pngs = sorted((tmp_path / "att").glob("*.png"))
    assert code == 0 and len(pngs) == 6
    assert Image.open(pngs[0]).size == (2 * 32, 32)
    # relevance by default; --attention-map rollout for the rollout: other maps, the same images beside them
    code, _, _ = _run(
        capsys, "--ckpt", ckpt, "--attention-out", tmp_path / "roll", "--attention-map", "rollout", images / "good"
    )
    rolls = sorted((tmp_path / "roll").glob("*.png"))
    assert code == 0 and [p.name for p in rolls] == [p.name for p in pngs]
    a = [np.asarray(Image.open(p)) for p in pngs]
    b = [np.asarray(Image.open(p)) for p in rolls]
    assert all((x[:, :32] == y[:, :32]).all() for x, y in zip(a, b))  # the image half
    assert any((x[:, 32:] != y[:, 32:]).any() for x, y in zip(a, b))  # the map half


FIELDS = {  # a checkpoint whose preprocessing fields disagree with its architecture, and what the line says
    "class_names": (["a", "b"], "class_names has 2 entries, num_classes=10"),
    "mean": ([0.5], "does not have in_chans=3 values"),
    "std": ([0.5, 0.0, 0.5], "must be numbers > 0"),
}


@pytest.mark.parametrize("field", FIELDS)
def test_a_checkpoint_whose_fields_disagree_is_one_line_and_exit_2(field, ckpt, images, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    data = torch.load(ckpt, weights_only=True)
    value, expected = FIELDS[field]
    data["hyper_parameters"][field] = value
    torch.save(data, bad)
    code, out, err = _run(capsys, "--ckpt", bad, images / "good")
    assert code == 2 and out == "" and expected in err and err.count("\n") == 1, err


def test_a_checkpoint_asking_for_a_huge_image_size_is_refused(ckpt, tmp_path):
    from vit.model.checkpoint import CheckpointError, load_model

    bad = tmp_path / "bad.ckpt"
    data = torch.load(ckpt, weights_only=True)
    data["hyper_parameters"]["arch"].update(img_size=1 << 20, patch_size=1 << 16)
    torch.save(data, bad)
    with pytest.raises(CheckpointError, match="img_size=1048576 is outside 1-4096"):
        load_model(bad)


@pytest.mark.parametrize("case", ["missing", "truncated", "text", "not_a_checkpoint", "other_architecture"])
def test_a_bad_checkpoint_is_one_line_and_exit_2(case, ckpt, images, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    if case == "truncated":
        bad.write_bytes(ckpt.read_bytes()[:5000])
    elif case == "text":
        bad.write_text("hello")
    elif case == "not_a_checkpoint":
        torch.save({"weights": torch.zeros(3)}, bad)
    elif case == "other_architecture":
        data = torch.load(ckpt, weights_only=True)
        data["hyper_parameters"]["arch"]["embed_dim"] = 48
        torch.save(data, bad)
    code, out, err = _run(capsys, "--ckpt", bad, images / "good")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and str(bad) in err


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return (Path.touch, (Path(self.marker),))


def test_a_checkpoint_with_a_pickle_payload_is_refused_and_never_runs(ckpt, images, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.ckpt"
    data = torch.load(ckpt, weights_only=True)
    data["hyper_parameters"]["payload"] = _Payload(marker)
    torch.save(data, evil)
    assert not marker.exists()
    code, out, err = _run(capsys, "--ckpt", evil, images / "good")
    assert code == 2 and "refused to load" in err and err.count("\n") == 1
    assert not marker.exists()


def test_no_input_matched_is_exit_2(ckpt, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "--ckpt", ckpt, tmp_path / "empty", str(tmp_path / "*.nothing"))
    assert code == 2 and "no image matched" in err


def test_console_script_prints_only_results_on_stdout(ckpt, images):
    exe = Path(sys.executable).parent / "vit-predict"
    cmd = [str(exe)] if exe.exists() else [sys.executable, str(Path(__file__).parents[2] / "predict.py")]
    proc = subprocess.run(
        [*cmd, "--ckpt", str(ckpt), "--format", "json", str(images)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert len(json.loads(proc.stdout)) == 11
    assert "bomb.png: error:" in proc.stderr


def test_a_one_channel_model_reads_files_as_grayscale(tmp_path, capsys):
    """A model trained on 1 channel (torch/mnist) gets any file as 8-bit L, as its training data was: a colour file
    is converted by PIL's luma, not cut to its red channel."""
    from vit.model.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    hp = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=1, num_heads=2, num_classes=3,
              class_names=["a", "b", "c"], mean=[0.3], std=[0.3])  # fmt: skip
    torch.save(
        {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "hyper_parameters": hp},
        tmp_path / "gray.ckpt",
    )
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28, 3), dtype=np.uint8))
    rgb.save(tmp_path / "colour.png")
    rgb.convert("L").save(tmp_path / "luma.png")
    code, out, _ = _run(capsys, "--ckpt", tmp_path / "gray.ckpt", "--format", "json", "--topk", "3",
                        tmp_path / "colour.png", tmp_path / "luma.png")  # fmt: skip
    colour, luma = json.loads(out)
    assert code == 0 and colour["predictions"] == luma["predictions"]


def _with_temperature(ckpt: Path, out: Path, temperature: float | None) -> Path:
    data = torch.load(ckpt, weights_only=True)
    data.pop("calibration", None)
    if temperature is not None:
        data["calibration"] = {"temperature": temperature}
    torch.save(data, out)
    return out


def test_probabilities_are_calibrated_by_the_checkpoints_temperature_unless_raw(ckpt, images, tmp_path, capsys):
    """softmax(logits / T) with the checkpoint's T = 2; `--raw-probs`: softmax(logits). log(raw probabilities) are the
    logits up to a constant, so the calibrated ones follow from the raw ones; the top-1 is the same."""
    hot = _with_temperature(ckpt, tmp_path / "t2.ckpt", 2.0)
    files = [str(p) for p in sorted((images / "good").glob("*.png"))]
    answers = {}
    for flags in ([], ["--raw-probs"]):
        code, out, _ = _run(capsys, "--ckpt", hot, "--format", "json", "--topk", "10", *flags, *files)
        assert code == 0
        answers[bool(flags)] = json.loads(out)
    for calibrated, raw in zip(answers[False], answers[True]):
        raw_p = torch.tensor([p["prob"] for p in sorted(raw["predictions"], key=lambda p: p["label"])])
        expected = (raw_p.log() / 2.0).softmax(-1)
        got = torch.tensor([p["prob"] for p in sorted(calibrated["predictions"], key=lambda p: p["label"])])
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
        assert calibrated["predictions"][0]["label"] == raw["predictions"][0]["label"]
        assert calibrated["predictions"][0]["prob"] < raw["predictions"][0]["prob"]  # T > 1 softens


def test_an_older_checkpoint_without_a_temperature_serves_the_raw_softmax(ckpt, images, tmp_path, capsys):
    old = _with_temperature(ckpt, tmp_path / "old.ckpt", None)
    assert load_model(old)[1].temperature == 1.0
    files = [str(p) for p in sorted((images / "good").glob("*.png"))]
    _, calibrated, _ = _run(capsys, "--ckpt", old, "--format", "json", *files)
    _, raw, _ = _run(capsys, "--ckpt", old, "--format", "json", "--raw-probs", *files)
    assert calibrated == raw


def test_a_fit_stores_a_temperature_in_its_checkpoints_and_logs_the_evaluation(smoke_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = smoke_run.root / "checkpoints" / "smoke" / "version_0"
    for path in [folder / "last.ckpt", *folder.glob("best-epoch*.ckpt")]:
        report = torch.load(path, weights_only=True)["calibration"]
        assert report["temperature"] > 0 and report["ece"] <= report["ece_uncalibrated"] + 1e-6
        assert report["nll"] <= report["nll_uncalibrated"] + 1e-6  # fitted on these very logits
        assert load_model(path)[1].temperature == report["temperature"]
    ea = EventAccumulator(
        str(smoke_run.root / "logs" / "smoke" / "version_0"), size_guidance={"images": 0, "scalars": 0}
    )
    ea.Reload()
    assert "eval/confusion_matrix" in ea.Tags()["images"]
    for tag in ("eval/ece", "eval/ece_uncalibrated", "eval/temperature", "eval/acc_per_class/0"):
        assert len(ea.Scalars(tag)) == 1, tag


def test_a_run_folder_or_name_stands_for_its_newest_best_checkpoint(smoke_run, tmp_path, monkeypatch, capsys):
    """`--ckpt checkpoints/smoke` (a run's folder) or `--ckpt smoke` (its name, under ./checkpoints): the newest
    version's best-*.ckpt, named on stderr; a version without a best checkpoint gives its last.ckpt."""
    from vit.model.checkpoint import deployable_checkpoint

    runs = smoke_run.root / "checkpoints" / "smoke"
    (best,) = (runs / "version_0").glob("best-*.ckpt")
    assert deployable_checkpoint(runs) == best == deployable_checkpoint(runs / "version_0")
    monkeypatch.chdir(smoke_run.root)
    assert deployable_checkpoint("smoke") == Path("checkpoints", "smoke", "version_0", best.name)
    image = Path(__file__).resolve().parents[2] / "docs" / "digit_6.png"
    assert main(["--ckpt", "smoke", "--format", "json", str(image)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)[0]["predictions"] and f"checkpoint: checkpoints/smoke/version_0/{best.name}" in out.err
    newer = tmp_path / "run" / "version_3"  # a newer version whose best was not written: its last
    newer.mkdir(parents=True)
    (newer / "last.ckpt").write_bytes(best.read_bytes())
    (tmp_path / "run" / "version_2").mkdir()
    assert deployable_checkpoint(tmp_path / "run") == newer / "last.ckpt"
    assert deployable_checkpoint(tmp_path / "none.ckpt") == tmp_path / "none.ckpt"  # the loader says what is wrong
