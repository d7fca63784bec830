"""`strata "prompt"`: one chat completion streamed to a terminal, through the same engine loop."""
from __future__ import annotations

import sys
import threading

from protocol import messages as m

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy


class TerminalSink:
    """Takes the loop's messages directly (no protocol lines) and prints text as it arrives."""

    def __init__(self, tokenizer):
        self.stream, self.done = tokenizer.stream(), None

    def __call__(self, msg: m.Message) -> None:
        if isinstance(msg, m.Token):
            print(self.stream.step(msg.token), end="", flush=True)
        elif isinstance(msg, (m.Done, m.Err)):
            self.done = msg


def chat_once(runner, tokenizer, prompt: str, args) -> int:
    tokens = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": prompt}]))
    params = {"temperature": args.temperature} | ({"seed": args.seed} if args.seed is not None else {})
    sink = TerminalSink(tokenizer)
    loop = EngineLoop(runner, ParkPolicy(), sink)
    loop.inbox.put(m.Gen(args.max_tokens, tuple(tokens), params, 1))
    loop.inbox.put(m.Quit())
    thread = threading.Thread(target=loop.process)
    thread.start()
    interrupted = False
    try:
        while thread.is_alive():  # woken often: a Ctrl+C the OS hands to a worker (BLAS) thread is
            thread.join(0.1)      # only seen when the main thread runs, not while it sleeps in one join
    except KeyboardInterrupt:  # Ctrl+C: the answer stops at the next token, then a quiet exit
        interrupted = True
        loop.inbox.put(m.Stop())
        thread.join()
    print()
    if isinstance(sink.done, m.Err):
        print(f"strata: error: {sink.done.message}", file=sys.stderr)
        return 1
    return 130 if interrupted else 0
