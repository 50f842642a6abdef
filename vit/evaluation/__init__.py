"""Evaluation and explanation: attention maps and their faithfulness, the evaluation report, calibration, post-hoc
logit adjustment, test-time augmentation and the label-issue finder. Reads trained models; never trains one."""
