"""Weight sync from the trainer to generation engines: who gets new weights after a step
(`publish.py`, one `WeightSync` interface), state dicts as flat byte buckets for the Ray object
store (`buckets.py`), one-copy shared memory for a collector process (`shared.py`), tied
tensors counted once (`tensors.py`)."""
