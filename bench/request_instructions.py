"""App-process CPU instructions of one HTTP request, counted by callgrind: a view of section 4 of
docs/benchmarks.md that machine load cannot skew.

    .bench-venv/bin/python bench/request_instructions.py [--requests N] [--variants none evalsha ours ...]

Each variant of bench/httpapp (the same view and settings as the HTTP benchmark: the seeded enterprise
tier as `migrate` makes it, KEY_COUNT of its API keys sent in turn, the per-IP limit, headers and
metrics) is served in process through Django's WSGI handler, without an HTTP server: what is counted is
the work of Django, the view and what stands in front of it, which is what the variants differ by.
Each variant runs under `valgrind --tool=callgrind` twice, N and then 2N requests after the same
warm-up; (instructions of the 2N run - those of the N run) / N is one request's work, start-up and
warm-up excluded. The objects alive after the warm-up are frozen (gc.freeze), so the garbage
collector's full walks over them are not counted: where they fall differs from run to run. Redis runs
outside valgrind, on a redis-server of this script's own (what Redis does for a decision is
bench/script_instructions.py's part), and is flushed before each run.

The process's periodic work (the metrics flusher, the lookup cache's expiry, the reader of plan edits)
is given intervals longer than a run: under valgrind a run lasts minutes, and each of their rounds would
be counted in. For the same reason the engine's check of a connection idle for over 10 ms (a system call
before its reuse, which back-to-back requests skip) is given the same interval: under valgrind a request
takes long enough that it would fire on some requests and not others, depending on the machine's load
(822k against 834k instructions per request of `ours` in two runs). The requests of a loaded server come
back to back, so the count is that of a request that skips it; `idle checks` says how many ran in the
counted requests (0 when the engine has no such check or it never fired). Needs valgrind on PATH and the
benchmark's environment (.bench-venv, which has the peers).

What one part of our request costs is the difference between two counts of `ours`, one of them with
settings of RATELIMIT changed by --ratelimit (a JSON object merged into the variant's RATELIMIT):

    .bench-venv/bin/python bench/request_instructions.py --variants ours --ratelimit '{"HEADERS": "legacy"}'
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.callgrind import annotate, program_total, require  # noqa: E402

#: Requests served before the counted ones (the first requests fill caches and open connections).
WARMUP = 300
#: What the periodic work waits between rounds during a run (seconds): longer than any run.
QUIET_INTERVAL = 3600


def _child(variant: str, requests: int, keys_file: str, ratelimit: str) -> None:
    """Serve `WARMUP` then `requests` requests of `variant` in this process (run under valgrind), with
    the RATELIMIT settings of the JSON object `ratelimit` on top of the variant's."""
    import django
    from django.conf import settings

    django.setup()
    settings.RATELIMIT = {**settings.RATELIMIT, **json.loads(ratelimit), "CACHE_TTL": QUIET_INTERVAL,
                          "METRICS_FLUSH_INTERVAL": QUIET_INTERVAL}
    from ratelimit_app.conf.settings import read_settings

    # an invalid or misspelt setting would not fail a request (the fail mode answers), only the count
    errors = read_settings()[1]
    if errors:
        raise SystemExit("--ratelimit: " + "; ".join(error.message for error in errors))
    from django.core.wsgi import get_wsgi_application

    import ratelimit_app.plans.edits as edits
    from bench.http_bench import PATH

    edits.EDITS_CHECK_INTERVAL = float(QUIET_INTERVAL)
    keys = json.loads(Path(keys_file).read_text())
    application = get_wsgi_application()
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
        statuses.append(status)

    def serve(count: int, offset: int) -> None:
        for i in range(offset, offset + count):
            environ = {"REQUEST_METHOD": "GET", "PATH_INFO": PATH, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
                       "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
                       "HTTP_HOST": "127.0.0.1", "HTTP_X_API_KEY": keys[i % len(keys)], "wsgi.input": io.BytesIO(),
                       "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr}
            body = application(environ, start_response)
            b"".join(body)
            body.close()

    serve(WARMUP, 0)
    # the objects alive after the warm-up (Django's, the view's, the caches') are left out of the
    # collector's full walks: when such a walk falls differs run to run, by tens of thousands of
    # instructions per request in the difference of two runs
    idle_checks = _quiet_idle_checks()
    gc.collect()
    gc.freeze()
    serve(requests, WARMUP)
    sys.stderr.write(f"idle checks: {len(idle_checks)}\n")
    refused = [status for status in statuses if not status.startswith("200")]
    if refused:
        raise SystemExit(f"{variant}: {len(refused)} answers were not 200 (first: {refused[0]})")


def _quiet_idle_checks() -> list[None]:
    """Give the sync engine's idle-connection check (if it has one) QUIET_INTERVAL, and count the checks
    that still run: one item per check in the list returned."""
    ran: list[None] = []
    # found by name among the modules the warm-up loaded, wherever the package keeps it
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("ratelimit_app.")]:
        if hasattr(module, "IDLE_CHECK_AFTER"):
            setattr(module, "IDLE_CHECK_AFTER", float(QUIET_INTERVAL))  # noqa: B010 (found by name)
        stale = getattr(module, "_stale", None)
        if callable(stale):
            def counted(connection: object, stale: Callable[[object], bool] = stale) -> bool:
                ran.append(None)
                return bool(stale(connection))

            setattr(module, "_stale", counted)  # noqa: B010 (found by name)
    return ran


def _instructions(variant: str, requests: int, env: dict[str, str], keys_file: Path, ratelimit: str,
                  out: Path) -> tuple[int, int]:
    """Instructions of one whole run of `variant` under callgrind, and the idle checks of its counted requests."""
    run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
                          "--child", variant, str(requests), str(keys_file), ratelimit],
                         env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
    if run.returncode != 0:  # the child's own message is the last line valgrind did not write
        said = [line for line in run.stderr.splitlines() if line and not line.startswith("==")]
        raise SystemExit(f"{variant}: the counted run failed: {said[-1] if said else run.returncode}")
    checks = re.findall(r"^idle checks: (\d+)$", run.stderr, re.MULTILINE)
    return program_total(annotate(out)), int(checks[-1]) if checks else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="requests in the shorter run (default 1000)")
    parser.add_argument("--variants", nargs="*", default=["none", "evalsha", "reference", "ours", "django-ratelimit"],
                        help="bench/httpapp variants to count (default: none evalsha reference ours django-ratelimit)")
    parser.add_argument("--ratelimit", default="{}",
                        help="a JSON object of RATELIMIT settings set on top of each variant's, e.g. "
                             "'{\"IP_RATE\": null}' (default: none)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, requests, keys_file, ratelimit = args.child
        _child(variant, int(requests), keys_file, ratelimit)
        return
    try:
        changed = json.loads(args.ratelimit)
    except ValueError as exc:
        raise SystemExit(f"--ratelimit: not JSON ({exc})") from None
    if not isinstance(changed, dict):
        raise SystemExit("--ratelimit: expected a JSON object of RATELIMIT settings, e.g. '{\"HEADERS\": \"legacy\"}'")
    require("valgrind", "callgrind_annotate")
    import redis

    from bench import http_bench
    from devtools.embedded import start_redis

    server = start_redis()
    try:
        url = server.url
        admin = redis.Redis.from_url(url)
        print(f"instructions per request of the app process (callgrind), {args.requests} vs {2 * args.requests} "
              f"requests after {WARMUP}, GET {http_bench.PATH} in process"
              + (f", RATELIMIT changed by {args.ratelimit}" if changed else ""))
        print("| variant | instructions per request | idle checks (N run / 2N run) |")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            db_path = work / "bench.sqlite3"
            keys_file = work / "keys.json"
            keys_file.write_text(json.dumps(http_bench.prepare_database(url, db_path)))
            for variant in args.variants:
                env = {**http_bench.server_env(url, db_path, variant), "PYTHONHASHSEED": "0"}
                counts = []
                for requests in (args.requests, 2 * args.requests):
                    admin.flushall()
                    counts.append(_instructions(variant, requests, env, keys_file, args.ratelimit,
                                                work / f"{variant}.{requests}.out"))
                print(f"| {variant} | {(counts[1][0] - counts[0][0]) // args.requests:,} | "
                      f"{counts[0][1]} / {counts[1][1]} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
