"""gymloop.swe: real repositories as an environment, in SWE-bench's instance format.

    sources.py   the manifest of real projects; sdists downloaded once, unpacked into git repositories
    mutate.py    bug operators (SWE-smith style), edited on the exact source text
    build.py     `gymloop swe build`: candidates validated by the project's own tests -> instances
    instance.py  the SWE-bench instance format, read and written as JSON lines
    repos.py     trees of commits in memory, diffs made and applied
    runner.py    a repository's pytest tests in the sandbox, under a runner gymloop controls
    grading.py   swebench's resolution rules, stricter
    harness.py   verification: the patch screened, applied, tests restored, run, graded
    tools.py     the coding agent's tools over an overlay of the base tree
    env.py       the `swe` environment (docs/swe.md)
"""
