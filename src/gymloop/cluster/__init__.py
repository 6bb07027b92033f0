"""Running the same job across processes and machines: Ray placement of rollout workers
(`ray_backend.py`) and bucketed weight transfer (`buckets.py`)."""
