"""vit/training/ema.py: the moving average of torch's AveragedModel (EMA), without reading the host at each update."""

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit.training.ema import DeviceEMA


def test_device_ema_equals_torchs_averaged_model_and_resumes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    ours = DeviceEMA(model, decay=0.9)
    ref = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ours.update_parameters(model)
        ref.update_parameters(model)
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
    assert int(ours.n_averaged) == 5
    resumed = DeviceEMA(model, decay=0.9)
    resumed.load_state_dict(ours.state_dict())
    with torch.no_grad():
        model[0].weight.add_(1.0)
    resumed.update_parameters(model)  # an average, not the first update's copy
    ref.update_parameters(model)
    torch.testing.assert_close(resumed.module[0].weight, ref.module[0].weight)
