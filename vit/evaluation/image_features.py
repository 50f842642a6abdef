"""What the "unknown" scores read of an image, in one forward pass: the pooled features after every block and the
head's (pooled_features), five statistics of the pixels (input_statistics), and both over a set of batches
(features_of). vit/evaluation/unknown.py turns them into scores.
"""

import torch


def pooled_features(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C, H, W) -> pooled features (B, L + 1, D): the mean of the patch tokens after each of the L blocks (before
    the final norm), then what the head reads; and the logits (B, num_classes); one forward (an exported model,
    vit.deployment.onnx_model, gives both from its two outputs; one exported before the blocks' features: (B, D))."""
    if hasattr(model, "features_and_logits"):
        return model.features_and_logits(x)
    taps = []
    tokens = model.forward_features(x, taps=taps)
    final = model.forward_head(tokens, pre_logits=True)  # (B, D): what the class head reads
    p = model.num_prefix_tokens
    feats = torch.stack([t[:, p:].mean(1) for t in taps] + [final], dim=1)
    # the served logits: the class head's, or with a distillation token the mean of both heads
    return feats, model.head(final) if model.dist_token is None else model.forward_head(tokens)


def as_layers(feats: torch.Tensor) -> torch.Tensor:
    """Pooled features as (N, L + 1, D), the head's last; (N, D) from an export made before the blocks' features."""
    return feats[:, None] if feats.dim() == 2 else feats


def input_statistics(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) normalised images, as the model reads them -> (B, 5) statistics of the pixels themselves, of the
    channels' average: its mean, and the logarithms of its spread, of its mean absolute horizontal and vertical
    differences and of its mean absolute Laplacian (how much fine detail there is for its contrast). A blurred, a
    low-resolution upsampled, a constant or a noised image moves them far from any training image's while its pooled
    features can stay near a class (docs/evaluation.md: blurred images scored AUROC 0.60 by the features alone)."""
    g = x.float().mean(1)  # (B, H, W)
    dx, dy = (g[:, :, 1:] - g[:, :, :-1]).abs(), (g[:, 1:] - g[:, :-1]).abs()
    lap = (4 * g[:, 1:-1, 1:-1] - g[:, :-2, 1:-1] - g[:, 2:, 1:-1] - g[:, 1:-1, :-2] - g[:, 1:-1, 2:]).abs()
    eps = 1e-4  # a constant image: log(eps), far below any photograph's, instead of -inf
    return torch.stack(
        [
            g.mean((1, 2)),
            (g.std((1, 2)) + eps).log(),
            (dx.mean((1, 2)) + eps).log(),
            (dy.mean((1, 2)) + eps).log(),
            (lap.mean((1, 2)) + eps).log(),
        ],
        -1,
    )


@torch.no_grad()
def features_of(model, batches, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pooled features (N, L + 1, D), logits, targets and input_statistics (N, 5) of (images, targets) batches, on the
    CPU in float32."""
    model = model.to(device).eval()
    feats, logits, targets, inputs = [], [], [], []
    for x, y in batches:
        x = x.to(device)
        f, z = pooled_features(model, x)
        feats.append(f.float().cpu())
        logits.append(z.float().cpu())
        targets.append(y.cpu())
        inputs.append(input_statistics(x).cpu())
    return torch.cat(feats), torch.cat(logits), torch.cat(targets), torch.cat(inputs)
