"""Stop strings over streamed text: hold back what could still become a stop string."""
from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.hit = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Returns the text that is safe to emit now; sets `hit` once a stop string appears."""
        if not self.stops:
            return text
        self.held += text
        found = [(i, s) for s in self.stops if (i := self.held.find(s)) >= 0]
        if found:  # the earliest stop string ends the text
            (cut, self.matched), self.hit = min(found), True
            out, self.held = self.held[:cut], ""
            return out
        keep = max((k for s in self.stops for k in range(1, len(s)) if self.held.endswith(s[:k])), default=0)
        out = self.held[: len(self.held) - keep]
        self.held = self.held[len(out):]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
