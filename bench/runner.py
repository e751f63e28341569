"""Runs every measurement against a private Redis and hands the results to the report."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from bench import accuracy, engine_bench, memory
from bench.asgi_profile import profile_variants
from bench.peers import BY_KEY, VARIANTS, availability
from bench.redis_time import RedisTime, run_redis_time
from bench.results import AsgiSection, Results
from bench.sizes import Sizes
from bench.transports import Transports, transport_rounds
from bench.workers import WorkerPool
from devtools.embedded import RedisProcess, start_redis

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("django-ratelimit-app", "redis", "hiredis", "Django", "djangorestframework", "django-redis",
            "django-ratelimit", "limits", "django-smart-ratelimit", "pyrate-limiter", "gunicorn", "matplotlib")
#: HTTP variant -> the module it needs (see bench/httpapp/variants.py).
HTTP_REQUIRES = {"none": "django", "evalsha": "redis", "reference": "ratelimit_app.core",
                 "ours": "ratelimit_app.middleware", "drf-none": "rest_framework", "drf": "rest_framework",
                 "django-ratelimit": "django_ratelimit", "smart": "django_smart_ratelimit"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def load_average() -> str:
    """The 1-minute load average (the machine may be shared; a high number means noisy results)."""
    return _read("/proc/loadavg").split(" ")[0] or "unknown"


def machine_info(admin: redis.Redis) -> dict[str, str]:
    """CPU, cores, memory, OS, Python, Redis server, load generator and the commit measured."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal")), 0)
    os_name = next((line.split("=", 1)[1].strip('"') for line in _read("/etc/os-release").splitlines()
                    if line.startswith("PRETTY_NAME=")), platform.system())
    server = admin.info("server")
    try:
        wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10)
        wrk_version = (wrk.stdout + wrk.stderr).splitlines()[0].split(" [")[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        wrk_version = "not installed (the bounded Python client is used)"
    try:
        commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "ratelimit_app"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += " (ratelimit_app/ has uncommitted changes)" if dirty and "BENCH_COMMIT" not in os.environ else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    connection: Any = admin.connection_pool.get_connection()
    parser = type(connection._parser).__name__
    admin.connection_pool.release(connection)
    return {
        "CPU": f"{cpu}, {os.cpu_count()} cores",
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "OS": f"{os_name}, Linux {platform.release()}",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "Redis server": f"{server['redis_version']} (own process on a free loopback port, no persistence)",
        "redis-py parser": parser,
        "load generator": wrk_version,
        "ratelimit_app commit": commit,
    }


def package_versions() -> dict[str, str]:
    """Installed versions of the project, its client libraries and the peers."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _importable(module: str) -> str | None:
    try:
        importlib.import_module(module)
        return None
    except Exception as exc:  # an app module may fail for reasons other than ImportError; report it
        return f"{module} is not importable ({type(exc).__name__}: {exc})"


@contextlib.contextmanager
def private_redis(work_dir: Path) -> Iterator[tuple[RedisProcess, redis.Redis]]:
    """A redis-server of the benchmark's own on a free loopback port, and an admin client of it; this
    process (Django set up) and the processes it starts use the bench settings, pointed at it."""
    server = start_redis()
    try:
        os.environ["BENCH_REDIS_URL"] = server.url
        os.environ["BENCH_DB_PATH"] = str(work_dir / "bench-http.sqlite3")
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.httpapp.settings"
        import django

        django.setup()
        yield server, redis.Redis.from_url(server.url, socket_timeout=60)
    finally:
        server.stop()


def _progress(started: float) -> Callable[[str], None]:
    def progress(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {message}", flush=True)

    return progress


def run_benchmark(sizes: Sizes, work_dir: Path, output: Path, command: str, *, skip_http: bool,
                  json_path: Path | None, started: float) -> Results:
    """Run every section with `sizes` and write the report to `output`."""
    from bench import report

    progress = _progress(started)
    with private_redis(work_dir) as (server, admin):
        load_before = load_average()
        missing = {key: why for key, why in availability().items() if why}
        available = [v.key for v in VARIANTS if v.key not in missing]
        progress(f"redis-server on port {server.port}; {len(available)} of {len(VARIANTS)} limiters available")
        pool = WorkerPool(sizes.processes, server.url)
        try:
            engine_results, paired = _engine(pool, admin, sizes, available, progress)
            progress("Redis time per decision (usec_per_call)")
            redis_time = run_redis_time(admin, sizes.redis_time_rounds, sizes.redis_time_calls)
            progress("the engine's transports (sync paths, async), interleaved in 1 process")
            transports = transport_rounds(pool, admin, 3 * sizes.paired_rounds * sizes.paired_duration)
            limiters = [key for key in available if BY_KEY[key].family != "baseline"]
            accuracy_results = []
            for i, key in enumerate(limiters):
                progress(f"accuracy {i + 1}/{len(limiters)}: {BY_KEY[key].label}")
                accuracy_results.append(accuracy.run_accuracy(pool, admin, key, sizes.accuracy_clients,
                                                              sizes.accuracy_hits, sizes.accuracy_runs, f"a{i}"))
            memory_results = _memory(pool, admin, sizes, limiters, progress)
        finally:
            pool.close()
        http_run, http_missing, http_note = _http(server.url, admin, work_dir, sizes, skip_http, progress)
        asgi = _asgi(server.url, admin, work_dir, sizes, transports, redis_time, skip_http, progress)
        machine = machine_info(admin)
        machine["load average (1 min) at start / end"] = f"{load_before} / {load_average()}"
        results = Results(sizes, command, machine, package_versions(), missing, engine_results, paired, transports,
                          accuracy_results, memory_results, http_run, http_missing, http_note, redis_time, asgi,
                          duration=time.monotonic() - started, finished=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                        time.gmtime()))
    progress("writing the report")
    report.write(results, output)
    if json_path is not None:
        json_path.write_text(json.dumps(dataclasses.asdict(results), indent=1, default=str))
    return results


def _engine(pool: WorkerPool, admin: redis.Redis, sizes: Sizes, available: list[str],
            progress: Callable[[str], None]) -> tuple[list[engine_bench.EngineResult], list[engine_bench.Paired]]:
    results = engine_bench.run_engine(pool, admin, available, (1, sizes.processes), sizes.engine_duration,
                                      sizes.probe_decisions, sizes.engine_rounds, progress)
    paired = []
    headline = [key for key in ("baseline", "baseline.raw", "ours.tier") if key in available]
    for processes in (1, sizes.processes):
        progress(f"paired rounds, {processes} process(es): {', '.join(headline)}")
        paired.append(engine_bench.paired_rounds(pool, admin, headline, processes, sizes.paired_rounds,
                                                 sizes.paired_duration, f"p{processes}"))
    return results, paired


def _memory(pool: WorkerPool, admin: redis.Redis, sizes: Sizes, limiters: list[str],
            progress: Callable[[str], None]) -> list[memory.MemoryResult]:
    results = []
    # the service keeps exactly the engine's state in Redis: measured once, as ours.tier
    memory_keys = [key for key in limiters if key != "ours.service.tier"]
    for i, key in enumerate(memory_keys):
        for rate in memory.MEMORY_RATES:
            progress(f"memory {i + 1}/{len(memory_keys)} at {rate}: {BY_KEY[key].label}")
            results.append(memory.run_memory(pool, admin, key, rate, sizes.memory_identities, sizes.memory_hit_budget,
                                             sizes.memory_unit_budget, f"m{i}"))
    return results


def run_memory_only(sizes: Sizes, work_dir: Path, output: Path, command: str, *, json_path: Path | None,
                    started: float) -> list[memory.MemoryResult]:
    """Measure only section 3 (Redis memory per active identity) with `sizes` and replace it, and its rows of
    the targets table, in `output`/benchmarks.md, leaving the rest of it as it is (memory does not depend
    on the machine's load)."""
    from bench import report

    progress = _progress(started)
    with private_redis(work_dir) as (server, admin):
        missing = {key: why for key, why in availability().items() if why}
        limiters = [v.key for v in VARIANTS if v.key not in missing and v.family != "baseline"]
        pool = WorkerPool(sizes.processes, server.url)
        try:
            results = _memory(pool, admin, sizes, limiters, progress)
        finally:
            pool.close()
        commit = machine_info(admin)["ratelimit_app commit"]
    not_run = "".join(f"; not run: {BY_KEY[key].label} ({why})" for key, why in missing.items()
                      if BY_KEY[key].family != "baseline")
    provenance = (f"`{command}` ({sizes.name} sizes) at commit {commit}, finished "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, took {time.monotonic() - started:.0f} s"
                  f"{not_run}")
    progress("writing the memory section")
    report.write_memory(results, provenance, output)
    if json_path is not None:
        json_path.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1, default=str))
    return results


def _http(url: str, admin: redis.Redis, work_dir: Path, sizes: Sizes, skip: bool,
          progress: Callable[[str], None]) -> tuple[Any, dict[str, str], str]:
    if skip:
        return None, {}, "left out of this run (--skip-http)"
    from bench import http_bench
    from bench.httpapp.variants import VARIANTS as HTTP_VARIANTS

    missing = {name: why for name in HTTP_VARIANTS if (why := _importable(HTTP_REQUIRES[name]))}
    names = [name for name in HTTP_VARIANTS if name not in missing]
    run = http_bench.run_http(url, admin, work_dir, names, sizes.http_duration, sizes.http_warmup,
                              sizes.http_rounds, sizes.http_connections, sizes.http_workers, sizes.http_threads,
                              progress)
    return run, missing, ""


#: The async engine's rows an ASGI-only run measures: AsyncRateLimiter.hit on the tier and its floor.
ASGI_TRANSPORTS = ("async.evalsha", "async.tier")


def uvicorn_description() -> str:
    """uvicorn's version and the event loop and HTTP parser its defaults pick in this environment."""
    def has(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    try:
        version = importlib.metadata.version("uvicorn")
    except importlib.metadata.PackageNotFoundError:
        return "uvicorn (not installed)"
    return (f"uvicorn {version}, 1 process, event loop {'uvloop' if has('uvloop') else 'asyncio'}, "
            f"HTTP parser {'httptools' if has('httptools') else 'h11'}")


def _asgi(url: str, admin: redis.Redis, work_dir: Path, sizes: Sizes, transports: Transports | None,
          redis_time: RedisTime | None, skip: bool, progress: Callable[[str], None]) -> AsgiSection:
    server = uvicorn_description()
    if skip:
        return AsgiSection(None, transports, "left out of this run (--skip-http)", server, "", redis_time=redis_time)
    missing = _importable("uvicorn")
    if missing:
        return AsgiSection(None, transports, missing, server, "", redis_time=redis_time)
    from bench import http_bench
    from bench.httpapp.variants import ASGI_VARIANTS

    load_before = load_average()
    run = http_bench.run_http(url, admin, work_dir, list(ASGI_VARIANTS), sizes.http_duration, sizes.http_warmup,
                              sizes.http_rounds, sizes.http_connections, 1, 0, progress, server="uvicorn",
                              ours="async-ours")
    profile = profile_variants(url, work_dir, list(ASGI_VARIANTS), 2 * sizes.http_duration, sizes.http_connections,
                               progress)
    return AsgiSection(run, transports, "", server, f"{load_before} / {load_average()}", profile, redis_time)


def _asgi_alone(server: RedisProcess, admin: redis.Redis, work_dir: Path, sizes: Sizes, command: str,
                started: float, progress: Callable[[str], None]) -> AsgiSection:
    """Section 6 measured on its own: the async engine's rows and the scripts' Redis time, then the ASGI
    variants under uvicorn, with the provenance of this run."""
    load_before = load_average()
    progress("the async engine's rows (AsyncRateLimiter.hit and a bare async EVALSHA), interleaved in 1 process")
    pool = WorkerPool(1, server.url)
    try:
        transports = transport_rounds(pool, admin, 3 * sizes.paired_rounds * sizes.paired_duration,
                                      rows=ASGI_TRANSPORTS)
    finally:
        pool.close()
    progress("Redis time per decision (usec_per_call)")
    redis_time = run_redis_time(admin, sizes.redis_time_rounds, sizes.redis_time_calls)
    commit = machine_info(admin)["ratelimit_app commit"]
    section = _asgi(server.url, admin, work_dir, sizes, transports, redis_time, False, progress)
    return dataclasses.replace(
        section, load=f"{load_before} / {load_average()}",
        provenance=f"`{command}` ({sizes.name} sizes) at commit {commit}, finished "
                   f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, took {time.monotonic() - started:.0f} s")


def run_asgi_only(sizes: Sizes, work_dir: Path, output: Path, command: str, *, json_path: Path | None,
                  started: float) -> AsgiSection:
    """Measure only the ASGI section with `sizes` and replace that section of `output`/benchmarks.md,
    leaving the rest of it as it is."""
    from bench import report

    progress = _progress(started)
    with private_redis(work_dir) as (server, admin):
        section = _asgi_alone(server, admin, work_dir, sizes, command, started, progress)
    progress("writing the ASGI section")
    report.write_asgi(section, output)
    if json_path is not None:
        json_path.write_text(json.dumps(dataclasses.asdict(section), indent=1, default=str))
    return section


def run_http_only(sizes: Sizes, work_dir: Path, output: Path, command: str, *, json_path: Path | None,
                  started: float) -> tuple[Any, AsgiSection]:
    """Measure only the HTTP sections: the WSGI variants under gunicorn (section 4), then section 6 as
    `run_asgi_only` does; print every row's ratio to the lean reference middleware, and replace both
    sections and the HTTP rows of the targets table in `output`/benchmarks.md."""
    from bench import report
    from bench.report_http import summary

    progress = _progress(started)
    with private_redis(work_dir) as (server, admin):
        http_run, http_missing, http_note = _http(server.url, admin, work_dir, sizes, False, progress)
        section = _asgi_alone(server, admin, work_dir, sizes, command, started, progress)
    print("\n".join(summary(http_run, section.http)), flush=True)
    report.write_http(http_run, http_note, http_missing, sizes.http_rounds, section, output)
    if json_path is not None:
        json_path.write_text(json.dumps({"gunicorn": dataclasses.asdict(http_run) if http_run else None,
                                         "uvicorn": dataclasses.asdict(section)}, indent=1, default=str))
    return http_run, section
