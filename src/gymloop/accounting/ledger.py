"""The cost ledger: what each phase took (seconds, tokens, FLOPs) and what it cost.

dollars = seconds x the hardware profile's $/hour. FLOPs are estimates: 2*N per generated
or served token and 6*N per trained token, N being the *active* parameter count (for an MoE
model, the parameters one token passes through). Projections to other hardware go through
FLOPs and an assumed utilisation, and say so.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_PROFILES = Path(__file__).with_name("profiles.yaml")


class Profile(BaseModel):
    """One priced hardware profile."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="cpu or gpu.", pattern="^(cpu|gpu)$")
    usd_per_hour: float = Field(ge=0, description="Price of one device-hour, US dollars.")
    peak_flops: float = Field(gt=0, description="Peak dense FLOP/s of one device (bf16 for GPUs).")
    assumption: str = Field(min_length=1, description="Where the price comes from, and its date.")

    def dollars(self, seconds: float) -> float:
        """What `seconds` of this hardware cost: the one place a price meets a clock."""
        return seconds * self.usd_per_hour / 3600


def token_flops(active_params: int, *, prompt_tokens: int = 0, generated_tokens: int = 0,
                served_tokens: int = 0, trained_tokens: int = 0) -> float:
    """FLOPs of the tokens a phase processed: 2 per parameter per token through a forward pass
    (prompt, generated, served), 6 per parameter per trained token (forward and backward)."""
    return 2 * active_params * (prompt_tokens + generated_tokens + served_tokens) + 6 * active_params * trained_tokens


class ProfileError(ValueError):
    """A profiles file that does not validate; the message names the profile and field."""


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    path = Path(path or os.environ.get("GYMLOOP_PROFILES") or DEFAULT_PROFILES)
    data = yaml.safe_load(path.read_text()) or {}
    raw = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(raw, dict) or not raw:
        raise ProfileError(f"{path}: expected a mapping 'profiles: {{name: {{...}}}}'")
    out = {}
    for name, body in raw.items():
        try:
            out[name] = Profile.model_validate(body)
        except ValidationError as err:
            e = err.errors()[0]
            field_name = ".".join(str(x) for x in e["loc"]) or "(profile)"
            msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
            raise ProfileError(f"{path}: profile {name!r}, field {field_name!r}: {msg}") from None
    return out


@dataclass
class Entry:
    phase: str
    seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    trained_tokens: int = 0
    served_tokens: int = 0
    flops: float = 0.0


@dataclass
class Ledger:
    """Per-phase totals for one run on one profile."""

    profile_name: str
    profile: Profile
    active_params: int
    entries: dict[str, Entry] = field(default_factory=dict)

    def add(self, phase: str, seconds: float = 0.0, *, prompt_tokens: int = 0, generated_tokens: int = 0,
            trained_tokens: int = 0, served_tokens: int = 0) -> None:
        e = self.entries.setdefault(phase, Entry(phase))
        e.seconds += seconds
        e.prompt_tokens += prompt_tokens
        e.generated_tokens += generated_tokens
        e.trained_tokens += trained_tokens
        e.served_tokens += served_tokens
        e.flops += token_flops(self.active_params, prompt_tokens=prompt_tokens, generated_tokens=generated_tokens,
                               served_tokens=served_tokens, trained_tokens=trained_tokens)

    def dollars(self, seconds: float) -> float:
        return self.profile.dollars(seconds)

    def state(self) -> dict[str, dict]:
        """The totals so far, by phase (saved with a checkpoint; `restore` takes them back)."""
        return {p: asdict(e) for p, e in self.entries.items()}

    def restore(self, state: dict[str, dict]) -> None:
        self.entries = {p: Entry(**e) for p, e in state.items()}

    def summary(self, base_score: float | None, final_score: float | None, post_training_phases: tuple[str, ...],
                generation_seconds: float | None = None) -> dict:
        """Costs by phase, cost per 1M generated tokens, intelligence per dollar, projections.

        `generation_seconds`: when generation overlapped training (asynchronous RL), the
        collector's own seconds price its tokens; the phase itself only holds the wait.
        """
        phases = {p: {**asdict(e), "dollars": self.dollars(e.seconds)} for p, e in self.entries.items()}
        total_s = sum(e.seconds for e in self.entries.values())
        gen = self.entries.get("generation", Entry("generation"))
        post_s = sum(self.entries[p].seconds for p in post_training_phases if p in self.entries)
        post_usd = self.dollars(post_s)
        # points and intelligence per dollar need both scores (a run that did not evaluate has none)
        gained = None if base_score is None or final_score is None else 100 * (final_score - base_score)
        flops = sum(e.flops for e in self.entries.values())
        return {
            "profile": self.profile_name, "usd_per_hour": self.profile.usd_per_hour,
            "assumption": self.profile.assumption,
            "phases": phases, "seconds": total_s, "dollars": self.dollars(total_s),
            "cost_per_1m_generated_tokens": (
                self.dollars(gen.seconds if generation_seconds is None else generation_seconds)
                / gen.generated_tokens * 1e6 if gen.generated_tokens else None),
            "post_training_dollars": post_usd,
            "points_gained": gained,
            "intelligence_per_dollar": gained / post_usd if gained is not None and post_usd > 0 else None,
            "flops": flops,
        }

    def project(self, profiles: dict[str, Profile], utilisation: float = 0.4) -> dict:
        """The same work's cost on other hardware (see `project`), and what a generated token
        would cost there (its FLOPs count the active parameters: for MoE, the chosen experts)."""
        out = project(sum(e.flops for e in self.entries.values()), profiles, utilisation)
        gen = self.entries.get("generation")
        if gen is not None and gen.generated_tokens:
            per = project(gen.flops, profiles, utilisation)
            for name in out:
                out[name]["usd_per_1m_generated_tokens"] = per[name]["dollars"] / gen.generated_tokens * 1e6
        return out


def project(flops: float, profiles: dict[str, Profile], utilisation: float = 0.4) -> dict:
    """FLOPs / (peak x utilisation) x price, per profile, labelled as a projection."""
    out = {}
    for name, p in profiles.items():
        seconds = flops / (p.peak_flops * utilisation)
        out[name] = {"projection": True, "seconds": seconds, "dollars": p.dollars(seconds),
                     "assumption": f"{flops:.3g} FLOPs at {utilisation:.0%} of {p.peak_flops:.3g} FLOP/s peak; "
                                   f"{p.assumption}"}
    return out


def cost_to_maintain(rounds: list[dict], events: list[dict], epsilon: float,
                     production_after: dict[str, float] | None = None) -> list[dict]:
    """What each drift event cost: dollars spent from the round that saw it until the served
    model's score on its environment was back within `epsilon` of the pre-drift value.
    `production_after`: production success rates measured since the last round (a production
    event that recovered there cost what the rounds up to the last one spent).

    rounds: [{"round", "dollars", "served": {env: held-out score}, "production": {env: success
    rate}}], in order. events: [{"round", "env", "kind", "before", "after"}]; an "eval" event
    holds scores, a "production" one failure rates (pre-drift success = 1 - before).
    Returns one row per event; `recovered_round` None means "not yet", and `dollars` is then
    what has been spent so far.
    """
    out = []
    for e in events:
        kind = e["kind"]
        pre = e["before"] if kind == "eval" else 1 - e["before"]
        spent, back = 0.0, None
        for r in rounds:
            if r["round"] < e["round"]:
                continue
            spent += r["dollars"]
            score = r["served" if kind == "eval" else "production"].get(e["env"])
            if score is not None and score >= pre - epsilon:
                back = r["round"]
                break
        status = "not yet" if back is None else f"recovered in round {back}"
        late = (production_after or {}).get(e["env"])
        if back is None and kind == "production" and rounds and late is not None and late >= pre - epsilon:
            back = rounds[-1]["round"]
            status = f"recovered after round {back}"
        out.append({"env": e["env"], "kind": kind, "round": e["round"], "pre_drift": pre,
                    "dollars": spent, "recovered_round": back, "status": status})
    return out
