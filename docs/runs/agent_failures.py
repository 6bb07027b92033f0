"""What the agent chapter's failed production episodes did, from a story's store.

    python docs/runs/agent_failures.py RUN/story-*/story.db [--version 2]

Every production request's trace (the server's response) and its verdict (the feedback the
verifier posted) are in the store. For each failed episode of calls@vN this reads the reply as
the verifier does and sorts it: no call at all, several calls, a tool of the other API version
(a memorised old name), another offered tool, a tool name the request did not offer, the right
tool with other argument names, or the right tool and names with wrong values. Prints one
count per kind, per served model version.
"""
from __future__ import annotations

import argparse
from collections import Counter

from openai.types.chat import ChatCompletionMessage

from gymloop.envs.calls import catalogue, make_calls
from gymloop.demos.traffic import reply_text
from gymloop.models.toolcalls import parse_tool_calls
from gymloop.store import Store

KINDS = ("no call", "several calls", "a tool of the other version", "another offered tool",
         "a tool not offered", "right tool, other argument names", "right tool and names, wrong values")


def reply_of(response: dict) -> str:
    """The assistant's turn as the verifier read it in production (traffic.reply_text)."""
    return reply_text(ChatCompletionMessage.model_validate(response["choices"][0]["message"]))


def kind_of(env, task, reply: str, other_names: set[str]) -> str:
    """The verifier's verdict (its components), refined by the name the call used."""
    verdict = env.verify(task, list(task.prompt) + [{"role": "assistant", "content": reply}])
    parsed = parse_tool_calls(reply)
    calls = parsed.calls
    if parsed.errors or not calls:
        return "no call"
    if len(calls) > 1:
        return "several calls"
    if not verdict.components["tool"]:
        if calls[0].name in other_names:
            return "a tool of the other version"
        return "another offered tool" if calls[0].name in task.info["tools"] else "a tool not offered"
    if not verdict.components["arguments"]:
        return "right tool, other argument names"
    return "right tool and names, wrong values"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="a story's store (story.db in its run directory)")
    ap.add_argument("--version", type=int, default=2, help="the calls API version whose failures to sort")
    args = ap.parse_args()
    env = make_calls(version=args.version, heldout="requests")
    other_names = {t.name for v in (1, 2) if v != args.version for t in catalogue(v)}
    failed = [g for g in Store(args.db).traces.graded() if g["env"] == env.name and g["reward"] < 1]
    by_version: dict[int, Counter] = {}
    for g in failed:
        task = env.task_from_id(g["task_id"])
        by_version.setdefault(g["model_version"], Counter())[kind_of(env, task, reply_of(g["response"]), other_names)] += 1
    total = sum(by_version.values(), Counter())
    print(f"{sum(total.values())} failed {env.name} episodes in {args.db}")
    versions = sorted(by_version)
    print(f"{'kind':38s}" + "".join(f"{'v' + str(v):>7s}" for v in versions) + f"{'all':>7s}")
    for kind in KINDS:
        print(f"{kind:38s}" + "".join(f"{by_version[v][kind]:7d}" for v in versions) + f"{total[kind]:7d}")


if __name__ == "__main__":
    main()
