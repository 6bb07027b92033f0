"""What a run leaves behind: its directory (`run_dir.py`: config, metrics.jsonl, summary),
metric sinks (`loggers.py`), the HTML report (`report.py`) and progress bars (`progress.py`)."""
