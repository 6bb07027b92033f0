"""Fine-tuning jobs (the library behind the fine-tuning API of `serve/fine_tuning.py`): training
files and their validation (`formats.py`), what a job trains and how (`methods.py`: supervised,
DPO), the worker that runs the store's queued jobs and resumes them after a crash
(`worker.py`), graders (`graders.py`), and production traces as training files (`export.py`)."""
