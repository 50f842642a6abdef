"""Planning: a recipe from the data and this machine under a time budget. The fingerprint of a source
(fingerprint.py), this machine's speed (speed.py), the rule table that turns both into a plan (plan.py), and the
planned run that keeps to the budget (planned_run.py, estimate.py)."""
