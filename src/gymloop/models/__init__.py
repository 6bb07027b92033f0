"""What a model is on disk and how it talks: chat rendering (`chat.py`), checkpoints (`checkpoint.py`,
save and load only), the cache directory (`cache.py`). Where base models come from is `bases/`."""
