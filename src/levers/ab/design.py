"""The design of a run: from command-line options, or frozen in a pre-registration.

With ``--prereg`` the file's design (after its amendments) is the design; an option that
contradicts it is refused rather than silently winning, since the point of freezing is that the
comparison run is the one that was registered.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from levers.ab.lever_lookup import (
    apply_levers, choose_params, declared_exactness, declared_parity_floor, find_levers,
    predicting_own_workload,
)
from levers.ab.prereg import DESIGN_DEFAULTS, Prereg, PreregError
from levers.ab.runner import AbConfig, Side
from levers.loader import file_spec_relative_to, load_workload
from levers.workload import Workload
from levers.workloads import BUILTINS
from levers.vocab import CHANGES_NUMERICS

# design key -> the option that sets it, for messages
DESIGN_OPTIONS = {
    "baseline": "BASELINE",
    "candidate": "CANDIDATE",
    "params": "--set",
    "params_b": "--set-b",
    "levers": "--lever",
    "exactness": "--exact/--changes-numerics",
    "steps": "--steps",
    "warmup": "--warmup",
    "parity_steps": "--parity-steps",
    "resamples": "--resamples",
    "seed": "--seed",
}
KILL_OPTIONS = {"mem_gate_gib": "--mem-gate-gib", "time_budget_s": "--time-budget-s"}


def _effective(design: dict[str, Any]) -> dict[str, Any]:
    out = {**DESIGN_DEFAULTS, **design}
    out["candidate"] = out["candidate"] or out["baseline"]
    out["levers"] = list(out["levers"])
    return out


def resolve(
    given: dict[str, Any], given_kill: dict[str, Any], prereg: Prereg | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(design, kill lines) for the run; refuses options that contradict a pre-registration."""
    if prereg is None:
        return _effective(given), dict(given_kill)
    frozen = _effective(prereg.design)
    conflicts = []
    for key, value in given.items():
        if value != frozen[key]:
            conflicts.append(f"{DESIGN_OPTIONS[key]} {value!r} (registered: {frozen[key]!r})")
    for key, value in given_kill.items():
        if value != prereg.kill.get(key):
            conflicts.append(
                f"{KILL_OPTIONS[key]} {value!r} (registered: {prereg.kill.get(key)!r})"
            )
    if conflicts:
        raise PreregError(
            "the pre-registration fixes the design, and these options contradict it: "
            + "; ".join(conflicts)
            + ". Drop them, or append an [[amendments]] table that changes the design and says why"
        )
    return frozen, {k: prereg.kill.get(k) for k in KILL_OPTIONS}


def relative_to(design: dict[str, Any], directory: Any) -> dict[str, Any]:
    """The design with relative workload file paths read from ``directory`` (the
    pre-registration's own), so that a study runs the same from any working directory."""
    out = dict(design)
    for key in ("baseline", "candidate"):
        if isinstance(out.get(key), str):
            out[key] = file_spec_relative_to(out[key], directory)
    return out


def _load(spec: str, params: dict[str, Any], levers: list[Any]) -> Workload:
    return apply_levers(load_workload(spec, params), levers)


def _with_seed(spec: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
    # built-in factories all take a seed; a user's factory gets one only through --set seed=S
    # (the runner calls torch.manual_seed(seed) before every build either way)
    if spec in BUILTINS and "seed" not in params:
        return {**params, "seed": seed}
    return dict(params)


def sides(design: dict[str, Any]) -> tuple[Side, Side, str]:
    """The two sides to build, and the exactness to hold the candidate to."""
    # a lever that predicts memory (ac-budget) predicts the candidate unless told otherwise
    levers = predicting_own_workload(find_levers(design["levers"]), design["candidate"])
    params_a = _with_seed(design["baseline"], design["params"], design["seed"])
    params_b = _with_seed(
        design["candidate"], {**design["params"], **design["params_b"]}, design["seed"]
    )
    # a lever on the factory parameters (raise-batch) picks them before the candidate is built
    # the A/B holds the baseline on the same device while the candidate steps
    params_b = choose_params(
        design["candidate"], params_b, levers, beside=(design["baseline"], params_a)
    )
    baseline = Side(partial(_load, design["baseline"], params_a, []), design["baseline"], params_a)
    candidate = Side(
        partial(_load, design["candidate"], params_b, levers),
        design["candidate"],
        params_b,
        tuple(design["levers"]),
    )
    # declared on the command line or in the pre-registration, else by the levers themselves
    exactness = design["exactness"] or declared_exactness(levers) or CHANGES_NUMERICS
    return baseline, candidate, exactness


def config(
    design: dict[str, Any], kill: dict[str, Any], exactness: str, sides: str = "together"
) -> AbConfig:
    """The run's config; ``sides`` is how the sides run (``levers ab --sides``), not part of
    the pre-registered design: it changes how the two are timed, not what is compared."""
    floor = declared_parity_floor(find_levers(design["levers"]))
    try:
        return AbConfig.from_design(
            design,
            exactness=exactness,
            parity_floor=None if floor is None else floor[0],
            parity_floor_of="" if floor is None else floor[1],
            mem_gate_gib=kill.get("mem_gate_gib"),
            time_budget_s=kill.get("time_budget_s"),
            sides=sides,
        )
    except ValueError as exc:
        raise PreregError(f"the design is not runnable: {exc}") from None
