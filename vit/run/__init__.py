"""What a training run does around Lightning's loop, above training, evaluation and planning: the steps vit-train adds
(steps.py), the weights and plan written into the config (weights.py, planned.py), the budget kept (fit_budget.py), the
time it will take said (estimate.py) and the precision applied (trainer.py)."""
