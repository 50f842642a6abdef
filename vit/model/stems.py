"""The patch embedding's stems besides the plain strided convolution: Xiao et al.'s convolutional stem, the ViT
paper's residual (hybrid) stem, and Shifted Patch Tokenization's input. `PatchEmbed` (vision_transformer.py) picks
one from `ViTConfig.stem`; each maps (B, C, H, W) to a grid of H/p x W/p positions."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from vit.model.config import HYBRID_STEMS  # noqa: F401  the hybrid's CNNs, imported from here by the model


def conv_stem(in_chans: int, embed_dim: int, patch_size: int) -> nn.Sequential:
    """Xiao et al. (2021)'s convolutional stem: n = log2(patch_size) 3x3 stride-2 convolutions, each followed by
    BatchNorm and ReLU, widths embed_dim / 2^(n-1), ..., embed_dim / 2, embed_dim (at least 16, so that a long stem
    in front of a narrow model keeps some channels at full resolution): (B, C, H, W) -> (B, D', H/p, W/p). Their ViT-S
    stem (48, 96, 192, 384 for patch 16) is this rule at embed_dim 384."""
    widths = stem_widths(embed_dim, patch_size)
    layers: list[nn.Module] = []
    for c_in, c_out in zip([in_chans, *widths], widths):
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
    return nn.Sequential(*layers)


def stem_widths(embed_dim: int, patch_size: int) -> list[int]:
    """The channels after each of a stem's log2(patch_size) halvings: embed_dim / 2^(n-1), ..., embed_dim, >= 16."""
    n = patch_size.bit_length() - 1
    return [max(16, embed_dim >> (n - 1 - i)) for i in range(n)]


def resnet_stem(in_chans: int, embed_dim: int, patch_size: int) -> nn.Sequential:
    """The ViT paper's hybrid embedding, small (Dosovitskiy et al. 2021 put ResNet-50's first stages there): a 3x3
    stride-2 convolution with BatchNorm and ReLU, then per further halving one residual stage, timm's BasicBlock
    (two 3x3 convolutions and a 1x1 stride-2 shortcut), at conv_stem's widths: (B, C, H, W) -> (B, D', H/p, W/p)."""
    from timm.models.resnet import BasicBlock

    widths = stem_widths(embed_dim, patch_size)
    layers: list[nn.Module] = [
        nn.Conv2d(in_chans, widths[0], 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
    ]
    for c_in, c_out in zip(widths, widths[1:]):
        shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=2, bias=False), nn.BatchNorm2d(c_out))
        layers.append(BasicBlock(c_in, c_out, stride=2, downsample=shortcut))
    return nn.Sequential(*layers)


def shifted_patches(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Shifted Patch Tokenization's input (Lee et al. 2021): the image and its four diagonal shifts by half a patch
    (zeros where a shift leaves the frame), cut into patches: (B, C, H, W) -> (B, N, 5 C p^2), each patch flattened
    (row, column, channel) as the paper's Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)'). Pad and slice only:
    it exports to ONNX and runs on any device."""
    B, C, H, W = x.shape
    s, p = patch_size // 2, patch_size
    xp = F.pad(x, (s, s, s, s))  # (B, C, H + 2s, W + 2s)
    # content moved down-right, down-left, up-right, up-left: a crop of the padded image at each corner
    shifts = [xp[..., dy : dy + H, dx : dx + W] for dy in (0, 2 * s) for dx in (0, 2 * s)]
    x = torch.cat([x, *shifts], dim=1)  # (B, 5C, H, W)
    x = x.reshape(B, 5 * C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)  # (B, H/p, W/p, p, p, 5C)
    return x.reshape(B, (H // p) * (W // p), p * p * 5 * C)


# The CNN's convolutions run in channels_last (NHWC), weights and input: oneDNN's depthwise and 1x1 kernels run
# ~1.3x faster a training step than in PyTorch's default NCHW (Lite0's stages to stride 16 with 192 x 4 blocks, batch
# 32, fp32, 96-160 px: 1.32-1.45x on an Intel Xeon with AMX, 1.32-1.41x with oneDNN held to AVX2; `python
# bench/speed_levers.py --hybrid`). The grid leaves it as NHWC, which (B, C, h, w) -> (B, h*w, C) reads as a view.
CHANNELS_LAST = True


class CnnStem(nn.Module):
    """The ViT paper's hybrid with a real CNN: a timm EfficientNet's stem and its stages down to stride `patch_size`
    (the deepest stage at that stride: 8 -> 40 channels, 16 -> 112 for Lite0), (B, C, H, W) -> (B, C', H/p, W/p).
    Its modules keep timm's names (`conv_stem`, `bn1`, `blocks.S.I.*`), so pretrained weights load by prefix
    (vit/model/cnn_weights.py); without them it starts from timm's initialisation."""

    def __init__(self, arch: str, in_chans: int, patch_size: int):
        super().__init__()
        import timm

        net = timm.create_model(arch, pretrained=False, in_chans=in_chans, num_classes=0)
        # timm's feature_info: one entry a stride (module "blocks.S", its reduction and channels), shallowest first
        at = [f for f in net.feature_info if f["module"].startswith("blocks.") and f["reduction"] == patch_size]
        if not at:
            strides = sorted({f["reduction"] for f in net.feature_info})
            raise ValueError(f"stem={arch!r}: patch_size must be one of its strides {strides}, got {patch_size}")
        last = int(at[-1]["module"].split(".")[1])
        self.conv_stem, self.bn1 = net.conv_stem, net.bn1
        self.blocks = nn.Sequential(*net.blocks[: last + 1])
        self.out_chans = at[-1]["num_chs"]
        self.channels_last = CHANNELS_LAST
        if self.channels_last:  # the weights once here (loading copies into them, keeping the layout), the input a call
            self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # same shape (B, C, H, W), strides of NHWC
        return self.blocks(self.bn1(self.conv_stem(x)))
