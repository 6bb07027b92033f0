"""A training run, end to end (`train.py`): the driver that pulls rollouts from a source, steps
the trainer, syncs weights, evaluates, checkpoints and prices every phase (prime-rl's name for
the part that drives the trainer and the inference engines)."""
