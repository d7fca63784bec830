"""An idle engine captures its decode graphs ahead of their use (engine/loop/ahead_captures.py), one at a time while
no line comes, and a request that comes meanwhile is served at once. The loop in this process over the mock engine's
runner, with a stand-in for the GPU's graph decoder (engine/runner/decode_graph.py capture_ahead runs on the device:
tools/device/gpu_run.sh gpucheck); the decoder's own list of graphs ahead is checked on its own."""
import threading
import time

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from engine.mock_engine import FakeRunner, build_parser
from engine.runner.decode_graph import GraphDecoder
from engine.runner.graph_pool import GraphMemoryError
from protocol import messages as m


class StandInDecoder:
    """ahead / capture_ahead as the graph decoder's, over a list of keys, each capture put in `events`; `fails` at
    that capture; `arrives(n)` called after the n-th capture (a line that comes while the engine captures)."""

    def __init__(self, keys: int, events: list, fails: int | None = None, arrives=lambda n: None):
        self.keys, self.events, self.fails, self.captured, self.arrives = keys, events, fails, [], arrives

    def ahead(self, max_rows: int) -> list[int]:
        return list(range(len(self.captured), self.keys))

    def capture_ahead(self, max_rows: int) -> None:
        if len(self.captured) == self.fails:
            raise GraphMemoryError("no device memory for 1,024 bytes of CUDA graph temporaries")
        self.captured.append(self.ahead(max_rows)[0])
        self.events.append(f"capture {self.captured[-1]}")
        self.arrives(len(self.captured))


def serve(keys: int, gen: m.Gen, fails: int | None = None) -> list:
    """The events of the loop over the mock runner with a stand-in decoder of `keys` graphs: gen arriving during the
    second capture (in the inbox before the loop looks again, whatever the machine's load), QUIT once the captures
    have ended (or after 10 s)."""
    runner = FakeRunner(build_parser().parse_args(["--chunk-s", "0", "--token-s", "0"]), lambda line: None)
    events = []
    runner.decoder = StandInDecoder(keys, events, fails, lambda n: loop.inbox.put(gen) if n == 2 else None)
    loop = EngineLoop(runner, ParkPolicy(), events.append)

    def quit_after_the_captures():
        deadline = time.monotonic() + 10
        while loop.ahead.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        loop.inbox.put(m.Quit())

    threading.Thread(target=quit_after_the_captures, daemon=True).start()
    loop.process()
    return [e if isinstance(e, str) else type(e).__name__ for e in events if isinstance(e, (str, m.Done, m.Token))]


def test_an_idle_engine_captures_every_graph_ahead_one_at_a_time_and_serves_a_request_that_comes():
    assert serve(5, m.Gen(2, (5, 6, 7), {}, 1)) == ["capture 0", "capture 1", "Token", "Token", "Done", "capture 2",
                                                    "capture 3", "capture 4"]


def test_a_capture_that_does_not_fit_ends_the_captures_ahead_and_requests_are_served():
    assert serve(5, m.Gen(2, (5, 6), {}, 1), fails=2) == ["capture 0", "capture 1", "Token", "Token", "Done"]


def test_the_graphs_ahead_are_the_small_batches_at_the_small_buckets_smaller_first():
    class Kv:
        ctx = 6000

    decoder = GraphDecoder.__new__(GraphDecoder)  # ahead() reads only these (the constructor needs a GPU)
    decoder.kv, decoder.pad_block, decoder.captured = Kv(), 7, {(1, 1024): None}
    assert decoder.ahead(max_rows=8) == [(2, 1024), (4, 1024), (8, 1024), (1, 2048), (2, 2048), (4, 2048),
                                         (8, 2048), (1, 4096), (2, 4096), (4, 4096), (8, 4096), (1, 6000),
                                         (2, 6000), (4, 6000), (8, 6000)]
    assert len(decoder.ahead(max_rows=256)) == 19  # batch sizes to 16 at four buckets, one captured
    decoder.pad_block = None  # (no padding rows: each batch size is captured as it comes)
    assert decoder.ahead(max_rows=8) == []
