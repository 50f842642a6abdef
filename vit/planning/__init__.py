"""Planning: a recipe from the data and this machine under a time budget. The fingerprint of a source
(fingerprint.py), this machine's speed (speed.py), the rule table that turns both into a plan (plan.py), and the
planned run that keeps to the budget (planned_run.py, estimate.py), and the steps vit-train takes around Lightning's
fit (fit_steps.py), which call the plan, the run's folders and the after-fit reports."""
