"""Request paths as RATELIMIT's path settings (PATH_PREFIXES, EXEMPT_PATHS, SHED_PRIORITIES) match them:
by segment, as sent and normalised, the stricter reading winning (docs/settings.md, "How paths match")."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple


def normalize(path: str) -> str:
    """`path` with repeated slashes merged and "." and ".." segments resolved (RFC 3986 5.2.4), as nginx
    and Caddy route it; a trailing slash is kept, a path not starting with "/" ("*") left as it is."""
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
    """Path prefixes as a setting lists them (`entries`) and as matched (`forms`), longest first."""

    forms: tuple[str, ...]
    entries: tuple[str, ...]

    @classmethod
    def of(cls, entries: Iterable[str]) -> PathPrefixes:
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
    """True when a reading of `path` lies under one of `prefixes` and under none of `exempt` (`readings`
    unrolled: this runs for every request)."""
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
    """Why `prefix` (starting with "/") looks like a mistake, or None (`check`: ratelimit.W022)."""
    if "?" in prefix or "#" in prefix:
        return "paths never hold a query string or a fragment ('?', '#'): it matches no request"
    if _WHITESPACE.search(prefix):
        return "it holds whitespace: it matches no request a client sends"
    if _ESCAPE.search(prefix):
        return "it holds a percent-escape: paths are matched decoded ('/caf%C3%A9' is written '/café')"
    if normalize(prefix) != prefix:
        return f"it holds '//', '.' or '..': it is matched as {normalize(prefix)!r}"
    return None
