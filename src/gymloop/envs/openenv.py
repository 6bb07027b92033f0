"""OpenEnv environments, unchanged: an OpenEnv server (`create_app(Env, Action, Observation)`)
runs its own code in OpenEnv's runtime (`gymloop envs install openenv`, its own venv), started
by gymloop from `app: module:app` or reached at `url`, and OpenEnv's own client drives it from a
bridge process in that runtime (openenv_bridge.py): one WebSocket session per episode.

    env: {name: openenv, options: {app: "echo_env.server.app:app", path: [DIR], sessions: 64}}

An episode: `reset(seed)` (the task is the seed) -> the observation as the user's message -> the
model's reply as an action -> `step` -> the next observation, until the server says done or the
run's max_turns. The action is the reply's text in one field (`action_field`, or the action's one
string field), or else a call of the tool `step` whose parameters are the action's JSON schema, in
gymloop's one tool format. The reward is the episode's return (the sum of the server's step
rewards), mapped from `reward_range` onto [0, 1]; return and steps are its components. A server
or bridge that fails or times out is an error, never a reward of 0.
"""
from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

from .. import runtimes
from ..models.toolcalls import parse_tool_calls, tool_response
from .base import PeerEnvironment, Score, StepResult, Task, check_reward_range, peer, split_of, unit_reward

SESSION = "openenv_session"          # the key of the first message that names its episode's session
TOOL = "step"


class OpenEnvError(RuntimeError):
    """The OpenEnv server or its bridge failed, refused, or did not answer in time."""

    user_facing = True


def capacity_hint(error: str) -> str:
    """What to do when the server refuses a session: it is at capacity (it answers
    CAPACITY_REACHED, or closes the new session first)."""
    if not any(k in error for k in ("CAPACITY_REACHED", "ConnectionClosed")):
        return ""
    return ("; if it allows fewer concurrent sessions than episodes in flight (a GRPO step runs prompts_per_step x "
            "group_size at once), give option sessions (served with that many) or run the server with a larger "
            "max_concurrent_envs")


def bridge(app: str | None, paths: list[str], url: str | None, timeout_s: float,
           sessions: int | None = None) -> runtimes.Channel:
    """openenv_bridge.py in OpenEnv's runtime, serving `app` or connected to `url`."""
    args = (["--app", app] + (["--sessions", str(sessions)] if sessions else [])) if app else ["--url", url]
    for p in paths:
        args += ["--path", str(Path(p).resolve())]
    return runtimes.Channel("openenv", Path(__file__).with_name("openenv_bridge.py"), args, timeout_s,
                            f"the OpenEnv server ({app or url})", OpenEnvError)


def render(observation: dict) -> str:
    """An observation as the model reads it: its fields as JSON, without the reward and done the
    server sends beside them."""
    return json.dumps({k: v for k, v in observation.items() if k not in ("reward", "done", "metadata")})


class OpenEnvEnvironment(PeerEnvironment):
    name = "openenv"

    def __init__(self, app: str | None = None, url: str | None = None, path: str | list[str] | None = None,
                 action_field: str | None = None, reward_range: tuple[float, float] = (0.0, 1.0),
                 system: str | None = None, timeout_s: float = 60.0, heldout_fraction: float = 0.2,
                 sessions: int | None = None) -> None:
        """sessions: with app, serve it allowing this many concurrent sessions (episodes in flight)."""
        check_openenv(app, url, reward_range=reward_range, sessions=sessions)
        self.reward_range, self.heldout_fraction = check_reward_range(reward_range, "openenv"), heldout_fraction
        self.bridge = bridge(app, [path] if isinstance(path, str) else list(path or []), url, timeout_s, sessions)
        try:
            action = self.bridge.call("schema")["action"]
            # every OpenEnv Action has `metadata`; the environment's own fields are the rest
            props = {k: v for k, v in action.get("properties", {}).items() if k != "metadata"}
            strings = [k for k, v in props.items() if v.get("type") == "string"]
            if action_field is not None and action_field not in props:
                raise ValueError(f"openenv option action_field {action_field!r} is not a field of the action "
                                 f"(it has: {', '.join(props) or 'none'})")
            self.action_field = action_field or (strings[0] if len(props) == 1 and strings else None)
            self.action_schema = action
        except BaseException:
            self.bridge.close()
            raise
        self.system = system or (f"Each reply of yours is the `{self.action_field}` of your next action."
                                 if self.action_field else f"Act by calling the tool `{TOOL}`.")
        self._episodes: dict[str, dict] = {}

    # tasks: an episode's seed
    def sample_tasks(self, n: int, split: str, seed: int) -> list[Task]:
        rng, tasks = random.Random(f"openenv:{split}:{seed}"), {}
        while len(tasks) < n:
            s = rng.randrange(2**31)
            if split_of(f"openenv:{s}", self.heldout_fraction) == split:
                tasks.setdefault(s, self.task_from_id(f"openenv:{s}"))
        return list(tasks.values())

    def task_from_id(self, task_id: str) -> Task:
        s = int(task_id.removeprefix("openenv:"))
        return Task(id=task_id, env=self.name, prompt=(), answer=None,
                    split=split_of(task_id, self.heldout_fraction), info={"seed": s})

    def tools(self, task: Task) -> list[dict] | None:
        if self.action_field:
            return None
        schema = {k: v for k, v in self.action_schema.items() if k not in ("title", "description")}
        schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        return [{"type": "function", "function": {"name": TOOL, "description": "Your next action in the environment.",
                                                  "parameters": schema}}]

    def reset(self, task: Task) -> list[dict]:
        sid = uuid.uuid4().hex
        self.bridge.call("open", session=sid)
        first = self.bridge.call("reset", hint=capacity_hint, session=sid, kwargs={"seed": task.info["seed"]})
        self._episodes[sid] = {"rewards": [], "done": first["done"]}
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": render(first["observation"]), SESSION: sid}]

    def _session(self, messages: list[dict]) -> str:
        sid = next((m[SESSION] for m in messages if SESSION in m), None)
        if sid is None or sid not in self._episodes:
            raise OpenEnvError("an openenv episode's messages must start with the ones reset() returned")
        return sid

    def action(self, text: str) -> dict | None:
        """The action a reply takes (None: a reply without a call of `step`)."""
        if self.action_field:
            return {self.action_field: text}
        calls = [c for c in parse_tool_calls(text).calls if c.name == TOOL and isinstance(c.arguments, dict)]
        return calls[0].arguments if calls else None

    def step(self, task: Task, messages: list[dict], assistant_text: str) -> StepResult:
        sid = self._session(messages)
        action = self.action(assistant_text)
        if action is None:                         # no action taken: the episode ends here
            self._episodes[sid]["done"] = True
            return StepResult(observation=(), done=True)
        got = self.bridge.call("step", session=sid, action=action)
        ep = self._episodes[sid]
        ep["rewards"].append(float(got["reward"] or 0.0))
        ep["done"] = got["done"]
        role = "user" if self.action_field else "tool"
        content = render(got["observation"]) if self.action_field else tool_response(got["observation"])
        return StepResult(observation=({"role": role, "content": content},), done=got["done"])

    def verify(self, task: Task, messages: list[dict]) -> Score:
        sid = self._session(messages)
        ep = self._episodes.pop(sid)
        self.bridge.call("close", session=sid)
        total = sum(ep["rewards"])
        return Score(unit_reward(total, self.reward_range), {"return": total, "steps": float(len(ep["rewards"]))},
                     f"return {total:g} over {len(ep['rewards'])} step(s)" + ("" if ep["done"] else ", not done"))

    def close(self) -> None:
        self.bridge.close()


def check_openenv(app: str | None = None, url: str | None = None, path: str | list[str] | None = None,
                  action_field: str | None = None, reward_range: tuple[float, float] = (0.0, 1.0),
                  system: str | None = None, timeout_s: float = 60.0, heldout_fraction: float = 0.2,
                  sessions: int | None = None) -> None:
    """The options checked without starting anything (a config check; the run starts the server)."""
    if (app is None) == (url is None):
        raise ValueError("openenv needs one of options app (module:app, served by gymloop) or url (a running server)")
    if app is not None and ":" not in app:
        raise ValueError(f"openenv option app must be module:attribute (e.g. my_env.server.app:app), not {app!r}")
    check_reward_range(reward_range, "openenv")
    if sessions is not None and (app is None or sessions < 1):
        raise ValueError("openenv option sessions (>= 1) applies to a server gymloop starts (option app)")


def make_openenv(**options) -> OpenEnvEnvironment:
    return peer(OpenEnvEnvironment)(options)
