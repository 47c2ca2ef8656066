"""Is an optimizer-state lever's DAMAGED in the arch sweep its own change, or a step that
amplifies any change of the update? Three steps of an arch workload (``size=tiny``, as the sweep
builds it, same seeds per step): the baseline; adamw-8bit applied; the baseline with its
learning rate 1% larger; the baseline with Adam's eps ten times larger. Prints each run's
(loss, total gradient norm) per step.

    LEVERS_TORCHVISION_WITHOUT_OPS=1 PYTHONPATH=src python bench/optimizer_state_probe.py timm:skresnet18
"""

from __future__ import annotations

import sys

from levers.optional import torchvision_without_ops

torchvision_without_ops()

import torch  # noqa: E402

import levers  # noqa: E402
from levers.ab.gradnorm import grad_norm_probe  # noqa: E402
from levers.workloads import arch  # noqa: E402


def build(name: str):
    torch.manual_seed(0)
    return arch.build(model=name, size="tiny")


def run(workload, steps: int = 3) -> list[tuple[float, float]]:
    out = []
    with grad_norm_probe(workload.model) as take:
        for step in range(1, steps + 1):
            torch.manual_seed(1000 + step)
            loss = workload.step()
            out.append((round(float(loss), 4), round(float(take()), 2)))
    return out


def scaled(name: str, key: str, factor: float):
    workload = build(name)
    for group in workload.optimizer.param_groups:
        group[key] = group[key] * factor
    return workload


def main(name: str) -> None:
    print("baseline   ", run(build(name)))
    workload = build(name)
    levers.apply(workload, "adamw-8bit")
    print("adamw-8bit ", run(workload))
    print("lr x 1.01  ", run(scaled(name, "lr", 1.01)))
    print("eps x 10   ", run(scaled(name, "eps", 10.0)))


if __name__ == "__main__":
    main(sys.argv[1])
