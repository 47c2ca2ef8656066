"""Count, for each option of a verb, the function signatures in src/levers that declare it
(issue 35: "the audit's 10 options are written out four times"), and the function-local imports.

    python bench/plumbing/option_definitions.py            # a table
    python bench/plumbing/option_definitions.py --json     # the counts as JSON
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "levers"
if len(sys.argv) > 1 and not sys.argv[-1].startswith("--"):  # another checkout's src/levers
    ROOT = Path(sys.argv[-1]).resolve()

# the options each verb takes from its user (the CLI's flags, levers.Step's keywords)
OPTIONS = {
    "audit": ("target", "gpu", "torch_version", "assume_dtype", "select", "ignore", "benchmark",
              "memory_model", "set_items", "workload_spec"),
    "memory": ("gpu", "margin", "num_steps", "whatifs", "world_size", "strategy", "lever_ids",
               "param"),
    "ab": ("steps", "num_steps", "warmup", "num_warmup", "parity_steps", "num_parity_steps",
           "resamples", "num_resamples", "seed", "mem_gate_gib", "time_budget_s"),
    "tune": ("budget", "budget_s", "levers", "only", "exclude", "design", "audit", "use_audit",
             "record", "record_path", "rounds"),
}


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def _local_imports(tree: ast.AST) -> int:
    count = 0
    pending: list[tuple[ast.AST, bool]] = [(tree, False)]
    while pending:
        node, inside = pending.pop()
        if inside and isinstance(node, (ast.Import, ast.ImportFrom)):
            count += 1
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        pending.extend((child, inside) for child in ast.iter_child_nodes(node))
    return count


def counts() -> dict:
    declared: dict[str, dict[str, int]] = {v: {o: 0 for o in opts} for v, opts in OPTIONS.items()}
    # the functions that write out three or more of a verb's options (its option list, copied)
    written_out: dict[str, list[str]] = {v: [] for v in OPTIONS}
    local = {"all": 0, "outside_cli": 0}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        n = _local_imports(tree)
        local["all"] += n
        if "cli" not in path.relative_to(ROOT).parts:
            local["outside_cli"] += n
        for fn in _functions(tree):
            params = _parameters(fn)
            for verb, opts in OPTIONS.items():
                for opt in opts:
                    declared[verb][opt] += opt in params
                if len(params & set(opts)) >= 3:
                    where = path.relative_to(ROOT.parent).as_posix()
                    written_out[verb].append(f"{where}:{fn.lineno} {fn.name}")
    return {"signatures_declaring": declared, "written_out": written_out,
            "function_local_imports": local}


def main() -> None:
    found = counts()
    if "--json" in sys.argv:
        print(json.dumps(found, indent=1))
        return
    for verb, opts in found["signatures_declaring"].items():
        print(f"{verb}: " + ", ".join(f"{o} {n}" for o, n in opts.items()))
    for verb, where in found["written_out"].items():
        print(f"{verb}: {len(where)} signatures write out 3+ of its options: " + "; ".join(where))
    local = found["function_local_imports"]
    print(f"function-local imports: {local['all']} ({local['outside_cli']} outside cli/)")


if __name__ == "__main__":
    main()
