"""An engine's pool reports as the server reads them (serve/scheduling/pool_report.py, metrics.py): the expert
cache's counts turned into what moved since the last report (a restarted engine counting from 0 again), and its
summary for /status, one engine's and several engines' together."""
from protocol import messages as m

from serve.scheduling.metrics import expert_summary, experts_together
from serve.scheduling.pool_report import PoolReport


def report(**counts) -> m.Info:
    return m.Info({f"pool_{k}": str(v) for k, v in counts.items()})


def test_the_expert_cache_s_counts_move_by_what_each_report_adds_and_from_0_after_a_restart():
    pool = PoolReport()
    assert pool.on_pool(report(used=3, free=5)) == {}  # no cache
    assert pool.on_pool(report(expert_slots=6, expert_hits=10, expert_misses=4, expert_bytes=400,
                               expert_tokens=7)) == {"expert_hits": 10, "expert_misses": 4, "expert_bytes": 400,
                                                     "expert_tokens": 7}
    assert pool.on_pool(report(expert_hits=15, expert_misses=4, expert_bytes=400, expert_tokens=9)) == {
        "expert_hits": 5, "expert_misses": 0, "expert_bytes": 0, "expert_tokens": 2}
    pool.engine_gone()
    assert pool.on_pool(report(expert_hits=2, expert_misses=1, expert_bytes=100, expert_tokens=1)) == {
        "expert_hits": 2, "expert_misses": 1, "expert_bytes": 100, "expert_tokens": 1}


def test_status_shows_the_cache_s_rates_and_several_engines_summed():
    one = expert_summary({"used": 1, "expert_slots": 6, "expert_layers": 2, "expert_hits": 30, "expert_misses": 10,
                          "expert_bytes": 1000, "expert_tokens": 4})
    assert one["used"] == 1 and set(one) == {"used", "expert_cache"}  # the raw counts folded in
    assert one["expert_cache"] == {"slots": 6, "layers": 2, "hits": 30, "misses": 10, "hit_rate": 0.75,
                                   "bytes_copied": 1000, "tokens": 4, "bytes_per_token": 250}
    assert expert_summary({"used": 1}) == {"used": 1}
    raw = {"expert_slots": 6, "expert_layers": 2, "expert_hits": 30, "expert_misses": 10, "expert_bytes": 1000,
           "expert_tokens": 4}
    two = experts_together([raw, raw | {"expert_hits": 10, "expert_misses": 30}, {"used": 3}])
    assert two["expert_cache"]["hit_rate"] == 0.5 and two["expert_cache"]["slots"] == 12
    assert experts_together([]) == {}
