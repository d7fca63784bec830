"""GET /: the web page, a chat with the model beside a live view of the scheduler (issue 27).

Static files from serve/static, served as they are: no build step, and nothing loaded from another
origin (the page's Content-Security-Policy allows only this server). The page itself needs no key;
what it fetches (/v1/chat/completions, /v1/events) carries the key the user gives it. The Host
check and the origin check (serve/http/origin_check.py) cover these paths like every other.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent.parent / "static"  # serve/static

# only this server's own scripts, styles and connections; no framing by other pages (clickjacking)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

page = APIRouter()


@page.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)


def include_page(app: FastAPI) -> None:
    app.include_router(page)
    app.mount("/ui", StaticFiles(directory=STATIC), name="ui")
