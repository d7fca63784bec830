"""tools/profiling/clients_split.py over a pool_bench result as the clients case writes it."""
import json

from tools.profiling import clients_split


def test_the_slowest_clients_time_outside_the_servers_count(tmp_path, capsys):
    run = {"ttft_p99_s": 1.084, "server_ttft_p99_s": 0.856,
           "slowest": {"ttft_s": 1.088, "sent_after_s": 0.014, "server_ttft_s": 0.801, "server_intake_s": 0.05,
                       "server_first_text_s": 0.82, "first_text_token": 2}}
    path = tmp_path / "pool.json"
    path.write_text(json.dumps({"strata": {"cases": {"clients": {"runs": [run, {"ttft_p99_s": 0.9}]}}}}))
    assert clients_split.main([str(path)]) == 0
    first, second = [json.loads(line.split(": ", 1)[1]) for line in capsys.readouterr().out.splitlines()]
    assert first["outside_s"] == 0.268 and first["intake_s"] == 0.05 and first["first_text_token"] == 2
    assert second["outside_s"] is None and second["ttft_p99_s"] == 0.9  # (a run without the server's timings)
