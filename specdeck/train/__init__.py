"""Distilling a draft model from a target: training text, the teacher's cached distributions,
the draft's shape, the training loop, `specdeck train-draft` and a measuring script."""
