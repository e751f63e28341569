"""Request paths as RATELIMIT's path settings (PATH_PREFIXES, EXEMPT_PATHS, SHED_PRIORITIES) describe them.

A path (decoded once, as Django's `request.path_info`) is read two ways: as sent, and normalised
(`normalize`: repeated slashes merged, dot segments resolved) as nginx and Caddy route it. The service
behind may route either reading, so each setting applies the stricter of the two (`readings`): a path
is limited when either reading is (`limited`), and gets the lower of their shedding priorities.

A prefix matches by segment (`PathPrefixes`): "/api/health" matches "/api/health" and "/api/health/db",
never "/api/healthcare"; a trailing slash changes nothing ("/api/" matches "/api" and "/api/users",
never "/apis").

`typo` says why a prefix as written looks like a mistake (`manage.py check`: ratelimit.W022).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple


def normalize(path: str) -> str:
    """`path` with its repeated slashes merged and its "." and ".." segments resolved (RFC 3986 5.2.4;
    ".." never climbs above "/"); a trailing slash is kept. A path that does not start with "/" ("*")
    is returned as it is."""
    if not path.startswith("/") or ("//" not in path and "/." not in path):
        return path
    kept: list[str] = []
    segments = path.split("/")[1:]
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment not in ("", "."):
            kept.append(segment)
    trailing = segments[-1] in ("", ".", "..") and kept
    return "/" + "/".join(kept) + ("/" if trailing else "")


def readings(path: str) -> tuple[str, ...]:
    """The readings of `path` a setting is applied to: as sent, and normalised when that differs."""
    normal = normalize(path)
    return (path,) if normal == path else (path, normal)


def prefix_form(prefix: str) -> str:
    """`prefix` as it is matched: normalised, ending with exactly one "/" ("/" for "/")."""
    return normalize(prefix).rstrip("/") + "/"


class PathPrefixes(NamedTuple):
    """Path prefixes as a setting lists them, ready to match one reading of a path segment by segment.

    `forms` are their `prefix_form`s, longest first; `entries` the prefixes as written, in that order.
    """

    forms: tuple[str, ...]
    entries: tuple[str, ...]

    @classmethod
    def of(cls, entries: Iterable[str]) -> PathPrefixes:
        """The prefixes `entries` (paths starting with "/"), compiled once."""
        pairs = sorted(((prefix_form(entry), entry) for entry in entries), key=lambda pair: -len(pair[0]))
        return cls(tuple(form for form, _ in pairs), tuple(entry for _, entry in pairs))

    def match(self, path: str) -> bool:
        """True when `path` is one of the prefixes or lies below one."""
        return (path + "/").startswith(self.forms)

    def longest(self, path: str) -> str | None:
        """The entry of the longest prefix `path` is or lies below, or None."""
        bounded = path + "/"
        for form, entry in zip(self.forms, self.entries, strict=True):
            if bounded.startswith(form):
                return entry
        return None


def limited(path: str, prefixes: PathPrefixes, exempt: PathPrefixes) -> bool:
    """True when a reading of `path` lies under one of `prefixes` and under none of `exempt`: no
    reading escapes a limit. (The two readings of `readings`, unrolled: this runs for every request.)"""
    inside, outside = prefixes.forms, exempt.forms
    bounded = path + "/"
    if bounded.startswith(inside) and not bounded.startswith(outside):
        return True
    normal = normalize(path)
    if normal == path:
        return False
    bounded = normal + "/"
    return bounded.startswith(inside) and not bounded.startswith(outside)


_WHITESPACE = re.compile(r"\s")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def typo(prefix: str) -> str | None:
    """Why `prefix` (a path prefix a setting lists, starting with "/": conf validates that) looks like a
    mistake, or None."""
    if "?" in prefix or "#" in prefix:
        return "paths never hold a query string or a fragment ('?', '#'): it matches no request"
    if _WHITESPACE.search(prefix):
        return "it holds whitespace: it matches no request a client sends"
    if _ESCAPE.search(prefix):
        return "it holds a percent-escape: paths are matched decoded ('/caf%C3%A9' is written '/café')"
    if normalize(prefix) != prefix:
        return f"it holds '//', '.' or '..': it is matched as {normalize(prefix)!r}"
    return None
