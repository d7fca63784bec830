"""HTTP: the routes of each API, running one request for them, what every route depends on (state, auth),
server-sent events, errors, the Host and Origin checks, the body limit, the web page."""
