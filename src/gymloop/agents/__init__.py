"""Agent programs as environments: a team's program (an Agents SDK agent, an `openai` loop, any
command) runs against an OpenAI endpoint on the policy's engine; its calls' exact tokens are
captured and merged into training sequences, and its return value is the reward.

    env.py        the `agent` environment: options, task file, episodes
    programs.py   running a function or a command for one episode; its result or its failure
    gateway.py    the endpoint: gymloop serve's API on the run's engine, a key per episode
    check.py      `gymloop envs validate agent`: the program run on a few tasks

Calls as tokens, and their merge into training sequences, are rollout/capture.py's (the store's
production sessions are merged the same way).
"""
