"""`homing top [--url URL] [--interval S] [--window S] [--once] [--output table|json]
[--admin ADDR] [--admin-key KEY]`.

Scrapes `URL/metrics` (URL: the gateway's HTTP address, default http://127.0.0.1:8080; a URL
whose path already ends in /metrics is used as it is; no scheme means http) every `--interval`
seconds (default 1) and redraws the models, versions (models with several versions only) and
workers tables (`homing.top.view`) of the last `--window` seconds of scrapes (default 30)
until Ctrl-C, which exits 0. `--once` takes two scrapes `--interval` apart, prints one frame
and exits. `--output json` prints the frame's data instead (`Frame.as_dict`): indented with
`--once`, else one compact object per line per refresh (a failed scrape then prints its
`homing: ...` line on stderr instead of a frame).

Scaler lines: at each frame the admin API (`--admin`/`--admin-key`, as the admin verbs take
them; `homing.top.scaler`) is asked for the autoscaled pools; one line per autoscaled model
is drawn below the models table, none when no model is autoscaled. In JSON the frame then
has a `scalers` list (`ScalerPool`s), and `scaler_error` when that call failed; a failed
call never ends the command.

Errors: a malformed `$HOMING_ADMIN` is one line `homing: <what>` on stderr and exit 1; when
the first scrape fails (nothing answering, a status other than 200, a body that is
not a homing gateway's Prometheus text, no answer within `SCRAPE_TIMEOUT_S`), one line
`homing: <what>` on stderr and exit 1; a later failure shows in the header, and the view keeps
the last data and tries again at the next refresh (the gateway may be restarting). Data goes
to stdout only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from homing.top.frame import Frame, Scrape
    from homing.top.scaler import ScalerFeed, ScalerView

DEFAULT_URL = "http://127.0.0.1:8080"

#: Seconds a scrape may take before it counts as failed.
SCRAPE_TIMEOUT_S = 5.0
#: The largest `/metrics` body read (bytes); a gateway with thousands of workers stays far
#: below it.
MAX_BODY_BYTES = 64 * 1024 * 1024

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


class ScrapeError(Exception):
    """A scrape that gave no metrics; the message says why, in a user's words."""


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def add_top_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `homing top` (see the module docstring)."""
    p.add_argument(
        "--url",
        type=metrics_url,
        default=DEFAULT_URL,
        help=f"the gateway's HTTP address; /metrics is read from it (default {DEFAULT_URL})",
    )
    p.add_argument(
        "--interval",
        type=_positive_seconds,
        default=1.0,
        metavar="S",
        help="seconds between scrapes (default 1)",
    )
    p.add_argument(
        "--window",
        type=_positive_seconds,
        default=30.0,
        metavar="S",
        help="seconds of scrapes that rates and quantiles span (default 30)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="take two scrapes --interval apart, print one frame and exit",
    )
    p.add_argument(
        "--output",
        choices=["table", "json"],
        default="table",
        help="tables (default) or the same data as JSON",
    )
    p.add_argument(
        "--admin",
        type=_admin_address,
        metavar="ADDR",
        help="admin API address for the scaler lines, unix:PATH or HOST:PORT (default "
        "$HOMING_ADMIN, else unix:<state dir>/admin.sock)",
    )
    p.add_argument("--admin-key", metavar="KEY", help="admin key (default $HOMING_ADMIN_KEY)")


def _admin_address(text: str) -> str:
    """An `--admin` address as `homing.admin.client.resolve_address` reads it (a usage
    error otherwise); the text itself."""
    from homing.admin.client import resolve_address

    try:
        resolve_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def metrics_url(url: str) -> str:
    """The /metrics URL of gateway address `url`: `/metrics` appended to its path unless the
    path ends in it already; `http://` in front when it has no scheme. Raises
    `argparse.ArgumentTypeError` (a usage error) for a scheme other than http and https or
    no host."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{url!r} is not an http:// or https:// address")
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path += "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def scrape(url: str, clock: Callable[[], float] = time.monotonic) -> Scrape:
    """GET `url` and parse it, timed at the middle of the request on `clock` (monotonic
    seconds); raises `ScrapeError` when no homing metrics came back."""
    from homing.top.frame import MetricsTextError, parse_scrape

    started = clock()
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            body = _read_body(response, url, deadline=started + SCRAPE_TIMEOUT_S, clock=clock)
    except urllib.error.HTTPError as err:
        raise ScrapeError(f"{url} answered HTTP {err.code} {err.reason}") from None
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, TimeoutError):
            raise ScrapeError(f"no answer from {url} within {SCRAPE_TIMEOUT_S:g} s") from None
        why = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        raise ScrapeError(f"cannot reach {url}: {why}") from None
    except TimeoutError:
        raise ScrapeError(f"no answer from {url} within {SCRAPE_TIMEOUT_S:g} s") from None
    except (OSError, ValueError, http.client.HTTPException) as err:  # reset, bad port
        raise ScrapeError(f"cannot reach {url}: {err}") from None
    at = (started + clock()) / 2
    try:
        return parse_scrape(body.decode("utf-8", errors="replace"), at)
    except MetricsTextError as err:
        raise ScrapeError(f"{url} did not return a homing gateway's metrics: {err}") from None


def _read_body(
    response: http.client.HTTPResponse, url: str, *, deadline: float, clock: Callable[[], float]
) -> bytes:
    """The whole body, within `deadline` (on `clock`) and `MAX_BODY_BYTES`; `ScrapeError`
    past either (a server that trickles or never ends)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(1 << 16):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ScrapeError(f"{url} sent more than {MAX_BODY_BYTES >> 20} MiB of metrics")
        if clock() > deadline:
            raise ScrapeError(f"no whole answer from {url} within {SCRAPE_TIMEOUT_S:g} s")
        chunks.append(chunk)
    return b"".join(chunks)


def _console() -> Console:
    from rich.console import Console

    console = Console()
    # Not a terminal (a pipe, a file): wide enough that the tables are not wrapped to 80.
    return console if console.is_terminal else Console(width=200)


def _print_json(frame: Frame, scaler: ScalerView, indent: int | None) -> None:
    data = frame.as_dict()
    if scaler.pools:
        data["scalers"] = scaler.pools
    if scaler.error:
        data["scaler_error"] = scaler.error
    print(json.dumps(data, indent=indent), flush=True)


def _once(url: str, args: argparse.Namespace, feed: ScalerFeed) -> int:
    from homing.top.frame import Window
    from homing.top.view import render

    window = Window(args.window)
    window.add(scrape(url))
    time.sleep(args.interval)
    window.add(scrape(url))
    frame = window.frame()
    scaler = feed.fetch()
    if args.output == "json":
        _print_json(frame, scaler, indent=2)
    else:
        _console().print(render(frame, url, scaler=scaler))
    return EXIT_OK


def _live(url: str, args: argparse.Namespace, feed: ScalerFeed) -> int:
    from rich.live import Live

    from homing.top.frame import Window
    from homing.top.view import render

    window = Window(args.window)
    window.add(scrape(url))  # the first failure ends the command
    status: str | None = None
    scaler = feed.fetch()
    next_at = time.monotonic()

    def tick() -> None:
        nonlocal status, scaler, next_at
        next_at += args.interval
        now = time.monotonic()
        if next_at < now:  # fell behind (a slow scrape): start the cadence again from now
            next_at = now
        time.sleep(next_at - now)
        try:
            window.add(scrape(url))
            status = None
        except ScrapeError as err:
            status = f"last scrape failed: {err}"
        scaler = feed.fetch()

    if args.output == "json":
        _print_json(window.frame(), scaler, indent=None)
        while True:
            tick()
            if status is None:
                _print_json(window.frame(), scaler, indent=None)
            else:
                print(f"homing: {status}", file=sys.stderr, flush=True)
    first = render(window.frame(), url, scaler=scaler)
    with Live(first, console=_console(), auto_refresh=False) as live:
        while True:
            tick()
            live.update(render(window.frame(), url, status, scaler), refresh=True)


def run_top(args: argparse.Namespace) -> int:
    """Run `homing top` with `args` parsed by `add_top_arguments`'s options; the exit
    status."""
    from homing.top.scaler import ScalerFeed

    url = args.url  # already the /metrics URL (`metrics_url` is the option's type)
    try:
        feed = ScalerFeed.from_args(args.admin, args.admin_key)
    except ValueError as err:  # a malformed $HOMING_ADMIN (`--admin` is checked as parsed)
        print(f"homing: {err}", file=sys.stderr)
        return EXIT_FAILED
    try:
        return _once(url, args, feed) if args.once else _live(url, args, feed)
    except ScrapeError as err:
        print(f"homing: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED if args.once else EXIT_OK
    except BrokenPipeError:  # stdout's reader left (`homing top --output json | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return EXIT_OK
    finally:
        feed.close()
