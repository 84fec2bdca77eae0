"""Chi-square machinery for the weight-ratio property (no scipy): the central chi-square tail and its
critical values, the power of Pearson's goodness-of-fit test against Cohen's effect size w, the sample
size that power asks for, and the test itself.

Everything is computed in float64 with ``torch.special.gammaincc`` (the regularized upper incomplete
gamma function Q): the chi-square survival function is ``Q(df / 2, x / 2)``, and the noncentral one a
Poisson mixture of central tails, ``sum_j Pois(j; lambda / 2) Q(df / 2 + j, x / 2)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = [
    "binomial_p_value",
    "binomial_range",
    "chi2_sf",
    "chi2_critical",
    "noncentral_chi2_sf",
    "chi_square_power",
    "required_n",
    "cohen_w",
    "ChiSquare",
    "chi_square_test",
    "COCHRAN_MIN_EXPECTED",
]

#: Cochran's rule: Pearson's statistic is close enough to chi-square when every expected count is >= 5.
COCHRAN_MIN_EXPECTED = 5.0


def _check_df(df: float) -> None:
    if not (df > 0 and math.isfinite(df)):
        raise ValueError(f"degrees of freedom must be a positive number, got {df!r}")


def chi2_sf(x: float, df: float) -> float:
    """P(X > x) for X ~ chi-square(df). ``x <= 0`` gives 1."""
    _check_df(df)
    if x <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(x / 2.0, dtype=torch.float64)))


def chi2_critical(alpha: float, df: float) -> float:
    """The x with ``chi2_sf(x, df) == alpha`` (the test's rejection threshold), by bisection to
    relative precision 1e-12."""
    _check_df(df)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    low, high = 0.0, max(1.0, float(df))
    while chi2_sf(high, df) > alpha:
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        if chi2_sf(middle, df) > alpha:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


def noncentral_chi2_sf(x: float, df: float, noncentrality: float) -> float:
    """P(X > x) for X ~ noncentral chi-square(df, lambda=noncentrality), as the Poisson(lambda / 2)
    mixture of central tails with df + 2j degrees of freedom (terms to 15 standard deviations past the
    Poisson mean, far beyond float64 resolution)."""
    _check_df(df)
    if noncentrality < 0:
        raise ValueError(f"noncentrality must be >= 0, got {noncentrality!r}")
    if noncentrality == 0:
        return chi2_sf(x, df)
    if x <= 0:
        return 1.0
    half = noncentrality / 2.0
    last = int(half + 15.0 * math.sqrt(half) + 30)
    j = torch.arange(last + 1, dtype=torch.float64)
    log_weights = -half + j * math.log(half) - torch.lgamma(j + 1)
    tails = torch.special.gammaincc(df / 2.0 + j, torch.full_like(j, x / 2.0))
    return float(min(1.0, (log_weights.exp() * tails).sum().item()))


def chi_square_power(n: int, k: int, *, w: float = 0.05, alpha: float = 1e-6) -> float:
    """Power of Pearson's goodness-of-fit test over ``k`` categories with ``n`` draws at level ``alpha``
    against an alternative of Cohen's effect size ``w`` (noncentrality ``n * w**2``, df ``k - 1``)."""
    if k < 2:
        raise ValueError(f"a goodness-of-fit test needs at least 2 categories, got {k}")
    return noncentral_chi2_sf(chi2_critical(alpha, k - 1), k - 1, n * w * w)


def required_n(k: int, alpha: float = 1e-6, power: float = 0.99, w: float = 0.05) -> int:
    """The smallest number of draws for which the test over ``k`` categories at level ``alpha`` detects
    an effect of Cohen's ``w`` with probability at least ``power`` (k=2: 20,840; k=4: 23,784;
    k=8: 27,413 at the defaults)."""
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    if w <= 0:
        raise ValueError(f"effect size w must be > 0, got {w!r}")
    critical = chi2_critical(alpha, k - 1)

    def enough(n: int) -> bool:
        return noncentral_chi2_sf(critical, k - 1, n * w * w) >= power

    low, high = 0, 1
    while not enough(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return high


def _probabilities(weights: Sequence[float]) -> list[float]:
    if not weights:
        raise ValueError("weights must not be empty")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"weights must be finite and >= 0, got {list(weights)}")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must not all be 0, got {list(weights)}")
    return [w / total for w in weights]


def cohen_w(fractions: Sequence[float], weights: Sequence[float]) -> float:
    """Cohen's effect size ``sqrt(sum (p1 - p0)^2 / p0)`` of the fractions ``p1`` against the
    normalized ``weights`` ``p0`` (cells of weight 0 must have fraction 0)."""
    expected = _probabilities(weights)
    if len(fractions) != len(expected):
        raise ValueError(f"{len(fractions)} fractions for {len(expected)} weights")
    total = 0.0
    for p1, p0 in zip(fractions, expected, strict=True):
        if p0 == 0:
            if p1 != 0:
                return math.inf
            continue
        total += (p1 - p0) ** 2 / p0
    return math.sqrt(total)


class ChiSquare(NamedTuple):
    """Pearson's statistic and its p-value (unpacks as ``statistic, p_value``)."""

    statistic: float
    p_value: float


def chi_square_test(counts: Sequence[int], weights: Sequence[float]) -> ChiSquare:
    """Pearson's chi-square goodness of fit of ``counts`` to the proportions ``weights`` (normalized
    here), with ``k - 1`` degrees of freedom over the cells of positive weight.

    A count in a cell of weight 0 gives an infinite statistic and p 0. Raises ``ValueError`` when an
    expected count is below 5 (Cochran's rule: then the chi-square approximation is not trustworthy;
    draw more samples), or when fewer than two cells have positive weight.
    """
    expected_p = _probabilities(weights)
    if len(counts) != len(expected_p):
        raise ValueError(f"{len(counts)} counts for {len(expected_p)} weights")
    if any(c < 0 for c in counts):
        raise ValueError(f"counts must be >= 0, got {list(counts)}")
    n = int(sum(counts))
    cells = [(c, p * n) for c, p in zip(counts, expected_p, strict=True) if p > 0]
    if len(cells) < 2:
        raise ValueError("a goodness-of-fit test needs at least 2 cells of positive weight")
    if any(c > 0 and p == 0 for c, p in zip(counts, expected_p, strict=True)):
        return ChiSquare(math.inf, 0.0)
    low = [
        (i, p * n)
        for i, (c, p) in enumerate(zip(counts, expected_p, strict=True))
        if p > 0 and p * n < COCHRAN_MIN_EXPECTED
    ]
    if low:
        shown = ", ".join(f"cell {i}: {e:.2f}" for i, e in low)
        raise ValueError(
            f"expected counts below {COCHRAN_MIN_EXPECTED:g} ({shown}; n={n}): Cochran's rule fails, the "
            "chi-square approximation does not hold; draw more samples"
        )
    statistic = sum((c - e) ** 2 / e for c, e in cells)
    return ChiSquare(statistic, chi2_sf(statistic, len(cells) - 1))


def _log_pmf(n: int, k: int, p: float) -> float:
    if p <= 0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1:
        return 0.0 if k == n else -math.inf
    return (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )


def binomial_p_value(successes: int, trials: int, rate: float) -> float:
    """Two-sided exact binomial test: the probability, at ``rate``, of a count no more likely than
    ``successes`` in ``trials``."""
    if trials <= 0:
        return 1.0
    observed = _log_pmf(trials, successes, rate)
    total = 0.0
    for k in range(trials + 1):
        value = _log_pmf(trials, k, rate)
        if value <= observed + 1e-9:
            total += math.exp(value)
    return min(1.0, total)


def binomial_range(trials: int, rate: float, alpha: float) -> tuple[int, int]:
    """The counts in ``trials`` draws at ``rate`` that the two-sided test at ``alpha`` accepts."""
    accepted = [k for k in range(trials + 1) if binomial_p_value(k, trials, rate) >= alpha]
    return (min(accepted), max(accepted)) if accepted else (0, trials)
