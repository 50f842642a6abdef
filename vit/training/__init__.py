"""Training: the LightningModule around the plain model, its optimizers and schedules, EMA, the metrics computed on
the device, gradient and non-finite checks, and how checkpoints are written (atomically, on a timer, with the data
config they trained on)."""
