"""`bench/run.py --http-only` rewrites sections 4 and 6 of docs/benchmarks.md and the HTTP rows of its
targets table in place, every row a ratio to the lean reference middleware, and leaves the rest alone."""

from __future__ import annotations

from pathlib import Path

from bench.http_bench import HttpRun
from bench.httpapp.variants import ASGI_VARIANTS, VARIANTS
from bench.loadgen import HttpResult
from bench.report import write_http
from bench.report_http import summary
from bench.results import AsgiSection

ROOT = Path(__file__).resolve().parent.parent

#: requests/s of each round, per variant: ours at 0.96x the reference in every round
RATES = {"none": 3000.0, "evalsha": 2500.0, "reference": 2000.0, "ours": 1920.0, "drf-none": 2800.0,
         "drf": 1500.0, "django-ratelimit": 1700.0, "smart": 1600.0, "async-none": 1200.0, "async-evalsha": 1000.0,
         "async-reference": 900.0, "async-ours": 800.0, "sync-ours": 700.0}


def _run(variants: list[str], server: str) -> HttpRun:
    rounds: dict[str, tuple[float, ...]] = {v: (RATES[v], RATES[v] * 1.1, RATES[v] * 0.9) for v in variants}
    results = tuple(HttpResult(v, 3000, RATES[v], 0.001, 0.004, 0, "wrk", 20e-6, 1 / RATES[v]) for v in variants)
    return HttpRun(results, rounds, {"X-RateLimit-Limit": "200"}, "wrk", 2, 0, 8, 2.0, server)


def test_http_only_replaces_sections_4_and_6_and_the_http_targets(tmp_path: Path) -> None:
    before = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    (tmp_path / "benchmarks.md").write_text(before, encoding="utf-8")
    gunicorn, uvicorn = _run(list(VARIANTS), "gunicorn"), _run(list(ASGI_VARIANTS), "uvicorn")
    section = AsgiSection(uvicorn, None, "", "uvicorn", "1.0 / 1.0", provenance="`python bench/run.py --http-only`")

    write_http(gunicorn, "", {}, 3, section, tmp_path)

    after = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    for title in ("## 4. HTTP: a trivial view under gunicorn", "## 6. HTTP under ASGI (uvicorn)"):
        assert after.count(title) == 1
    http = after.partition("<!-- section: http -->")[2].partition("<!-- end of section -->")[0]
    assert "Measured on its own, with section 6, by `python bench/run.py --http-only`" in http
    assert "| **ratelimit_app middleware** | 1,920 | 0.96x | 0.96x |" in http
    assert "| django-ratelimit | 1,700 | 0.85x | 0.85x |" in http
    targets = [line for line in after.split("## Targets")[1].split("## Machine")[0].splitlines()
               if line.startswith(("| HTTP", "| ASGI"))]
    assert [t.split(" |")[0] for t in targets] == [
        "| HTTP (gunicorn): our middleware >= 0.95x the lean reference middleware",
        "| HTTP (gunicorn): our middleware >= 1.1x every peer variant",
        "| HTTP (uvicorn): our middleware >= 0.95x the lean reference middleware",
        "| HTTP (uvicorn): our async middleware ahead of our sync middleware under ASGI"]
    assert targets[0].endswith("| **pass** |") and targets[1].endswith("| **pass** |")  # 1.13x the best peer

    def outside(text: str) -> list[str]:
        kept = []
        for part in text.split("<!-- section: ")[1:]:
            if not part.startswith(("http -->", "asgi -->")):
                kept.append(part.partition("<!-- end of section -->")[0])
        head = text.split("<!-- section: ")[0]
        return [line for line in head.splitlines() if not line.startswith(("| HTTP", "| ASGI"))] + kept

    assert outside(after) == outside(before)
    assert summary(gunicorn, uvicorn)[3].split() == ["reference", "2,000", "req/s", "1.00x", "by", "CPU", "1.00x",
                                                     "(500", "+", "20", "µs/request)"]
