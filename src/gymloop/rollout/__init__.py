"""Rollouts: episodes as token ids through the engine (`episodes.py`), where a training step's
rollouts come from, synchronously or from a collector (`sources.py`), and held-out evaluation
on episodes (`evaluate.py`)."""
