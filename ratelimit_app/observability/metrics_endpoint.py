"""GET /metrics: who may read it (staff sessions, the bearer METRICS_TOKEN, METRICS_ALLOWED_IPS; 403
otherwise), and its answer; it imports without prometheus-client and answers 501 then (docs/security.md)."""

from __future__ import annotations

import hashlib
import hmac
import importlib
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from ..apply.identity import IPNetwork, address_in, client_ip, parse_networks
from ..conf.settings import InvalidSetting, SettingsCached, ratelimit_settings

_PROMETHEUS_MODULE = "ratelimit_app.observability.prometheus"


@dataclass(frozen=True, slots=True)
class _MetricsAccess:
    """The access settings of GET /metrics, parsed once per settings change."""

    token_digest: bytes | None  # SHA-256 of RATELIMIT['METRICS_TOKEN']
    networks: tuple[IPNetwork, ...]
    #: Why no bearer token is accepted although one is set ("RATELIMIT['METRICS_TOKEN'] is invalid ..."),
    #: or "" (a refused reader is then told so in a 503, never shown the token)
    token_problem: str = ""

    @property
    def configured(self) -> bool:
        """True when something other than a staff session can read the metrics."""
        return self.token_digest is not None or bool(self.networks)


def _parse_access() -> _MetricsAccess:
    networks = parse_networks(ratelimit_settings.METRICS_ALLOWED_IPS)  # always readable: its valid CIDRs
    try:
        token = ratelimit_settings.METRICS_TOKEN
    except InvalidSetting as exc:  # no token opens the endpoint until it is fixed
        return _MetricsAccess(None, networks, str(exc))
    return _MetricsAccess(hashlib.sha256(token.encode()).digest() if token is not None else None, networks)


_access = SettingsCached(_parse_access)


def get_access() -> _MetricsAccess:
    """The parsed access settings (parsed on first use and after every settings change)."""
    return _access.get()


def _may_read_metrics(request: HttpRequest) -> bool:
    """True when `request` comes from a staff session, carries the metrics token, or comes from an
    allowed client IP."""
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    access = get_access()
    if access.token_digest is not None:
        authorization = str(request.META.get("HTTP_AUTHORIZATION", ""))
        if authorization[:7].lower() == "bearer ":
            # digests have one length, so the comparison does not even reveal the token's length
            presented = hashlib.sha256(authorization[7:].strip().encode()).digest()
            if hmac.compare_digest(presented, access.token_digest):
                return True
    return bool(access.networks) and address_in(client_ip(request), access.networks)


def _forbidden(access: _MetricsAccess) -> JsonResponse:
    if access.token_problem:
        body, status = {"error": "unavailable", "detail": f"{access.token_problem}: GET /metrics answers only to "
                        "staff sessions and RATELIMIT['METRICS_ALLOWED_IPS'] until it is fixed"}, 503
    else:
        how = ("GET /metrics answers only to staff sessions, to Authorization: Bearer <RATELIMIT['METRICS_TOKEN']> "
               "and to client IPs in RATELIMIT['METRICS_ALLOWED_IPS']")
        if not access.configured:
            how += "; neither setting is configured, so only staff sessions may read it"
        body, status = {"error": "forbidden", "detail": how}, 403
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


def prometheus_missing() -> str | None:
    """Why the Prometheus exposition cannot be served (prometheus-client is not installed), or None."""
    try:
        importlib.import_module(_PROMETHEUS_MODULE)
    except ImproperlyConfigured as exc:
        return str(exc)
    return None


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: this process's limiter metrics in the Prometheus text format, for allowed readers
    only (403 otherwise; 501 when prometheus-client is not installed)."""
    if not _may_read_metrics(request):
        return _forbidden(get_access())
    try:
        prometheus = importlib.import_module(_PROMETHEUS_MODULE)
    except ImproperlyConfigured as exc:
        return JsonResponse({"error": "not implemented", "detail": str(exc)}, status=501)
    body, content_type = prometheus.exposition()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
