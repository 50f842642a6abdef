"""Where does the model look? Pure functions over attention weights, no Lightning.

    attns, logits = capture_attention(model, images)         # L x (B, H, N, N)
    rollout = image_relevance(attention_rollout(attns), model.num_prefix_tokens, model.grid_size)  # (B, gh, gw)
    rel, logits, attns = relevance(model, images)            # class-specific (Chefer et al.), predicted class
    picture = overlay(denormalize(images, mean, std)[0], rel[0])                                  # (3, H, W)

The command that writes them for image files, `vit-attention`, is vit/commands/attention.py.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from torchvision.utils import make_grid

from vit.model.vision_transformer import Attention, VisionTransformer


@contextmanager
def attention_weights(model: VisionTransformer, detach: bool = True) -> Iterator[list[torch.Tensor]]:
    """Inside the block, every forward of `model` appends each block's attention weights (B, H, N, N), N including
    prefix tokens, to the yielded list: detached float copies, or with `detach=False` the tensors themselves, in the
    autograd graph. Fused SDPA never materialises the weights, so each Attention instance runs its manual path, and a
    hook on `attn_drop` reads its input (the softmax, before dropout). Every instance's `fused_attn` and the hooks are
    restored afterwards, whatever happens."""
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    fused = [m.fused_attn for m in attns]
    captured: list[torch.Tensor] = []

    def keep(module, inputs, output) -> None:
        captured.append(inputs[0].detach().float() if detach else inputs[0])

    hooks = [m.attn_drop.register_forward_hook(keep) for m in attns]
    try:
        for m in attns:
            m.fused_attn = False
        yield captured
    finally:
        for m, f in zip(attns, fused):
            m.fused_attn = f
        for h in hooks:
            h.remove()


@torch.no_grad()
def capture_attention(model: VisionTransformer, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Attention weights of every block for a batch, and the logits: L tensors of (B, H, N, N), N including prefix."""
    with attention_weights(model) as captured:
        logits = model(x)
    return captured, logits


def attention_rollout(attentions: list[torch.Tensor]) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): heads averaged, identity added for the residual path, rows
    renormalised, multiplied through the layers. L x (B, H, N, N) -> (B, N, N); row q is how much each input token
    flows into output token q."""
    rollout = None
    for a in attentions:
        a = a.float().mean(dim=1)  # (B, N, N)
        a = a + torch.eye(a.shape[-1], device=a.device)
        a = a / a.sum(dim=-1, keepdim=True)  # keepdim: divide each row by its own sum, not by column sums
        rollout = a if rollout is None else a @ rollout
    return rollout


def readout(rows: torch.Tensor, num_prefix_tokens: int, dist_token: bool = False) -> torch.Tensor:
    """What the logits read of a token-to-token matrix (B, T, T) (a rollout, a relevance, one block's attention), over
    the patches' columns: (B, N).

    With a class token the classifier reads token 0 only, so its row is the answer. Our default model has no class
    token: it classifies the *average* of all patch outputs, so every output patch feeds the decision equally, and the
    answer is the mean of the patch tokens' rows. Token 0 of such a model is a real patch and must not be dropped.
    With a distillation token (the last prefix token) the model answers the mean of its head and the class head: the
    mean of the two.
    """
    p = num_prefix_tokens
    r = rows[:, 0, p:] if p > int(dist_token) else rows[:, p:, p:].mean(dim=1)
    return (r + rows[:, p - 1, p:]) / 2 if dist_token else r


def image_relevance(
    rollout: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int], dist_token: bool = False
) -> torch.Tensor:
    """Image-level relevance per patch, (B, T, T) -> (B, gh, gw), summing to 1 over the patches: the `readout` of the
    rollout."""
    rel = readout(rollout, num_prefix_tokens, dist_token)
    rel = rel / rel.sum(dim=-1, keepdim=True)
    return rel.reshape(-1, *grid)


def relevance(
    model: VisionTransformer, x: torch.Tensor, target: torch.Tensor | int | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Class-specific relevance of every patch (Chefer, Gur and Wolf, "Generic Attention-model Explainability", 2021):
    R = I, then for every block in order R <- R + mean_heads((dy/dA * A)^+) R, with y the logit of the target class
    (default: the predicted one). The map is the class token's row of R, or for average pooling the mean of its rows
    (every patch output feeds the decision). One forward and one backward for the whole batch.

    Returns relevance (B, gh, gw) summing to 1, the logits (B, num_classes) and the attention weights L x (B, H, N, N).
    Works for every attention variant (the weights are taken where the manual path materialises them: after masks,
    RoPE, grouped or latent keys). Gradients are taken with respect to the weights only: no parameter's .grad changes.
    """
    training = model.training
    try:
        model.eval()
        # out of inference_mode too (predict runs in it): its tensors cannot enter autograd, so x is cloned
        with attention_weights(model, detach=False) as captured, torch.inference_mode(False), torch.enable_grad():
            logits = model(x.clone().requires_grad_(True))  # an input that needs grad: frozen weights work too
            if target is None:
                target = logits.argmax(-1)
            elif isinstance(target, int):
                target = torch.full((x.shape[0],), target, device=logits.device)
            score = logits.gather(1, target.to(logits.device).view(-1, 1)).sum()  # images are independent
            grads = torch.autograd.grad(score, captured)
    finally:
        model.train(training)
    B, N = x.shape[0], captured[0].shape[-1]
    R = torch.eye(N, device=x.device).expand(B, N, N).clone()
    for a, g in zip(captured, grads):  # forward order: the first block first
        cam = (g * a).clamp(min=0).float().mean(dim=1)  # (B, N, N), heads averaged
        R = R + cam @ R
    rel = readout(R, model.num_prefix_tokens, model.dist_token is not None)
    rel = rel / rel.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    grid = model.patch_embed.grid(x)
    return rel.reshape(B, *grid).detach(), logits.detach(), [a.detach().float() for a in captured]


def query_patch_map(attn: torch.Tensor, query: int, num_prefix_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
    """Where one query patch looks, per head: (B, H, N, N) -> (B, H, gh, gw). `query` indexes patches (row-major)."""
    p = num_prefix_tokens
    return attn[:, :, p + query, p:].reshape(*attn.shape[:2], *grid)


def attention_received(attn: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
    """How much attention each patch receives, averaged over the queries, per head: (B, H, N, N) -> (B, H, gh, gw)."""
    p = num_prefix_tokens
    return attn[:, :, :, p:].mean(dim=2).reshape(*attn.shape[:2], *grid)


def patch_distances(grid: tuple[int, int], patch_size: int) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches: (N, N)."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float() * patch_size  # (N, 2)
    return torch.cdist(pos, pos)


def mean_attention_distance(
    attn: torch.Tensor, grid: tuple[int, int], patch_size: int, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """Mean attention distance per head in pixels (the ViT paper's "attention distance"): sum_k A[q, k] * |q - k|,
    averaged over query patches and images. (B, H, N, N) -> (H,). Patch-to-patch weights only; with a class token
    each row is renormalised over the patches."""
    p = num_prefix_tokens
    a = attn[:, :, p:, p:].float()
    a = a / a.sum(dim=-1, keepdim=True)
    d = patch_distances(grid, patch_size).to(a.device)
    return (a * d).sum(dim=-1).mean(dim=(0, 2))


def attention_entropy(attn: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the attention rows of one layer, over images, heads and queries. log(N) is uniform."""
    a = attn.float()
    return -(a * torch.log(a.clamp_min(1e-12))).sum(dim=-1).mean()


def denormalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """Undo Normalize: (B, C, H, W) or (C, H, W) -> RGB in [0, 1] (grayscale repeated to 3 channels; bands other
    than 1 or 3, a multi-band image's, shown as their mean in grey)."""
    mean = torch.as_tensor(mean, dtype=x.dtype, device=x.device)[:, None, None]
    std = torch.as_tensor(std, dtype=x.dtype, device=x.device)[:, None, None]
    img = (x * std + mean).clamp(0, 1)
    if img.shape[-3] not in (1, 3):
        img = img.mean(-3, keepdim=True)
    if img.shape[-3] == 1:
        img = img.expand(*img.shape[:-3], 3, *img.shape[-2:])
    return img


def overlay(image: torch.Tensor, heat: torch.Tensor, cmap: str = "inferno", alpha: float = 0.5) -> torch.Tensor:
    """Blend a heat map over an image: image (3, H, W) in [0, 1], heat (h, w) any range -> (3, H, W) in [0, 1].

    The heat map is min-max scaled, upsampled to the image size (bilinear) and coloured with a matplotlib colormap.
    """
    return overlay_batch(image[None], heat[None], cmap, alpha)[0]


def overlay_batch(images: torch.Tensor, heats: torch.Tensor, cmap: str = "inferno", alpha: float = 0.5) -> torch.Tensor:
    """`overlay` for a batch in one go: images (B, 3, H, W), heats (B, h, w) -> (B, 3, H, W)."""
    heats = heats.float().cpu()
    lo, hi = heats.amin(dim=(1, 2), keepdim=True), heats.amax(dim=(1, 2), keepdim=True)
    heats = (heats - lo) / (hi - lo).clamp_min(1e-12)  # min-max per map
    heats = F.interpolate(heats[:, None], size=images.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    colors = matplotlib.colormaps[cmap](heats.numpy())[..., :3]  # (B, H, W, 3)
    colored = torch.from_numpy(colors).permute(0, 3, 1, 2).float()
    return ((1 - alpha) * images.float().cpu() + alpha * colored).clamp(0, 1)


def display_side(img_size: int) -> int:
    """The side in pixels a map's tile is drawn at: twice the model's input side, 64-256 px (a 32-px image at 64; the
    hybrid's 96-px images, a 6 x 6 grid of 16-px patches, at 192, so that each patch is a readable 32-px square)."""
    return min(256, max(64, 2 * img_size))


def resize_tiles(images: torch.Tensor, size: int) -> torch.Tensor:
    """Images (B, C, H, W) at `size` x `size` (nearest: each patch stays a sharp block)."""
    return images if images.shape[-1] == size else F.interpolate(images, size=(size, size), mode="nearest")


def attention_panels(
    model: VisionTransformer,
    x: torch.Tensor,
    mean,
    std,
    display_size: int = 96,
    query: int | None = None,
    cmap: str = "inferno",
) -> dict:
    """Everything the callback and the CLI draw, for a batch of normalised images x (B, C, H, W).

    Returns a dict: 'rollout' (3, ., .) grid of the images over their rollout overlays; 'layers' a list of grids,
    one per block, a row per image and a tile per head (attention each patch receives); 'query_patch' a grid, a row per
    image and a tile per head, of where the query patch (default: the centre) looks in the last block; 'overlays'
    (B, 3, S, S) the rollout overlays alone; 'mean_distance' (L, H) pixels; 'entropy' (L,) nats; 'attentions'.
    """
    attns, logits = capture_attention(model, x)
    grid, p = model.patch_embed.grid(x), model.num_prefix_tokens
    images = resize_tiles(denormalize(x.float(), mean, std).cpu(), display_size)
    rel = image_relevance(attention_rollout(attns), p, grid, model.dist_token is not None)
    overlays = overlay_batch(images, rel, cmap)
    heads = attns[0].shape[1]
    per_head_images = images.repeat_interleave(heads, dim=0)  # (B * H, 3, S, S): a row per image, a tile per head
    layers = []
    for a in attns:
        tiles = overlay_batch(per_head_images, attention_received(a, p, grid).flatten(0, 1), cmap)
        layers.append(make_grid(tiles, nrow=heads, padding=2, pad_value=1.0))
    query = (grid[0] // 2) * grid[1] + grid[1] // 2 if query is None else query
    qtiles = overlay_batch(per_head_images, query_patch_map(attns[-1], query, p, grid).flatten(0, 1), cmap)
    return {
        "rollout": make_grid(torch.cat([images, overlays]), nrow=len(images), padding=2, pad_value=1.0),
        "layers": layers,
        "query_patch": make_grid(qtiles, nrow=heads, padding=2, pad_value=1.0),
        "overlays": overlays,
        "relevance": rel,
        "mean_distance": torch.stack(
            [mean_attention_distance(a, grid, model.patch_embed.patch_size, p) for a in attns]
        ).cpu(),
        "entropy": torch.stack([attention_entropy(a) for a in attns]).cpu(),
        "attentions": attns,
        "logits": logits,
    }


def overlay_grid(x: torch.Tensor, heat: torch.Tensor, mean, std, display_size: int = 96, cmap: str = "inferno"):
    """Normalised images x (B, C, H, W) and maps (B, gh, gw) -> a (3, ., .) grid: the images above their overlays."""
    images = resize_tiles(denormalize(x.float(), mean, std).cpu(), display_size)
    return make_grid(torch.cat([images, overlay_batch(images, heat, cmap)]), nrow=len(images), padding=2, pad_value=1.0)


def mean_distance_figure(distances: torch.Tensor, img_size: int | None = None):
    """The ViT paper's plot: mean attention distance (pixels) of every head against block depth. (L, H) -> Figure."""
    from matplotlib.figure import Figure

    L_, H = distances.shape
    fig = Figure(figsize=(4.5, 3.2), dpi=100)  # not pyplot: no global state, and 6x faster to build each epoch
    ax = fig.subplots()
    for h in range(H):
        ax.scatter(torch.arange(L_) + 1, distances[:, h], s=18, label=f"head {h}")
    ax.set_xlabel("block")
    ax.set_ylabel("mean attention distance (px)")
    ax.set_ylim(0, img_size or float(distances.max()) * 1.1 + 1e-6)
    ax.set_xticks(range(1, L_ + 1))
    if H <= 8:  # outside the axes: never over a point, so it can stay in MeanDistancePlot's kept background
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


class MeanDistancePlot:
    """`mean_distance_figure` drawn once, then only its points redrawn each epoch, as a (3, H, W) uint8 image.

    The axes, ticks, labels and legend are rendered once and kept as a bitmap (matplotlib's blitting); each epoch
    restores it and draws the moved points on top: 2 ms a frame on a 2-core CPU, against 21 ms for a full draw of
    a kept figure and 70 ms for a new Figure (then a third of the callback's time per epoch).
    """

    def __init__(self, num_layers: int, num_heads: int, img_size: int):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        self.fig = mean_distance_figure(torch.zeros(num_layers, num_heads), img_size)
        self.canvas = FigureCanvasAgg(self.fig)
        self.ax = self.fig.axes[0]
        self.points = list(self.ax.collections)  # one scatter per head, in head order
        for points in self.points:
            points.set_animated(True)  # left out of the kept background
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)

    def render(self, distances: torch.Tensor) -> torch.Tensor:
        """(L, H) distances in pixels -> the figure as a (3, H, W) uint8 RGB tensor."""
        self.canvas.restore_region(self.background)
        depth = np.arange(1, distances.shape[0] + 1)
        for h, points in enumerate(self.points):
            points.set_offsets(np.column_stack([depth, distances[:, h].numpy()]))
            self.ax.draw_artist(points)
        rgba = np.asarray(self.canvas.buffer_rgba())  # (H, W, 4)
        return torch.from_numpy(rgba[..., :3].copy()).permute(2, 0, 1)
