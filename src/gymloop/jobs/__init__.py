"""Jobs built from the libraries: the demo's chapters (`demo.py`, `story.py`), ready-made
configurations (`recipes.py`), and simulated production traffic through the `openai` client
(`traffic.py`). A training run itself is `orchestrator.train`."""
