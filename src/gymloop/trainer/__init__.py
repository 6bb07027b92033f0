"""The trainer: scored rollouts -> token batches -> losses -> optimizer steps, its state and
checkpoints (`trainer.py`), token log-probs (`logprobs.py`), and FSDP sharding of its model for
data-parallel ranks (`sharding.py`)."""
