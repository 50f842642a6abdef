"""The attention-map callback, checked in real TensorBoard event files and through a real TensorBoard server."""

import io
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit.data.digits import DigitsDataModule
from vit.evaluation.map_callback import AttentionMapCallback
from vit.model.config import ViTConfig
from vit.training.module import ViTClassifier

SMOKE = str(Path(__file__).parents[2] / "configs" / "smoke.yaml")
DEPTH, HEADS, SIZE, IMAGES = 2, 2, 64, 8  # the smoke config's model and the callback's defaults
IMAGE_TAGS = ["attention/rollout", "attention/query_patch", "attention/mean_distance", "attention/relevance"] + [
    f"attention/layer_{i}" for i in range(DEPTH)
]


@pytest.fixture(scope="module")
def smoke_logs(smoke_run):
    """The shared smoke fit (2 epochs) with the callback on, as every config has it."""
    return smoke_run.root / "logs" / "smoke" / "version_0"


def test_event_files_hold_attention_images_and_scalars_for_each_epoch(smoke_logs):
    ea = EventAccumulator(str(smoke_logs), size_guidance={"images": 0, "scalars": 0})
    ea.Reload()
    assert set(IMAGE_TAGS) <= set(ea.Tags()["images"])
    assert len(ea.Scalars("val/acc")) == 2
    train_acc = ea.Scalars("train/acc")  # logged once per epoch from the metric's state
    assert len(train_acc) == 2 and all(0 <= e.value <= 1 for e in train_acc)
    steps = {4, 8}  # the global step at the end of each of the two epochs of 4 batches; the sanity check logs nothing
    for tag in IMAGE_TAGS:
        events = ea.Images(tag)
        assert {e.step for e in events} == steps, tag
        for e in events:
            img = Image.open(io.BytesIO(e.encoded_image_string))
            img.load()
            assert (img.width, img.height) == (e.width, e.height) and img.width > 50 and img.height > 50
    rollout = ea.Images("attention/rollout")[0]
    assert (rollout.width, rollout.height) == (IMAGES * SIZE + (IMAGES + 1) * 2, 2 * SIZE + 3 * 2)
    layer = ea.Images("attention/layer_0")[0]
    assert (layer.width, layer.height) == (HEADS * SIZE + (HEADS + 1) * 2, IMAGES * SIZE + (IMAGES + 1) * 2)
    for i in range(DEPTH):
        values = [e.value for e in ea.Scalars(f"attention/entropy/layer_{i}")]
        assert len(values) == 2 and all(0 <= v <= 2.78 for v in values)  # between one-hot and log(16) uniform
    relevance = ea.Images("attention/relevance")[0]  # images, predicted-class map, true-class map where wrong
    assert (relevance.width, relevance.height) == (IMAGES * SIZE + (IMAGES + 1) * 2, 3 * SIZE + 4 * 2)
    for name in ("relevance", "rollout"):
        values = [e.value for e in ea.Scalars(f"attention/faithfulness/{name}_deletion")]
        assert len(values) == 2 and all(0 <= v <= 1 for v in values)  # an area under a probability curve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_tensorboard_server_serves_the_attention_images(smoke_logs):
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(smoke_logs.parent),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/data/plugin/images"
    try:
        tags, deadline = {}, time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/tags", timeout=5) as r:
                    tags = json.load(r)
                if any(t.get("attention/rollout") for t in tags.values()):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        run = next(run for run, t in tags.items() if "attention/rollout" in t)
        assert set(IMAGE_TAGS) <= set(tags[run])
        q = urllib.parse.urlencode({"run": run, "tag": "attention/rollout", "sample": 0})
        with urllib.request.urlopen(f"{base}/images?{q}", timeout=10) as r:
            entries = json.load(r)
        assert len(entries) == 2
        with urllib.request.urlopen(f"{base}/individualImage?{entries[-1]['query']}", timeout=10) as r:
            body = r.read()
        assert body[:8] == b"\x89PNG\r\n\x1a\n"
        assert Image.open(io.BytesIO(body)).size == (IMAGES * SIZE + (IMAGES + 1) * 2, 2 * SIZE + 3 * 2)
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_without_tensorboard_it_does_nothing_and_says_so_once(in_tmp, caplog):
    cb = AttentionMapCallback(num_images=2)
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[cb],
    )
    with caplog.at_level("WARNING", logger="vit.evaluation.map_callback"):
        trainer.fit(
            ViTClassifier(arch=ViTConfig(embed_dim=16, depth=1, num_heads=2, patch_size=8)),
            datamodule=DigitsDataModule(batch_size=16),
        )
    assert sum("no TensorBoardLogger" in r.message for r in caplog.records) == 1
    assert cb._images is None  # never even picked images


def test_it_touches_no_training_step_hook():
    hooks = [
        h
        for h in (
            "on_train_batch_start",
            "on_train_batch_end",
            "on_before_backward",
            "on_after_backward",
            "on_before_optimizer_step",
        )
        if getattr(AttentionMapCallback, h) is not getattr(L.Callback, h)
    ]
    assert hooks == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="every_n_epochs=-1 must be >= 0"):
        AttentionMapCallback(every_n_epochs=-1)
    assert AttentionMapCallback(every_n_epochs=0).every_n_epochs == 0  # 0: off


def test_add_png_writes_the_exact_pixels_as_a_tensorboard_image(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from vit.evaluation.map_callback import add_png

    image = torch.randint(0, 256, (3, 20, 30), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    with SummaryWriter(str(tmp_path)) as writer:
        add_png(writer, "x/y", image, 7)
    ea = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    ea.Reload()
    (event,) = ea.Images("x/y")
    assert (event.step, event.width, event.height) == (7, 30, 20)
    decoded = torch.from_numpy(np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB")))
    assert torch.equal(decoded.permute(2, 0, 1), image)


def test_maps_of_a_model_compiled_in_place_run_eagerly():
    """compile: true compiles the model in place; the maps (hooks, the manual attention path, gradients of captured
    tensors) run outside the compiled graph: nothing is compiled for them, and the model stays compiled after."""
    import torch._dynamo

    from vit.evaluation.attention_maps import attention_panels, relevance
    from vit.evaluation.map_callback import eager
    from vit.model.config import ViTConfig
    from vit.model.vision_transformer import VisionTransformer

    model = VisionTransformer(ViTConfig(embed_dim=16, depth=2, num_heads=2, patch_size=8)).eval()
    model.compile()
    compiled, frames = model._compiled_call_impl, torch._dynamo.utils.counters["frames"]["total"]
    x = torch.randn(2, 3, 32, 32)
    with eager(model):
        attention_panels(model, x, [0.5] * 3, [0.5] * 3, 32)
        relevance(model, x)
    assert torch._dynamo.utils.counters["frames"]["total"] == frames  # no frame was handed to the compiler
    assert model._compiled_call_impl is compiled


def test_tiles_grow_with_the_training_size_so_a_large_image_stays_readable():
    cb = AttentionMapCallback()
    assert [cb.tile_size(s) for s in (8, 32, 64, 128, 300)] == [64, 64, 128, 256, 256]
    assert AttentionMapCallback(display_size=40).tile_size(128) == 40  # given: kept
    with pytest.raises(ValueError, match="display_size=4 must be >= 8"):
        AttentionMapCallback(display_size=4)
