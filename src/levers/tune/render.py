"""The terminal view of a ``levers tune`` result: the proven stack (or why there is none: nothing
pays, nothing tried, interrupted), then every lever's fate."""

from __future__ import annotations

from rich.console import Console

from levers.ab.verdict import NOT_MEASURED
from levers.output.console import make_console
from levers.tune.budget import format_duration
from levers.tune.result import TuneResult
from levers.tune.trial import AS_RUN, Trial
from levers.units import format_bytes


EAGER_RANDOM_WORDS = (
    "timed        with the compiled program's random numbers (dropout) drawn as eager draws "
    "them, as its parity was judged: one compile, not two; the program you run draws its own "
    "in its kernels (`reproduce the proof` times that one)"
)


def proof_lines(proof: Trial) -> list[str]:
    """The proof's reads: tokens/s (or step time) with CI95, peak memory, parity, quality."""
    lines = []
    if proof.tokens_per_s_ci95 is not None and proof.tokens_per_s_ratio is not None:
        low, high = proof.tokens_per_s_ci95
        lines.append(f"tokens/s     {proof.tokens_per_s_ratio:.3f}x  CI95 [{low:.3f}, {high:.3f}]")
    if proof.step_time_ci95 is not None and proof.step_time_ratio is not None:
        low, high = proof.step_time_ci95
        lines.append(f"step time    {proof.step_time_ratio:.3f}x  CI95 [{low:.3f}, {high:.3f}]")
    if proof.peak_allocated_bytes is not None:
        base, cand = proof.peak_allocated_bytes
        lines.append(
            f"peak         {format_bytes(cand)} (baseline {format_bytes(base)}, "
            f"{proof.peak_verdict})"
        )
    else:
        lines.append("peak         not measured (no caching allocator on a CPU)")
    lines.append(f"parity       {proof.parity}" + (f": {proof.parity_note}" if proof.parity_note else ""))
    if proof.timed_eager_random:
        lines.append(EAGER_RANDOM_WORDS)
    if proof.quality != NOT_MEASURED:
        lines.append(f"quality      {proof.quality}: {proof.quality_note}")
    elif proof.quality_note:
        lines.append(f"quality      not measured: {proof.quality_note}")
    return lines


def proof_source(result: TuneResult) -> str:
    """Which A/B proves the stack, and which selected and confirmed its levers."""
    kept = [o for o in result.search.outcomes if o.kept]
    selected = ", ".join(str(o.trial + 1) for o in kept if o.trial is not None)
    as_run = " timed as you run it" if result.proof.role == AS_RUN else ""
    line = (f"proof: A/B {result.search.confirmed_by + 1}, a fresh A/B against the baseline"
            f"{as_run} ({result.proof_steps} timed steps per side); ")
    if len(kept) == 1:
        return line + f"A/B {selected} selected it"
    confirmed = ", ".join(str(o.confirmed_by + 1) for o in kept if o.confirmed_by is not None)
    return line + f"A/B {selected} selected its levers, A/B {confirmed} confirmed each"


def print_tune(result: TuneResult, console: Console | None = None) -> None:
    console = console or make_console()

    def say(text: str = "", style: str | None = None) -> None:
        console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    search = result.search
    say(
        f"levers tune {result.workload} on {result.device}: {len(search.trials)} A/B(s) in "
        f"{format_duration(search.spent_s)} of a {format_duration(search.budget_s)} budget"
        + (" (the budget ran out)" if search.out_of_budget else ""),
    )
    say()
    if result.interrupted:
        say("INTERRUPTED (Ctrl-C): the search stopped before its end; what it proved so far:",
            style="bold red")
    if result.why_nothing_tried is not None:
        say(f"nothing tried: {result.why_nothing_tried}", style="bold")
    elif not result.stack and result.unconfirmed and not result.interrupted:
        paid = ",".join(result.unconfirmed)
        say(f"nothing proven in the budget: {paid} paid where selected, but the budget ran out "
            "before a fresh A/B could confirm it (not kept, not refuted; the notes below say "
            "the budget that gives it time)", style="bold")
        if result.confirm_command is not None:
            say("confirm it by hand:")
            say(f"  {result.confirm_command}")
    elif not result.stack:
        if result.interrupted:
            say("no stack was confirmed before the interrupt"
                + (f" (selected, not confirmed: {','.join(search.selected)})"
                   if search.selected else ""), style="bold")
        else:
            tried = sum(1 for o in search.outcomes if o.trial is not None)
            say(f"nothing pays here: {tried} lever(s) A/B'd, none faster with parity held (a "
                "lever is kept only when the A/B that selects it and a fresh one both find it "
                "faster)", style="bold")
    else:
        say(f"proven stack: {','.join(result.stack)}", style="bold green")
        say("  " + proof_source(result))
        for line in proof_lines(result.proof):
            say("  " + line)
        say()
        say("apply it in your script:")
        say(f"  {result.apply_line}")
        if result.apply_note is not None:
            say(f"  ({result.apply_note})")
        if result.wraps_step:
            say("  (a lever wraps the step: call handle.step() in place of train_step())")
        say("reproduce the proof:")
        say(f"  {result.reproduce_command}")
    say()
    say("levers considered:")
    for outcome in search.outcomes:
        mark = "kept   " if outcome.kept else "dropped"
        source = f" [expected from {outcome.source}]" if outcome.source else ""
        say(f"  {mark} {outcome.lever}: {outcome.reason}{source}")
    for note in (*search.notes, *result.notes):
        say(f"note: {note}", style="yellow")
