"""gymloop.sandbox: the one place where untrusted, model-written code runs.

    from gymloop.sandbox import Pool, Limits
    with Pool(slots=2) as pool:
        r = pool.run(source="print(1 + 1)", limits=Limits(timeout_s=2))
        r.stdout, r.exit_code, r.timed_out

Limits live in `limits.py`; the isolation command line in `isolation.py`; one run's
mechanics (spawn, capped output, wall clock, reaping) in `runner.py`; slots in `pool.py`.
"""
from .isolation import INSTALL_HINT, SandboxUnavailable, find_bwrap
from .limits import Limits, Result
from .pool import Pool, run

__all__ = ["INSTALL_HINT", "Limits", "Pool", "Result", "SandboxUnavailable", "find_bwrap", "run"]
