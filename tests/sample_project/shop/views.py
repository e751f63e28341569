"""The shop's API: every path under /api/ is limited by the middleware (the client's tier, by API key); the
search is a DRF view with throttles; the newsletter and the quote have limits of their own (@ratelimit)."""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.decorators import limit_cost, ratelimit
from ratelimit_app.throttling import ScopedRateThrottle, TierRateThrottle


def products(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"products": ["tea", "coffee"]})


@csrf_exempt
@limit_cost(5)
@require_POST
def orders(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"order": "accepted"}, status=201)


def export(request: HttpRequest) -> StreamingHttpResponse:
    """A long download: the client's concurrency slot is held until the stream is closed."""

    def rows() -> Iterator[bytes]:
        yield b"id,name\n"
        yield b"1,tea\n"

    return StreamingHttpResponse(rows(), content_type="text/csv")


async def live(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"live": True})


class Search(APIView):
    throttle_classes = [TierRateThrottle, ScopedRateThrottle]
    throttle_scope = "search"

    def get(self, request: Request) -> Response:
        return Response({"results": []})


@ratelimit(rate="3/h", key="ip")
def subscribe(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"subscribed": True})


@ratelimit(rate="2/m", key="ip")
async def quote(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"quote": "Simple is better than complex."})
