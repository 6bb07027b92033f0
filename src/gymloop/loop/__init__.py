"""The loop that never stops: rounds of curriculum -> GRPO -> gate -> promotion (`rounds.py`),
the gate's rule (`gate.py`), drift detection (`drift.py`), the curriculum (`curriculum.py`), and
what the rounds did, read back from the store (`summary.py`)."""
