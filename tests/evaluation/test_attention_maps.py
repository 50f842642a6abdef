import math

import numpy as np
import pytest
import torch
from PIL import Image

import vit.evaluation.attention_maps as am
from vit.commands.attention import main as attention_main
from vit.model.vision_transformer import VisionTransformer

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5)


def _random_attn(B, H, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, H, N, N, generator=g).softmax(-1)


def test_rollout_matches_numpy_reference():
    attns = [_random_attn(2, 3, 5, seed) for seed in range(4)]
    ref = []
    for b in range(2):
        r = np.eye(5)
        for a in attns:
            m = a[b].double().numpy().mean(axis=0) + np.eye(5)
            m = m / m.sum(axis=1)[:, None]
            r = m @ r
        ref.append(r)
    torch.testing.assert_close(am.attention_rollout(attns).double(), torch.tensor(np.stack(ref)), atol=1e-6, rtol=0)


def test_image_relevance_avg_pool_averages_all_queries_token_pool_reads_row_0():
    rollout = torch.arange(1.0, 17.0).reshape(1, 4, 4)
    avg = am.image_relevance(rollout, num_prefix_tokens=0, grid=(2, 2))
    torch.testing.assert_close(avg.flatten(), rollout.mean(1)[0] / rollout.mean(1)[0].sum())
    cls = am.image_relevance(torch.arange(1.0, 10.0).reshape(1, 3, 3), num_prefix_tokens=1, grid=(1, 2))
    torch.testing.assert_close(cls.flatten(), torch.tensor([2.0, 3.0]) / 5)


def test_mean_distance_identity_is_zero():
    eye = torch.eye(16).expand(2, 3, 16, 16)
    torch.testing.assert_close(am.mean_attention_distance(eye, (4, 4), patch_size=8), torch.zeros(3))


def test_mean_distance_uniform_equals_mean_pairwise_distance():
    grid, patch = (3, 4), 5
    uniform = torch.full((1, 2, 12, 12), 1 / 12)
    pos = [(r, c) for r in range(3) for c in range(4)]
    expect = np.mean([math.dist(a, b) * patch for a in pos for b in pos])
    torch.testing.assert_close(
        am.mean_attention_distance(uniform, grid, patch), torch.full((2,), expect, dtype=torch.float32)
    )


def test_entropy_bounds():
    assert am.attention_entropy(torch.eye(9).expand(1, 2, 9, 9)).item() == pytest.approx(0.0, abs=1e-6)
    assert am.attention_entropy(torch.full((1, 2, 9, 9), 1 / 9)).item() == pytest.approx(math.log(9))


def test_query_patch_and_received_shapes_and_values():
    a = _random_attn(2, 3, 1 + 6)  # class token + 2x3 grid
    q = am.query_patch_map(a, query=4, num_prefix_tokens=1, grid=(2, 3))
    assert q.shape == (2, 3, 2, 3)
    torch.testing.assert_close(q.flatten(2), a[:, :, 5, 1:])
    rec = am.attention_received(a, 1, (2, 3))
    torch.testing.assert_close(rec.flatten(2), a[:, :, :, 1:].mean(2))


@pytest.mark.parametrize("cfg", [{}, {"global_pool": "token"}], ids=["avg", "token"])
def test_captured_weights_are_the_manual_softmax(cfg):
    model = VisionTransformer(**TINY, **cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    attns, logits = am.capture_attention(model, x)
    assert len(attns) == 3
    # Reference: walk the blocks by hand and compute softmax(q k^T / sqrt(d)) from each block's own input.
    with torch.no_grad():
        h, grid = model.patch_embed(x)
        h = h + model.pos_embed_for(grid)
        if model.cls_token is not None:
            h = torch.cat([model.cls_token.expand(2, -1, -1), h], 1)
        for blk, got in zip(model.blocks, attns):
            q, k, _ = blk.attn.qkv_heads(blk.norm1(h))
            expect = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
            torch.testing.assert_close(got, expect, atol=1e-6, rtol=0)
            h = blk(h)
        torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=0)


def test_capture_restores_every_instance_and_changes_no_output():
    model = VisionTransformer(**TINY, drop_path_rate=0.2, attn_drop_rate=0.1).train()
    model.blocks[1].attn.fused_attn = False  # a mixed state must come back exactly
    before = [b.attn.fused_attn for b in model.blocks]
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(1)
    out1 = model(x)
    am.capture_attention(model, x)
    assert [b.attn.fused_attn for b in model.blocks] == before
    assert model.training and all(m.training for m in model.modules())
    assert all(not b.attn.attn_drop._forward_hooks for b in model.blocks)
    torch.manual_seed(1)
    torch.testing.assert_close(model(x), out1, atol=0, rtol=0)


def test_overlay_and_denormalize():
    img = am.denormalize(torch.zeros(1, 8, 8), [0.5], [0.5])
    assert img.shape == (3, 8, 8) and torch.allclose(img, torch.full_like(img, 0.5))
    heat = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    out = am.overlay(img, heat, alpha=1.0)
    assert out.shape == (3, 8, 8) and out.min() >= 0 and out.max() <= 1
    assert not torch.allclose(out[:, 0, 0], out[:, -1, -1])  # cold corner and hot corner differ


def test_panels_for_a_batch():
    model = VisionTransformer(**TINY).eval()
    panels = am.attention_panels(model, torch.randn(3, 3, 32, 32), [0.5] * 3, [0.5] * 3, display_size=40)
    assert panels["rollout"].shape == (3, 2 * 40 + 3 * 2, 3 * 40 + 4 * 2)
    assert len(panels["layers"]) == 3 and panels["layers"][0].shape == (3, 3 * 40 + 4 * 2, 2 * 40 + 3 * 2)
    assert panels["mean_distance"].shape == (3, 2) and panels["entropy"].shape == (3,)
    torch.testing.assert_close(panels["relevance"].sum((1, 2)), torch.ones(3))


def test_command_writes_overlays_for_image_files(tmp_path, capsys):
    model = VisionTransformer(**TINY)
    hp = dict(TINY, class_names=list("abcde"), mean=[0.5] * 3, std=[0.5] * 3)
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": hp,
            "calibration": {"temperature": 0.05},  # sharpens: the raw softmax of a fresh model would be ~0.2
        },
        tmp_path / "m.ckpt",
    )
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    code = attention_main(
        [
            "--ckpt",
            str(tmp_path / "m.ckpt"),
            "--out",
            str(tmp_path / "maps"),
            "--size",
            "64",
            str(tmp_path / "a.png"),
            str(tmp_path / "bad.png"),
        ]
    )
    assert code == 1  # one image failed, the other was drawn
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'bad.png'}: error: " in err  # vit-predict's words for a file it could not read
    from vit.data.transforms import eval_transform

    x = eval_transform(TINY["img_size"], [0.5] * 3, [0.5] * 3)(Image.open(tmp_path / "a.png").convert("RGB"))
    with torch.no_grad():
        served = (model.eval()(x[None]) / 0.05).softmax(-1).max()  # the calibrated probability, as vit-predict's
    printed = float(out.split("(")[-1].split(")")[0])
    assert printed == pytest.approx(float(served), abs=0.006)
    png = Image.open(tmp_path / "maps" / "a_attention.png")
    assert png.size == (64 + 4, 2 * 64 + 6)
    assert (tmp_path / "maps" / "a_heads_last_block.png").is_file()
    # relevance by default, as vit-predict draws it; the rollout on request, on the device asked for
    argv = ["--ckpt", str(tmp_path / "m.ckpt"), "--size", "64", "--device", "cpu", str(tmp_path / "a.png")]
    assert attention_main([*argv, "--out", str(tmp_path / "ro"), "--attention-map", "rollout"]) == 0
    rollout = np.asarray(Image.open(tmp_path / "ro" / "a_attention.png"))
    assert rollout.shape == np.asarray(png).shape and not np.array_equal(rollout, np.asarray(png))
    # two files with one stem: two maps, neither overwritten
    (tmp_path / "other").mkdir()
    Image.open(tmp_path / "a.png").transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(tmp_path / "other" / "a.png")
    argv = ["--ckpt", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "two"), "--size", "64"]
    assert attention_main([*argv, str(tmp_path / "a.png"), str(tmp_path / "other" / "a.png")]) == 0
    first, second = (np.asarray(Image.open(tmp_path / "two" / n)) for n in ("a_attention.png", "00001_a_attention.png"))
    assert not np.array_equal(first, second) and (tmp_path / "two" / "00001_a_heads_last_block.png").is_file()


def test_kept_distance_plot_redraws_exactly_what_a_new_figure_draws():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    plot, frames = am.MeanDistancePlot(4, 2, img_size=32), []
    for seed in range(3):
        d = torch.rand(4, 2, generator=torch.Generator().manual_seed(seed)) * 30
        fig = am.mean_distance_figure(d, 32)
        FigureCanvasAgg(fig).draw()
        fresh = torch.from_numpy(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()).permute(2, 0, 1)
        frames.append(plot.render(d))
        assert frames[-1].dtype == torch.uint8 and torch.equal(frames[-1], fresh)
    assert not torch.equal(frames[0], frames[1])  # the points moved


def test_with_a_distillation_token_the_relevance_is_the_mean_of_the_two_heads_rows():
    rollout = torch.arange(1.0, 26.0).reshape(1, 5, 5)  # avg pool and a distillation token: token 0, 4 patches
    rel = am.image_relevance(rollout, num_prefix_tokens=1, grid=(2, 2), dist_token=True)
    expected = (rollout[0, 1:, 1:].mean(0) + rollout[0, 0, 1:]) / 2
    torch.testing.assert_close(rel.flatten(), expected / expected.sum())
    # with a class token as well: tokens 0 (class) and 1 (distillation), then the patches
    cls = am.image_relevance(rollout, num_prefix_tokens=2, grid=(1, 3), dist_token=True)
    expected = (rollout[0, 0, 2:] + rollout[0, 1, 2:]) / 2
    torch.testing.assert_close(cls.flatten(), expected / expected.sum())
