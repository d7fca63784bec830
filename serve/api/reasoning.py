"""A thinking model's reasoning (<think>...</think>, Qwen3, QwQ, DeepSeek-R1) split from its answer,
as the peers return it: `reasoning_content` beside `content` (llama.cpp's --reasoning-format
deepseek, vLLM's reasoning parsers). Works on a stream of text pieces: a tag may arrive cut across
pieces, so text that could still be the start of a tag is held back until it is decided.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
REASONING, CONTENT = "reasoning_content", "content"


class ReasoningSplitter:
    """feed(piece) -> [(field, text)] with field REASONING or CONTENT; finish() flushes what is held.
    `opened`: the prompt itself ends inside <think> (the template opened it), so the output starts
    as reasoning."""

    def __init__(self, opened: bool = False):
        self.state = "think_open" if opened else "start"
        self.held = ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.held += piece
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":  # before any text: an opening tag (after whitespace) or the answer
                stripped = self.held.lstrip()
                if stripped.startswith(OPEN):
                    self.held, self.state = stripped[len(OPEN):], "think_open"
                    continue
                if OPEN.startswith(stripped):  # still possibly the tag (or only whitespace so far)
                    return out
                self.state = "content"
            if self.state == "think_open":  # the newlines after <think> are not part of the thought
                self.held = self.held.lstrip("\n")
                if not self.held:
                    return out
                self.state = "think"
            if self.state == "think":
                end = self.held.find(CLOSE)
                if end >= 0:
                    self.emit(out, REASONING, self.held[:end].rstrip("\n"))
                    self.held, self.state = self.held[end + len(CLOSE):], "after"
                    continue
                # hold back what may yet be "\n</think>": a partial tag and the newlines before it
                body = self.held[: len(self.held) - partial_tag(self.held, CLOSE)]
                ready = body.rstrip("\n")
                self.emit(out, REASONING, ready)
                self.held = self.held[len(ready):]
                return out
            if self.state == "after":  # the blank lines between </think> and the answer
                self.held = self.held.lstrip()
                if not self.held:
                    return out
                self.state = "content"
            self.emit(out, CONTENT, self.held)
            self.held = ""
            return out

    def finish(self) -> list[tuple[str, str]]:
        """The end of the output: held text goes where it stands (a thought cut off by max_tokens stays
        reasoning)."""
        out: list[tuple[str, str]] = []
        if self.held.strip():
            self.emit(out, REASONING if self.state.startswith("think") else CONTENT, self.held.rstrip("\n"))
        self.held = ""
        return out

    @staticmethod
    def emit(out: list[tuple[str, str]], field: str, text: str) -> None:
        if text:
            if out and out[-1][0] == field:
                out[-1] = (field, out[-1][1] + text)
            else:
                out.append((field, text))


def partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of text are the start of tag (they must wait for the next piece)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_all(text: str, opened: bool = False) -> dict[str, str]:
    """The whole output at once: {"reasoning_content": ..., "content": ...} (missing ones empty)."""
    splitter = ReasoningSplitter(opened)
    fields = {REASONING: "", CONTENT: ""}
    for field, part in splitter.feed(text) + splitter.finish():
        fields[field] += part
    return fields


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a <think> open (DeepSeek-R1-style templates start the
    reasoning themselves)."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)
