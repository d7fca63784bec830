"""bench/pool_bench.py's medians over repeated runs: a run that got no answer (a synthetic model's tokens that show
no text, a refused prompt) leaves its first-token times out, and the other runs' still make the median."""
from bench.pool_bench import medians


def test_a_run_without_an_answer_leaves_the_others_medians():
    failed = {"answered": 0, "ttft_p50_s": None, "aggregate_tok_s": 0.0, "ok": False}
    good = [{"answered": 1, "ttft_p50_s": 1.0, "aggregate_tok_s": 4.0}, {"answered": 1, "ttft_p50_s": 2.0,
                                                                         "aggregate_tok_s": 6.0}]
    m = medians([failed, *good])
    assert m["ttft_p50_s"] == 1.5 and m["answered"] == 1 and m["aggregate_tok_s"] == 4.0
    assert "ok" not in m  # (flags are not figures)
    assert medians([failed])["ttft_p50_s"] is None
