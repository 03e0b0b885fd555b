"""`homing top`: a live terminal view of a running gateway's models and workers, read from its
`GET /metrics`, with a line per autoscaled model from its admin API.

Modules: `frame` (pure: parse a scrape, keep a sliding window of scrapes, compute the per-model,
per-version and per-worker rows of a frame), `scaler` (the autoscaled pools, from the admin API's
`GetScaler`), `view` (rich tables of a frame and the scaler lines), `main` (arguments,
scraping, the refresh loop). Like the admin verbs it is a client of a running gateway; it
imports nothing of the gateway.
"""
