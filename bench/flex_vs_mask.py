# ruff: noqa: B023  (closures in the loop are called within their own iteration)
"""Sparse attention patterns: SDPA with a boolean mask against FlexAttention with a block mask (same pattern).

    python bench/flex_vs_mask.py            # CPU; --device cuda on a GPU

Interleaved rounds, median; forward + backward of one attention call, 6 heads of 64, a local 3x3 pattern (as
attn_pattern: local) on square grids of 64 and 1,024 tokens. FlexAttention is compiled once before timing.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vit.model.layers import attention_pattern_mask  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device(args.device)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    for side in (8, 32):
        n = side * side
        mask = attention_pattern_mask((side, side), "local", 3).to(dev)
        block = create_block_mask(lambda b, h, q, k: mask[q, k], None, None, n, n, device=str(dev))
        q, k, v = (torch.randn(2, 6, n, 64, device=dev, requires_grad=True) for _ in range(3))
        backward = True

        def sdpa():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out.sum().backward() if backward else None

        def flexed():
            out = flex(q, k, v, block_mask=block)
            out.sum().backward() if backward else None

        t0 = time.perf_counter()
        try:
            flexed()  # compile
        except NotImplementedError as e:  # torch 2.14 on CPU: no FlexAttention backward, so it cannot train here
            print(f"{n:5d} tokens: {str(e).splitlines()[0]} -> timing the forward only")
            backward = False
            q, k, v = (t.detach() for t in (q, k, v))
            flexed()
        compile_s = time.perf_counter() - t0
        sdpa()
        ta, tb = [], []
        for _ in range(args.rounds):
            for f, out in ((sdpa, ta), (flexed, tb)):
                t = time.perf_counter()
                f()
                out.append(time.perf_counter() - t)
        a, b = statistics.median(ta), statistics.median(tb)
        what = "fwd+bwd" if backward else "fwd"
        print(
            f"{n:5d} tokens, {what}: SDPA+mask {a * 1e3:8.2f} ms, FlexAttention {b * 1e3:8.2f} ms "
            f"(flex {a / b:.2f}x as fast), compile {compile_s:.0f} s"
        )


if __name__ == "__main__":
    main()
