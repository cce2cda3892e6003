"""Fitting the step-time model's free constants (parallelism.auto.step_time) to measured rows, and writing them back
into conf/parallelism/auto.yaml. bench/fit_steptime.py fits to conf/perf/measured.yaml's `fit` rows and prints the
error on them and on the `held_out` ones.

The fit is least squares on log(predicted / measured step time): a row 10% slow weighs as much as one 10% fast, and a
64-GPU row as much as a 1-GPU one. It works on the constants' logarithms, so they stay positive. The solver is a
plain Levenberg-Marquardt (numpy and scipy are no host dependencies); it is deterministic.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable, Mapping, Sequence

import yaml

from common.config import StepTimeConstants
from common.typed import changed
from launcher.autoconf.steptime import Check

# The constants the fit moves: the ones the fit rows pin to plausible values. Fit with any one of memory_efficiency,
# fp8_elementwise_factor or tp_ring_step_s as well, the fit sends that one to a meaningless value (the first far
# above 1, the others to 0) to absorb the rows' scatter; the rest (gemm_half_dim, link_efficiency, the exposed
# shares, dp_exposed_min, the microbatch overhead) move no fit row's step by more than 2.5% of their own change.
# GPU bandwidths are datasheet figures and the byte and collective counts are read off the kernels: none is fit.
FREE = (
    "gemm_efficiency.bf16",
    "gemm_efficiency.fp8",
    "attention_efficiency",
    "cp_attention_penalty",
    "tp_overlap_gemm_slowdown",
    "step_overhead_s",
)

Residuals = Callable[[Sequence[float]], list[float]]


def constant(constants: StepTimeConstants, path: str) -> float:
    """A constant by its dotted path under step_time (gemm_efficiency.bf16)."""
    value: Any = constants
    for name in path.split("."):
        value = getattr(value, name)
    return float(value)


def fit_constants(checks: Sequence[Check], start: StepTimeConstants, free: Sequence[str] = FREE) -> StepTimeConstants:
    """`start` with the `free` constants fit to the rows of `checks` (least squares on log step time)."""

    def at(x: Sequence[float]) -> StepTimeConstants:
        return changed(start, {path: math.exp(v) for path, v in zip(free, x)})

    def residuals(x: Sequence[float]) -> list[float]:
        c = at(x)
        return [math.log(check.again(c).predicted.total_s / check.measured_step_s) for check in checks]

    return at(least_squares(residuals, [math.log(constant(start, path)) for path in free]))


def rounded(constants: StepTimeConstants, free: Sequence[str] = FREE, digits: int = 3) -> StepTimeConstants:
    """The free constants to `digits` significant digits: what auto.yaml gets, and so what the bench evaluates."""
    return changed(constants, {path: float(f"{constant(constants, path):.{digits}g}") for path in free})


# --------------------------------------------------------------------------- least squares
def least_squares(residuals: Residuals, x0: Sequence[float], max_iterations: int = 200) -> list[float]:
    """x minimising sum(residuals(x)^2), from x0 (Levenberg-Marquardt, central-difference Jacobian)."""
    x = list(x0)
    r = residuals(x)
    cost = _squares(r)
    damping = 1e-3
    for _ in range(max_iterations):
        jac = _jacobian(residuals, x)
        normal = [[sum(row[i] * row[j] for row in jac) for j in range(len(x))] for i in range(len(x))]
        gradient = [sum(row[i] * ri for row, ri in zip(jac, r)) for i in range(len(x))]
        while True:
            # Marquardt's scaling: damp each direction by its own curvature, so the constants' scales don't matter.
            damped = [
                [v + (damping * max(v, 1e-12) if i == j else 0.0) for j, v in enumerate(row)]
                for i, row in enumerate(normal)
            ]
            step = _solve(damped, [-g for g in gradient])
            trial = [xi + si for xi, si in zip(x, step)]
            r_trial, cost_trial = _evaluate(residuals, trial)
            if cost_trial < cost:
                break
            damping *= 10
            if damping > 1e12:  # no step lowers the cost: x is the minimum to within rounding
                return x
        x, r, damping = trial, r_trial, max(damping / 10, 1e-12)
        done = max(abs(s) for s in step) < 1e-10 or cost - cost_trial <= 1e-15 * cost
        cost = cost_trial
        if done:
            break
    return x


def _squares(r: Sequence[float]) -> float:
    return sum(v * v for v in r)


def _evaluate(residuals: Residuals, x: Sequence[float]) -> tuple[list[float], float]:
    """The residuals at x and their cost; a step so long that they overflow costs infinitely (and is shortened)."""
    try:
        r = residuals(x)
    except (OverflowError, ZeroDivisionError):
        return [], math.inf
    return r, _squares(r)


def _jacobian(residuals: Residuals, x: Sequence[float], h: float = 1e-5) -> list[list[float]]:
    """d residual_k / d x_i, one row per residual."""
    columns = []
    for i in range(len(x)):
        up = [v + (h if j == i else 0.0) for j, v in enumerate(x)]
        down = [v - (h if j == i else 0.0) for j, v in enumerate(x)]
        columns.append([(a - b) / (2 * h) for a, b in zip(residuals(up), residuals(down))])
    return [list(row) for row in zip(*columns)]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a is small and, damped, positive definite)."""
    n = len(b)
    m = [list(row) + [bi] for row, bi in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda k: abs(m[k][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if m[col][col] == 0:
            continue  # a direction no residual moves: leave it where it is
        for k in range(col + 1, n):
            f = m[k][col] / m[col][col]
            m[k] = [a_k - f * a_c for a_k, a_c in zip(m[k], m[col])]
    x = [0.0] * n
    for i in reversed(range(n)):
        if m[i][i] != 0:
            x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


# --------------------------------------------------------------------------- auto.yaml
def yaml_with_constants(text: str, values: Mapping[str, float]) -> str:
    """auto.yaml's text with step_time's constants at `values` (dotted paths under step_time), its comments and
    layout kept: a value is replaced where it stands, on its key's own line (`key: 0.4`) or in the key's flow mapping
    (`key: {bf16: 0.7, fp8: 0.55}`). The result is read back and must hold exactly those values."""
    lines = text.splitlines(keepends=True)
    block, indent = _step_time_lines(lines)
    for path, value in values.items():
        head, _, sub = path.partition(".")
        i = next((i for i in block if re.match(rf"{indent}{re.escape(head)}:", lines[i])), None)
        if i is None:
            raise ValueError(f"step_time.{head} is not on a line of its own in auto.yaml")
        if sub:
            pattern = rf"([{{,]\s*{re.escape(sub)}:\s*)[^,}}\s]+"
        else:
            pattern = rf"^(\s*{re.escape(head)}:\s*)[^\s#]+"
        lines[i], count = re.subn(pattern, r"\g<1>" + _number(value), lines[i], count=1)
        if count != 1:
            raise ValueError(f"step_time.{path}'s value is not where auto.yaml's layout puts it: {lines[i].strip()}")
    out = "".join(lines)
    written = yaml.safe_load(out)["auto"]["step_time"]
    for path, value in values.items():
        if functools.reduce(lambda d, k: d[k], path.split("."), written) != value:
            raise ValueError(f"step_time.{path} did not read back as {value} from the rewritten auto.yaml")
    return out


def _step_time_lines(lines: list[str]) -> tuple[list[int], str]:
    """Indices of the lines inside auto.yaml's `step_time:` block (more indented than its key), and the indent of
    its keys (a deeper line, such as gpus' h100, is no key of step_time's)."""
    start = next(i for i, line in enumerate(lines) if re.match(r"\s*step_time:\s*$", line))
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for i in range(start + 1, len(lines)):
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent:
            break
        block.append(i)
    keys = next(lines[i] for i in block if lines[i].strip())
    return block, keys[: len(keys) - len(keys.lstrip())]


def _number(value: float) -> str:
    """A float as YAML reads back as a float: PyYAML takes 2.0e-05, not 2e-05."""
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}{e}{exponent}"
