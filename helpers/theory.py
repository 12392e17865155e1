"""Back-of-the-envelope models to hold a measurement against: Little's law, the CPU ceiling, the USL.

Introduced in lesson 03 (Little's law and the CPU ceiling); lesson 05 fits the Universal
Scalability Law. Everything here is a pure function of numbers (numpy only), so a plot
or a notebook can draw a prediction next to a measurement without touching a server.

    >>> predict_throughput_rps(concurrency=8, slots=32, service_time_s=0.2)
    40.0
    >>> cpu_ceiling_rps(cpu_ms_per_request=20, effective_cores=2)
    100.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "littles_law_throughput_rps", "littles_law_latency_ms", "cpu_ceiling_rps", "knee_concurrency",
    "predict_throughput_rps", "predict_latency_ms", "predict_for_server",
    "usl_throughput", "fit_usl", "USLFit", "compare_prediction", "PredictionGap",
]


def _out(value):
    """A plain float for scalar input, an array otherwise."""
    arr = np.asarray(value, dtype=float)
    return float(arr) if arr.ndim == 0 else arr


def littles_law_throughput_rps(concurrency, slots, service_time_s):
    """Throughput when requests only wait: min(concurrency, slots) / service time.

    Lesson 03. Each of `slots` (workers x threads) can hold one request for
    `service_time_s`; more clients than slots only queue. Works on arrays too.
    """
    n = np.asarray(concurrency, dtype=float)
    s = np.asarray(service_time_s, dtype=float)
    if np.any(s <= 0):
        raise ValueError(f"service_time_s must be positive, got {service_time_s!r}.")
    return _out(np.minimum(n, np.asarray(slots, dtype=float)) / s)


def littles_law_latency_ms(concurrency, throughput_rps, service_time_s=None):
    """Latency a closed loop of `concurrency` clients sees at `throughput_rps`: N / X (Little's law).

    Lesson 03. With `service_time_s`, never less than the service time itself, so the
    curve is flat below the knee and climbs in proportion to concurrency past it.
    """
    n = np.asarray(concurrency, dtype=float)
    x = np.asarray(throughput_rps, dtype=float)
    latency_ms = n / x * 1000.0
    if service_time_s is not None:
        latency_ms = np.maximum(latency_ms, np.asarray(service_time_s, dtype=float) * 1000.0)
    return _out(latency_ms)


def cpu_ceiling_rps(cpu_ms_per_request, effective_cores, processes=None):
    """Most requests per second the CPU allows: usable cores / CPU seconds per request.

    Lesson 03. Python threads share one GIL, so a server can use at most one core per
    process: pass `processes` (gunicorn workers) and the usable cores are
    min(effective_cores, processes).
    """
    cpu_s = np.asarray(cpu_ms_per_request, dtype=float) / 1000.0
    if np.any(cpu_s <= 0):
        raise ValueError(f"cpu_ms_per_request must be positive, got {cpu_ms_per_request!r}.")
    cores = np.asarray(effective_cores, dtype=float)
    if processes is not None:
        cores = np.minimum(cores, np.asarray(processes, dtype=float))
    return _out(cores / cpu_s)


def predict_throughput_rps(concurrency, slots, service_time_s, cpu_ms_per_request=None,
                           effective_cores=None, processes=None):
    """Predicted throughput: Little's law, capped by the CPU ceiling when CPU figures are given.

    Lesson 03. `service_time_s` is one request's time in the handler with no competition
    (e.g. 0.2 for /io?ms=200, 0.02 for /cpu?ms=20).
    """
    x = np.asarray(littles_law_throughput_rps(concurrency, slots, service_time_s), dtype=float)
    if cpu_ms_per_request is not None and effective_cores is not None:
        x = np.minimum(x, cpu_ceiling_rps(cpu_ms_per_request, effective_cores, processes))
    return _out(x)


def predict_latency_ms(concurrency, slots, service_time_s, cpu_ms_per_request=None,
                       effective_cores=None, processes=None):
    """Predicted mean latency of a closed loop: the service time, or N / X once past the knee.

    Lesson 03.
    """
    x = predict_throughput_rps(concurrency, slots, service_time_s, cpu_ms_per_request,
                               effective_cores, processes)
    return littles_law_latency_ms(concurrency, x, service_time_s)


def knee_concurrency(slots, service_time_s, cpu_ms_per_request=None, effective_cores=None, processes=None):
    """Concurrency where throughput stops growing and latency starts to climb.

    Lesson 03. Little's law: the knee is (maximum throughput) x (service time); for waiting
    work that is simply `slots`, for CPU-bound work it is cores x service time / CPU time.
    """
    x_max = predict_throughput_rps(np.inf, slots, service_time_s, cpu_ms_per_request,
                                   effective_cores, processes)
    return _out(np.asarray(x_max) * np.asarray(service_time_s, dtype=float))


def predict_for_server(server_config: dict, concurrency, service_time_s, cpu_ms_per_request=None,
                       effective_cores=None) -> dict:
    """Predicted throughput and latency for one DemoServer config (a run's config["server"]).

    Lesson 03. Reads slots and workers from the config; returns a dict with
    concurrency, throughput_rps, latency_ms and knee_concurrency.
    """
    slots = server_config.get("slots") or server_config.get("workers", 1) * server_config.get("threads", 1)
    processes = 1 if server_config.get("server") == "flask-dev" else server_config.get("workers", 1)
    n = np.asarray(concurrency, dtype=float)
    x = predict_throughput_rps(n, slots, service_time_s, cpu_ms_per_request, effective_cores, processes)
    return {"concurrency": _out(n), "throughput_rps": x,
            "latency_ms": littles_law_latency_ms(n, x, service_time_s),
            "knee_concurrency": knee_concurrency(slots, service_time_s, cpu_ms_per_request,
                                                 effective_cores, processes)}


# ---- Universal Scalability Law -----------------------------------------------------------

def usl_throughput(n, lam, sigma, kappa):
    """Throughput the Universal Scalability Law predicts: X(N) = λN / (1 + σ(N−1) + κN(N−1)).

    Lesson 05. λ is the throughput of one unit (worker, thread or client), σ the share
    of work that serialises (contention), κ the cost of units coordinating (coherency).
    """
    n = np.asarray(n, dtype=float)
    return _out(lam * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0)))


@dataclass
class USLFit:
    """Result of fit_usl: σ, κ, λ, the peak and a sentence that reads them (lesson 05)."""

    sigma: float
    kappa: float
    lam: float
    r2: float
    n_points: int
    unit: str = "worker"
    peak_n: float = math.inf
    peak_rps: float = math.nan
    sentence: str = field(default="", repr=False)

    def predict(self, n):
        """Throughput (req/s) the fitted curve gives at `n` units."""
        return usl_throughput(n, self.lam, self.sigma, self.kappa)

    def as_dict(self) -> dict:
        """The fitted numbers as a plain dict (to store next to a sweep)."""
        return {"sigma": self.sigma, "kappa": self.kappa, "lam": self.lam, "r2": self.r2,
                "n_points": self.n_points, "peak_n": self.peak_n, "peak_rps": self.peak_rps,
                "sentence": self.sentence}

    def __str__(self) -> str:
        return self.sentence


def _usl_sse(n, x, sigma, kappa):
    """Squared error of the best λ for each (σ, κ); λ is linear so it is solved exactly."""
    denom = 1.0 + sigma[..., None] * (n - 1.0) + kappa[..., None] * n * (n - 1.0)
    f = n / denom
    lam = (f @ x) / np.einsum("...i,...i->...", f, f)
    resid = x - lam[..., None] * f
    return np.einsum("...i,...i->...", resid, resid), lam


def fit_usl(n, throughput_rps, unit: str = "worker", fix_kappa: float | None = None) -> USLFit:
    """Fit the Universal Scalability Law to measured throughput vs workers, threads or clients.

    Lesson 05. Least squares on the throughput itself (numpy only): λ is solved exactly
    for every (σ, κ), which are searched on a grid and then refined by zooming in,
    both kept within their meaningful ranges (0 ≤ σ ≤ 1, κ ≥ 0). With only two distinct
    N, κ is fixed at 0. Returns a USLFit whose `sentence` says what the numbers mean.
    """
    n = np.asarray(n, dtype=float).ravel()
    x = np.asarray(throughput_rps, dtype=float).ravel()
    if n.shape != x.shape:
        raise ValueError("n and throughput_rps must have the same length.")
    keep = np.isfinite(n) & np.isfinite(x) & (n >= 1) & (x >= 0)
    n, x = n[keep], x[keep]
    distinct = len(np.unique(n))
    if distinct < 2:
        raise ValueError("fitting the USL needs throughput at two or more different N.")
    if distinct == 2 and fix_kappa is None:
        fix_kappa = 0.0

    sigmas = np.linspace(0.0, 1.0, 201)
    kappas = np.array([fix_kappa]) if fix_kappa is not None else np.concatenate([[0.0], np.logspace(-7, 0, 141)])
    grid_s, grid_k = np.meshgrid(sigmas, kappas, indexing="ij")
    sse, _ = _usl_sse(n, x, grid_s, grid_k)
    i, j = np.unravel_index(np.nanargmin(sse), sse.shape)
    best_s, best_k = grid_s[i, j], grid_k[i, j]
    span_s = 0.01
    span_k = max(best_k, 1e-7)
    for _ in range(40):  # zoom in around the best point, halving the window each time
        cand_s = np.clip(np.linspace(best_s - span_s, best_s + span_s, 21), 0.0, 1.0)
        if fix_kappa is not None:
            cand_k = np.array([fix_kappa])
        else:
            cand_k = np.clip(np.linspace(best_k - span_k, best_k + span_k, 21), 0.0, None)
        gs, gk = np.meshgrid(cand_s, cand_k, indexing="ij")
        sse, _ = _usl_sse(n, x, gs, gk)
        i, j = np.unravel_index(np.nanargmin(sse), sse.shape)
        best_s, best_k = gs[i, j], gk[i, j]
        span_s *= 0.6
        span_k *= 0.6
    sse_best, lam = _usl_sse(n, x, np.array(best_s), np.array(best_k))
    sse_best, lam = float(sse_best), float(lam)
    total = float(((x - x.mean()) ** 2).sum())
    r2 = 1.0 - sse_best / total if total > 0 else 1.0
    fit = USLFit(sigma=float(best_s), kappa=float(best_k), lam=lam, r2=r2, n_points=len(n), unit=unit)
    if fit.kappa > 0:
        fit.peak_n = math.sqrt(max(1.0 - fit.sigma, 0.0) / fit.kappa)
        fit.peak_rps = float(usl_throughput(fit.peak_n, lam, fit.sigma, fit.kappa))
    elif fit.sigma > 0:
        fit.peak_rps = lam / fit.sigma  # the asymptote: approached, never passed
    fit.sentence = _usl_sentence(fit)
    return fit


def _usl_sentence(fit: USLFit) -> str:
    parts = []
    if fit.sigma < 0.005:
        parts.append(f"contention σ≈0: nothing serialises, each {fit.unit} adds λ={fit.lam:.3g} req/s")
    else:
        parts.append(f"contention σ={fit.sigma:.2f}: about {fit.sigma:.0%} of the work serialises "
                     f"(one {fit.unit} alone gives λ={fit.lam:.3g} req/s)")
    if fit.kappa < 1e-4:
        parts.append("coherency κ≈0: no crosstalk")
    else:
        parts.append(f"coherency κ={fit.kappa:.2g}: {fit.unit}s pay to coordinate, so adding more eventually hurts")
    if fit.kappa > 0 and math.isfinite(fit.peak_n):
        parts.append(f"peak ≈{fit.peak_rps:.3g} req/s at N≈{fit.peak_n:.0f} {fit.unit}s")
    elif fit.sigma >= 0.005:
        parts.append(f"no peak: throughput levels off towards λ/σ ≈ {fit.peak_rps:.3g} req/s")
    else:
        parts.append("no peak within reach: scaling stays linear")
    quality = "" if fit.r2 >= 0.9 else f" (poor fit, R²={fit.r2:.2f}: the USL may not describe this curve)"
    return "; ".join(parts) + quality + "."


# ---- predictions against measurements ---------------------------------------------------

@dataclass
class PredictionGap:
    """How far a learner's prediction was from the measurement (lesson 01 onward)."""

    prediction: object
    measured: object
    gap: object  # measured − prediction
    ratio: object  # measured / prediction
    sentence: str

    def __str__(self) -> str:
        return self.sentence


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _closeness(ratio: float) -> str:
    if not math.isfinite(ratio):
        return "no comparison possible"
    if abs(ratio - 1.0) <= 0.10:
        return "close"
    if 0.5 <= ratio <= 2.0:
        return "off"
    return "far off"


def compare_prediction(prediction, measured, unit: str = "", what: str = "") -> PredictionGap:
    """Compare a stored prediction (a number or a list) with the measurement; a gap and a sentence.

    Lesson 01. For lists (one prediction per load point) the gap and ratio are arrays and
    the sentence names the typical and the worst miss.
    """
    p = np.asarray(prediction, dtype=float)
    m = np.asarray(measured, dtype=float)
    if p.shape != m.shape:
        raise ValueError(f"prediction has {p.size} value(s) but the measurement has {m.size}.")
    gap = m - p
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p != 0, m / p, np.nan)
    u = f" {unit}" if unit else ""
    lead = f"{what}: " if what else ""
    if p.ndim == 0:
        r = float(ratio)
        if math.isfinite(r):
            direction = "above" if r > 1 else "below"
            how = (f"{abs(r - 1):.0%} {direction} it" if 0.5 <= r <= 2 else f"{r:.2g}× it")
        else:
            how = "your prediction was zero"
        sentence = (f"{lead}you predicted {_fmt(float(p))}{u}, measured {_fmt(float(m))}{u}: "
                    f"{how} ({_closeness(r)}).")
        return PredictionGap(float(p), float(m), float(gap), r, sentence)
    log_miss = np.abs(np.log(np.where(ratio > 0, ratio, np.nan)))
    if np.all(np.isnan(log_miss)):
        sentence = f"{lead}no point could be compared (a prediction or measurement was zero)."
    else:
        worst = int(np.nanargmax(log_miss))
        typical = float(np.exp(np.nanmedian(log_miss)))
        sentence = (f"{lead}over {p.size} points your predictions were typically off by a factor "
                    f"{typical:.2f}; worst at point {worst + 1}: predicted {_fmt(p.flat[worst])}{u}, "
                    f"measured {_fmt(m.flat[worst])}{u} ({_closeness(float(ratio.flat[worst]))}).")
    return PredictionGap(p, m, gap, ratio, sentence)
