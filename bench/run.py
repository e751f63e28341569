"""The benchmark, in one command: `python bench/run.py [--quick]` from the repository root.

Creates (or updates) its own environment .bench-venv/ with bench/requirements.txt (the project
itself plus its peers), re-runs itself there, starts its own redis-server on a free loopback port
(never the shared 127.0.0.1:6379), and measures:

1. decisions per second and latency, 1 and 4 processes, allowed and denied traffic (engine_bench);
2. admissions when 32 concurrent clients race for one identity (accuracy);
3. Redis memory per active identity (memory);
4. requests per second of a trivial view under gunicorn, per limiter, as a ratio to the lean reference
   middleware (bench/httpapp/reference.py: what the features cost) (http_bench);
5. Redis time per decision (redis_time);
6. requests per second of an `async def` view under uvicorn: bare, the async floor, the async reference,
   our middleware async and sync (http_bench's ASGI variants), next to the async engine's rows;

then writes docs/benchmarks.md and docs/img/benchmarks.png (report). The HTTP load comes from wrk
when it is installed (`apt-get install -y wrk`), else from a bounded Python client. `--quick` is a shorter run
for development; `--smoke` a tiny one that CI runs (with `--output` so it never touches docs/) in
the current environment, where peers that are not installed are reported as not run. `--asgi-only`
measures section 6 alone and replaces it in benchmarks.md, leaving the rest of the file as it is;
`--memory-only` does the same for section 3 (and its rows of the targets table), `--http-only` for
sections 4 and 6 (the HTTP variants under gunicorn and uvicorn, each row as a ratio to the lean
reference middleware, printed too) and the HTTP rows of the targets table.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_VENV = ROOT / ".bench-venv"
REQUIREMENTS = ROOT / "bench" / "requirements.txt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter runs, for development (about 3 minutes)")
    size.add_argument("--smoke", action="store_true",
                      help="tiny counts in the current environment (what CI runs); implies --here")
    parser.add_argument("--output", type=Path, default=ROOT / "docs",
                        help="directory for benchmarks.md and img/benchmarks.png (default: docs/)")
    parser.add_argument("--here", action="store_true",
                        help="run in the current Python environment instead of .bench-venv/ (peers that are "
                             "not installed are reported as not run)")
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument("--skip-http", action="store_true", help="leave out the HTTP measurements")
    parts.add_argument("--asgi-only", action="store_true",
                       help="measure only section 6 (HTTP under ASGI, with the async engine's rows) and replace it "
                            "in benchmarks.md, leaving the rest of the file as it is")
    parts.add_argument("--http-only", action="store_true",
                       help="measure only the HTTP variants under gunicorn and uvicorn, print each row as a ratio to "
                            "the lean reference middleware, and replace sections 4 and 6 (and the HTTP targets) in "
                            "benchmarks.md, leaving the rest of the file as it is")
    parts.add_argument("--memory-only", action="store_true",
                       help="measure only section 3 (Redis memory per active identity) and replace it and its "
                            "targets' rows in benchmarks.md, leaving the rest of the file as it is")
    parser.add_argument("--json", type=Path, help="also write the raw results as JSON to this file")
    parser.add_argument("--snapshot", action="store_true",
                        help="measure the committed HEAD (exported with git archive to a temporary directory), "
                             "not the working tree: what docs/benchmarks.md is made with")
    return parser.parse_args(argv)


# -- the benchmark's own environment ---------------------------------------------------------------
def _requirements_stamp() -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    for path in (REQUIREMENTS, ROOT / "pyproject.toml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_bench_venv() -> Path:
    """Create .bench-venv/ and install bench/requirements.txt into it when they changed; its python."""
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {BENCH_VENV.relative_to(ROOT)}/", flush=True)
        venv.EnvBuilder(with_pip=True).create(BENCH_VENV)
    stamp = BENCH_VENV / f".installed-{_requirements_stamp()}"
    if not stamp.exists():
        print(f"installing {REQUIREMENTS.relative_to(ROOT)} into {BENCH_VENV.relative_to(ROOT)}/", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                        str(REQUIREMENTS)], cwd=ROOT, check=True)
        stamp.touch()
    return python


def in_bench_venv() -> bool:
    return Path(sys.prefix).resolve() == BENCH_VENV.resolve()


# -- the run ---------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.here = True
    if not args.here and not in_bench_venv():
        python = ensure_bench_venv()
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])  # noqa: S606 (our venv)

    if args.snapshot:
        return run_snapshot(argv, args)

    sys.path.insert(0, str(ROOT))
    from bench.runner import run_asgi_only, run_benchmark, run_http_only, run_memory_only
    from bench.sizes import FULL, QUICK, SMOKE

    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    command = os.environ.get("BENCH_COMMAND") or "python bench/run.py" + "".join(f" {a}" for a in argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ratelimit-bench-") as work_dir:
        if args.asgi_only:
            run_asgi_only(sizes, Path(work_dir), args.output.resolve(), command, json_path=args.json,
                          started=started)
        elif args.http_only:
            run_http_only(sizes, Path(work_dir), args.output.resolve(), command, json_path=args.json,
                          started=started)
        elif args.memory_only:
            run_memory_only(sizes, Path(work_dir), args.output.resolve(), command, json_path=args.json,
                            started=started)
        else:
            run_benchmark(sizes, Path(work_dir), args.output.resolve(), command, skip_http=args.skip_http,
                          json_path=args.json, started=started)
    print(f"done in {time.monotonic() - started:.0f}s: {args.output / 'benchmarks.md'}", flush=True)
    return 0


def run_snapshot(argv: list[str], args: argparse.Namespace) -> int:
    """Export HEAD to a temporary directory and run its bench/run.py there, in this environment.

    The snapshot's directory comes first on sys.path (and PYTHONPATH for gunicorn), so its
    ratelimit_app is the one measured even though .bench-venv/ has the working tree installed.
    """
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    rest = [a for a in argv if a not in ("--snapshot", "--here")]
    if "--output" not in rest:
        rest += ["--output", str(args.output.resolve())]
    with tempfile.TemporaryDirectory(prefix="ratelimit-bench-head-") as snapshot:
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", snapshot], input=archive, check=True)
        env = {**os.environ, "BENCH_COMMIT": f"{commit} (HEAD, measured from a clean export)",
               "BENCH_COMMAND": "python bench/run.py" + "".join(f" {a}" for a in argv if a != "--here")}
        done = subprocess.run([sys.executable, str(Path(snapshot) / "bench" / "run.py"), *rest, "--here"],
                              cwd=snapshot, env=env)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
