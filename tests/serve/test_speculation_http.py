"""Speculative decoding as a user turns it on (`--speculative auto`: n-grams without --draft; drafted rows taken
as free, so that drafts are made on a CPU, where a row costs nearly a step): through the API a greedy answer
is the text of a server without it, its timings say what was drafted and accepted, and /metrics counts
them (strata_spec_drafted_tokens_total, strata_spec_accepted_tokens_total), as does the live view's stream."""
import httpx

from tests.harness import ServerProcess
from tests.serve.helpers import metrics, state_events

CODE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n"
PROMPT = f"Copy this code exactly:\n{CODE}\nHere it is:\n{CODE[:30]}"


def complete(server) -> dict:
    r = httpx.post(server.url + "/v1/completions", timeout=120,
                   json={"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "seed": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_drafts_leave_the_text_as_it_was_and_are_counted():
    with ServerProcess(extra=["--device", "cpu", "--ctx", "1024"]) as plain:
        want = complete(plain)["choices"][0]["text"]
        assert "strata_spec_drafted_tokens_total" in metrics(plain.url)  # the counter exists, at 0
    with ServerProcess(extra=["--device", "cpu", "--ctx", "1024", "--speculative", "auto",
                                "--draft-row-cost", "0"]) as server:  # (every draft made: on a CPU few would pay)
        got = complete(server)
        assert got["choices"][0]["text"] == want
        timings = got["timings"]
        assert 0 < timings["accepted_tokens"] <= timings["drafted_tokens"]
        counts = metrics(server.url)
        assert counts["strata_spec_drafted_tokens_total"] == timings["drafted_tokens"]
        assert counts["strata_spec_accepted_tokens_total"] == timings["accepted_tokens"]
        totals = state_events(server.url, 0.1)[-1][1]["totals"]  # the live view's
        assert (totals["drafted"], totals["accepted"]) == (timings["drafted_tokens"], timings["accepted_tokens"])
