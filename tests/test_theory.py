"""Theory: Little's law and the CPU ceiling on hand-computed cases; the USL fit recovers known σ, κ."""

import math

import numpy as np
import pytest

from helpers.theory import (compare_prediction, cpu_ceiling_rps, fit_usl, knee_concurrency,
                            littles_law_latency_ms, littles_law_throughput_rps, predict_for_server,
                            predict_latency_ms, predict_throughput_rps, usl_throughput)


def test_littles_law_below_and_past_the_knee():
    # 32 slots each holding a request for 0.2 s: 8 clients -> 40 req/s, 64 clients -> capped at 160
    assert littles_law_throughput_rps(8, 32, 0.2) == pytest.approx(40.0)
    assert littles_law_throughput_rps(64, 32, 0.2) == pytest.approx(160.0)
    np.testing.assert_allclose(littles_law_throughput_rps([1, 8, 32, 64], 32, 0.2), [5, 40, 160, 160])
    # past the knee latency = N / X: 64 / 160 = 0.4 s, twice the service time
    assert littles_law_latency_ms(64, 160.0, 0.2) == pytest.approx(400.0)
    assert littles_law_latency_ms(8, 40.0, 0.2) == pytest.approx(200.0)
    np.testing.assert_allclose(predict_latency_ms([1, 32, 64, 128], 32, 0.2), [200, 200, 400, 800])
    assert knee_concurrency(32, 0.2) == pytest.approx(32.0)


def test_cpu_ceiling_and_the_gil():
    assert cpu_ceiling_rps(20, 2) == pytest.approx(100.0)  # 2 cores / 0.02 s
    assert cpu_ceiling_rps(20, 2, processes=1) == pytest.approx(50.0)  # one process, one GIL
    assert cpu_ceiling_rps(20, 2, processes=4) == pytest.approx(100.0)  # more workers than cores
    # 1 worker x 4 threads on /cpu?ms=20: Little's law says 200 req/s, the GIL caps it at 50
    assert predict_throughput_rps(4, 4, 0.02, cpu_ms_per_request=20, effective_cores=2, processes=1) == 50.0
    # ... so 4 clients see 4 / 50 = 80 ms each instead of 20 ms
    assert predict_latency_ms(4, 4, 0.02, 20, 2, 1) == pytest.approx(80.0)
    assert knee_concurrency(4, 0.02, 20, 2, 1) == pytest.approx(1.0)


def test_predict_for_server_reads_the_config():
    gthread = {"server": "gunicorn", "workers": 1, "threads": 4, "worker_class": "gthread", "slots": 4}
    out = predict_for_server(gthread, [1, 4], 0.02, cpu_ms_per_request=20, effective_cores=2)
    np.testing.assert_allclose(out["throughput_rps"], [50, 50])
    np.testing.assert_allclose(out["latency_ms"], [20, 80])
    sync2 = {"server": "gunicorn", "workers": 2, "threads": 1, "worker_class": "sync", "slots": 2}
    out = predict_for_server(sync2, [4], 0.02, cpu_ms_per_request=20, effective_cores=2)
    np.testing.assert_allclose(out["throughput_rps"], [100])


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        littles_law_throughput_rps(4, 4, 0)
    with pytest.raises(ValueError):
        cpu_ceiling_rps(0, 2)
    with pytest.raises(ValueError):
        fit_usl([4, 4, 4], [10, 11, 12])


@pytest.mark.parametrize("sigma,kappa", [(0.05, 0.002), (0.2, 0.0), (0.0, 0.0), (0.02, 0.01)])
def test_usl_fit_recovers_known_parameters(sigma, kappa):
    n = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
    x = usl_throughput(n, 50.0, sigma, kappa)
    fit = fit_usl(n, x)
    assert fit.sigma == pytest.approx(sigma, abs=0.002)
    assert fit.kappa == pytest.approx(kappa, abs=2e-4)
    assert fit.lam == pytest.approx(50.0, rel=0.01)
    assert fit.r2 > 0.999


def test_usl_fit_with_noise_and_repeats():
    rng = np.random.default_rng(7)
    n = np.repeat([1, 2, 4, 8, 16, 32], 3)
    x = usl_throughput(n, 100.0, 0.08, 0.001) * rng.normal(1.0, 0.03, n.size)
    fit = fit_usl(n, x)
    assert 0.05 <= fit.sigma <= 0.11
    assert 0.0 <= fit.kappa <= 0.003
    assert 90 <= fit.lam <= 110
    np.testing.assert_allclose(fit.predict([1, 8]), usl_throughput([1, 8], fit.lam, fit.sigma, fit.kappa))


def test_usl_sentence_reads_the_numbers():
    n = np.array([1, 2, 4, 8, 16, 32, 64])
    fit = fit_usl(n, usl_throughput(n, 100.0, 0.05, 0.002))
    assert "σ=0.05" in fit.sentence and "5%" in fit.sentence
    assert "peak" in fit.sentence
    expected_peak = math.sqrt(0.95 / 0.002)
    assert fit.peak_n == pytest.approx(expected_peak, rel=0.02)
    assert str(fit) == fit.sentence
    linear = fit_usl([1, 2, 4], [10, 20, 40])
    assert "σ≈0" in linear.sentence and "κ≈0" in linear.sentence
    two_points = fit_usl([1, 2], [50, 90])  # κ fixed at 0 with two distinct N
    assert two_points.kappa == 0 and two_points.sigma == pytest.approx(1 / 9, abs=0.005)


def test_compare_prediction_number_and_list():
    gap = compare_prediction(50, 45, unit="req/s", what="throughput")
    assert gap.gap == pytest.approx(-5) and gap.ratio == pytest.approx(0.9)
    assert "10% below" in gap.sentence and "req/s" in gap.sentence
    far = compare_prediction(10, 100)
    assert far.ratio == pytest.approx(10) and "far off" in far.sentence
    many = compare_prediction([5, 40, 160], [5, 40, 80], unit="req/s")
    np.testing.assert_allclose(many.gap, [0, 0, -80])
    assert "point 3" in many.sentence
    with pytest.raises(ValueError):
        compare_prediction([1, 2], [1, 2, 3])
