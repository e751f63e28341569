"""Which Django Ninja operation a request reaches: Ninja routes every method of one path through one
Django view (its PathView's), and picks the operation by the request's method."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.operation import Operation, PathView


def _path_view_of(view_func: Any) -> PathView | None:
    """The PathView behind a view Ninja put in the URLconf (a function closing over it), None for any
    other view."""
    for cell in getattr(view_func, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(contents, PathView):
            return contents
    return None


def operation_for(view_func: Any, request: HttpRequest) -> Operation | None:
    """The operation of `request`'s method behind the Ninja view `view_func` (None: not a Ninja view, or
    no operation for this method: Ninja answers 405)."""
    path_view = _path_view_of(view_func)
    if path_view is None:
        return None
    return next((op for op in path_view.operations if request.method in op.methods), None)


def request_operation(request: HttpRequest) -> Operation | None:
    """The operation `request` was routed to (None when it is not a Ninja request)."""
    match = getattr(request, "resolver_match", None)
    return operation_for(match.func, request) if match is not None else None
