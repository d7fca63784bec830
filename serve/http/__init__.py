"""HTTP: the routes of each API, what every route depends on (state, auth), server-sent events,
errors, the Host and Origin checks, the body limit, the web page."""
