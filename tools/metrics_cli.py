"""``slts metrics``: a store's Prometheus metrics, printed once or served over HTTP.

The store is observed read-only (no epoch: the live owner keeps running, nobody is fenced),
so what is shown is what the metadata says at each scrape: segments, chunks, the GC queue's
depth and oldest entry, the last leak check if any. The counters of a running engine live
in its own process: a library user registers ``slts.metrics.SltsCollector`` there
(``docs/operations.md``).
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

# ``slts.tools.cli`` imports this module inside ``build_parser``, after it has loaded.
from slts.tools.command_line import EXIT_OK, non_negative, open_storage


def cmd_metrics(args: argparse.Namespace) -> int:
    """Print the store's metrics in Prometheus' text format, or with --serve PORT serve
    them at http://ADDRESS:PORT/metrics until interrupted (SIGINT or SIGTERM); PORT 0
    picks a free port, printed on the first line."""
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from slts.metrics import SltsCollector

    with open_storage(args, read_only=True) as storage:
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage))
        if args.serve is None:
            print(generate_latest(registry).decode(), end="")
            return EXIT_OK
        server, thread = start_http_server(args.serve, addr=args.address, registry=registry)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        print(f"serving http://{args.address}:{server.server_port}/metrics", flush=True)
        try:
            stop.wait()
        finally:
            server.shutdown()
            thread.join()
    return EXIT_OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``metrics`` to the ``slts`` parser's subcommands ``sub``."""
    metrics = sub.add_parser(
        "metrics", parents=[common], help="the store's Prometheus metrics", description=cmd_metrics.__doc__
    )
    metrics.set_defaults(func=cmd_metrics)
    metrics.add_argument("--serve", type=non_negative, default=None, metavar="PORT", help="serve over HTTP")
    metrics.add_argument("--address", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
