"""The gateway endpoint through Django's test client against the real Redis, with requests shaped as each
gateway sends them: Caddy and Traefik (GET, X-Forwarded-Method / -Uri / -For), Envoy ext_authz (the
original method, the original path after the endpoint's own, only its allowed headers) and nginx's
auth_request (X-Original-Method / -URI; every answer but 200 is a 403 carrying the real one). The async
twins have tests/gateway/test_views_async.py."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
import redis
from django.test import Client

from devtools.embedded import free_port, start_redis
from ratelimit_app.apply import shedding
from ratelimit_app.core.keys import state_keys
from ratelimit_app.gateway import views
from ratelimit_app.gateway.lease import slots_of
from ratelimit_app.models import ClientRule, TierLimit
from tests.support.limits_support import add_slots, check_free_burst, make_key, make_tier, parse_ietf, seed_tiers

pytestmark = pytest.mark.django_db

CLIENT = "203.0.113.7"
RATE_LIMIT_HEADERS = ("Retry-After", "RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining",
                      "X-RateLimit-Reset", "X-RateLimit-Tier")


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


@pytest.fixture(autouse=True)
def _behind_one_gateway(settings: Any) -> None:
    use(settings, TRUSTED_PROXIES=1)


class Answer:
    """A test client response read like a `requests` response (what check_free_burst reads)."""

    def __init__(self, response: Any) -> None:
        self.status_code = response.status_code
        self.headers = response.headers
        self.content = response.content

    def json(self) -> Any:
        return json.loads(self.content)


def forward_auth(client: Client, key: str | None, *, uri: str = "/orders/7?page=2", method: str = "POST",
                 **headers: str) -> Answer:
    """What Caddy's forward_auth and Traefik's ForwardAuth send: a GET, the client's own headers, the
    original request in X-Forwarded-Method / -Uri, the client's address in X-Forwarded-For."""
    sent = {"X-Forwarded-Method": method, "X-Forwarded-Uri": uri, "X-Forwarded-For": CLIENT,
            "X-Forwarded-Proto": "http", "X-Forwarded-Host": "shop.example", **headers}
    if key is not None:
        sent["X-API-Key"] = key
    return Answer(client.get("/ratelimit/authorize", headers=sent))


def ext_authz(client: Client, key: str, *, path: str = "/orders/7?page=2", method: str = "DELETE",
              **headers: str) -> Answer:
    """What Envoy's HTTP ext_authz sends: the original method, path_prefix + the original path (query
    included), no body, and the headers its allowed_headers let through."""
    sent = {"X-API-Key": key, "X-Forwarded-For": CLIENT, "Content-Length": "0", **headers}
    return Answer(client.generic(method, f"/ratelimit/authorize{path}", headers=sent))


def auth_request(client: Client, key: str | None, *, uri: str = "/orders/7", **headers: str) -> Answer:
    """What nginx's auth_request sends with the location of docs/gateway.md: a GET subrequest with the
    client's headers, X-Original-Method / -URI and X-Forwarded-For."""
    sent = {"X-Original-Method": "GET", "X-Original-URI": uri, "X-Forwarded-For": CLIENT, **headers}
    if key is not None:
        sent["X-API-Key"] = key
    return Answer(client.get("/ratelimit/auth-request", headers=sent))


def release(client: Client, answer: Answer) -> int:
    """Report the end of an admitted request, as nginx's post_action or the service does."""
    lease = answer.headers.get("X-RateLimit-Lease")
    sent = {"X-RateLimit-Lease": lease} if lease else {}
    return int(client.post("/ratelimit/release", headers=sent).status_code)


def confirm(client: Client, answer: Answer) -> int:
    """Confirm an admitted request, as the service does when it arrives."""
    lease = answer.headers.get("X-RateLimit-Lease")
    sent = {"X-RateLimit-Lease": lease} if lease else {}
    return int(client.post("/ratelimit/confirm", headers=sent).status_code)


def test_a_free_keys_eleventh_request_is_429_like_the_middlewares(client: Client) -> None:
    seed_tiers()
    add_slots("free", 2)  # the seeded tiers have none: this test's slots, given back after each request
    key = make_key("free")
    answers = []
    for _ in range(11):
        answers.append(forward_auth(client, key))
        if answers[-1].status_code == 200:
            assert answers[-1].content == b""
            assert release(client, answers[-1]) == 204  # the slot comes back each time
    check_free_burst(answers)
    assert answers[0].headers["X-RateLimit-Lease"] and "X-RateLimit-Lease" not in answers[-1].headers
    # the same refusal as the middleware's for the same state: 429, body, Retry-After, RateLimit headers
    middleware = client.get("/api/users", headers={"X-API-Key": key}, REMOTE_ADDR=CLIENT)
    assert middleware.status_code == 429
    assert json.loads(middleware.content).keys() == answers[-1].json().keys()
    for name in RATE_LIMIT_HEADERS:
        assert middleware.headers[name] and answers[-1].headers[name], name


def test_a_slot_is_held_until_the_release_names_it(client: Client) -> None:
    seed_tiers()
    add_slots("free", 2)  # as staff would: the seeded tiers have none
    key = make_key("free")
    first, second = forward_auth(client, key), forward_auth(client, key)
    assert (first.status_code, second.status_code) == (200, 200)
    third = forward_auth(client, key)  # both slots of the free tier are held
    assert third.status_code == 429 and third.json()["policy"] == "concurrency"
    assert parse_ietf(first.headers["RateLimit"])["concurrency"]["r"] == 1
    assert release(client, first) == 204
    assert release(client, first) == 204  # a second report of the same end gives nothing back twice
    fourth = forward_auth(client, key)
    assert fourth.status_code == 200 and parse_ietf(fourth.headers["RateLimit"])["concurrency"]["r"] == 0
    assert forward_auth(client, key).status_code == 429


def test_a_lease_not_signed_here_is_refused_and_no_lease_is_nothing_to_do(client: Client) -> None:
    assert client.post("/ratelimit/release").status_code == 204
    forged = client.post("/ratelimit/release", headers={"X-RateLimit-Lease": "eyJ0IjoiYSJ9:forged"})
    assert forged.status_code == 400
    assert "not signed by this site" in json.loads(forged.content)["error"]


def test_a_bad_key_is_401_and_no_key_is_401(client: Client) -> None:
    seed_tiers()
    bad = forward_auth(client, make_key("free")[:-4] + "AAAA")
    assert bad.status_code == 401 and bad.json() == {"error": "unknown API key"}
    assert bad.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    assert forward_auth(client, None).json() == {"error": "API key required"}


def test_without_require_api_key_a_credential_not_ours_and_none_are_limited_per_ip(client: Client,
                                                                                  settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REQUIRE_API_KEY": False}
    seed_tiers()
    jwt = forward_auth(client, None, Authorization="Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln")
    bare = forward_auth(client, None)
    for answer in (jwt, bare):
        assert answer.status_code == 200 and answer.headers["X-RateLimit-Limit"] == "100"  # the per-IP limit
    assert forward_auth(client, make_key("free")[:-4] + "AAAA").json() == {"error": "unknown API key"}


def test_a_service_scope_adds_its_limits_to_the_tiers_global_ones(client: Client) -> None:
    tier = make_tier("services", [("minute", "fixed_window", 5, 60, None, ""),
                                  ("minute", "fixed_window", 2, 60, None, "orders")])
    key = make_key(tier)
    orders = [forward_auth(client, key, **{"X-RateLimit-Service": "orders"}).status_code for _ in range(3)]
    assert orders == [200, 200, 429]
    refused = forward_auth(client, key, **{"X-RateLimit-Service": "orders"})
    assert refused.json()["policy"] == "orders.minute"
    assert parse_ietf(refused.headers["RateLimit-Policy"]).keys() == {"ip", "minute", "orders.minute"}
    # another service, and a route without one, only know the global limit, which the orders counted
    search = forward_auth(client, key, **{"X-RateLimit-Service": "search"})
    assert search.status_code == 200 and parse_ietf(search.headers["RateLimit"])["minute"]["r"] == 2
    assert [forward_auth(client, key).status_code for _ in range(3)] == [200, 200, 429]
    assert forward_auth(client, key).json()["policy"] == "minute"


def test_the_cost_header_charges_that_many_units(client: Client) -> None:
    tier = make_tier("costly", [("minute", "fixed_window", 10, 60, None, "")])
    key = make_key(tier)
    assert forward_auth(client, key, **{"X-RateLimit-Cost": "7"}).headers["X-RateLimit-Remaining"] == "3"
    refused = forward_auth(client, key, **{"X-RateLimit-Cost": "4"})
    assert refused.status_code == 429
    assert forward_auth(client, key).headers["X-RateLimit-Remaining"] == "2"  # the refusal charged nothing


@pytest.mark.parametrize(("headers", "message"), [
    ({"X-Forwarded-Uri": ""}, "send X-Forwarded-Method and X-Forwarded-Uri"),
    ({"X-Forwarded-Uri": "orders"}, "is not a request URI"),
    ({"X-Forwarded-Method": "GET /x"}, "is not an HTTP method"),
    ({"X-RateLimit-Cost": "0"}, "must be a whole number from 1 to 1000000000"),
    ({"X-RateLimit-Cost": "-3"}, "must be a whole number from 1"),
    ({"X-RateLimit-Service": "orders/v2"}, "must be 1-30 letters, digits"),
])
def test_a_description_that_cannot_be_read_is_400(client: Client, headers: dict[str, str], message: str) -> None:
    seed_tiers()
    answer = forward_auth(client, make_key("free"), **headers)
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_envoy_ext_authz_sends_the_original_method_and_path(client: Client, settings: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("active", "shed", "last_shed"):  # the shedding episode this test starts ends with it
        monkeypatch.setattr(shedding.fleet_episode, name, getattr(shedding.fleet_episode, name))
    use(settings, SHED_CAPACITY=10, SHED_LOW_AT=0.1, SHED_PRIORITIES={"/reports/": "low"})
    seed_tiers()
    key = make_key("pro")
    held = ext_authz(client, key, path="/reports/2026?format=csv", method="POST")  # no CSRF token needed
    assert held.status_code == 200 and held.headers["X-RateLimit-Tier"] == "pro"
    # the fleet count's low threshold is 1: the described path picked the low priority, and sheds the next
    shed = ext_authz(client, key, path="/reports/2027")
    assert shed.status_code == 503 and shed.json()["error"] == "service overloaded: request shed"
    normal = ext_authz(client, key, path="/")
    assert normal.status_code == 200  # a normal priority is still admitted
    assert release(client, held) == 204 and release(client, normal) == 204
    assert ext_authz(client, key, path="/reports/2027").status_code == 200


@pytest.mark.parametrize("sent", [
    "/checkout/../export/x",            # read as the gateway routes it: /export/x
    "/checkout/%2e%2e/export/x",        # percent-encoded dots
    "/checkout/%2E%2E%2Fexport/x",      # and slashes
    "/checkout%2F..%2Fexport/x",
    "/checkout//../export/x",           # a repeated slash (nginx merges them)
    "//checkout/../export/x?a=1",       # a path that starts with "//" is a path, not a host
    "//export/checkout/x",
    "/export/../checkout/x",            # read as sent it is under /export: no priority gained
    "/export/%2e%2e/checkout/x",
])
@pytest.mark.parametrize("contract", ["authorize", "auth-request", "envoy"])
def test_a_described_path_gets_no_priority_from_dot_segments_or_encodings(
        client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch, sent: str, contract: str) -> None:
    for name in ("active", "shed", "last_shed"):  # the shedding episode this test starts ends with it
        monkeypatch.setattr(shedding.fleet_episode, name, getattr(shedding.fleet_episode, name))
    use(settings, SHED_CAPACITY=10, SHED_LOW_AT=0.1, SHED_PRIORITIES={"/checkout": "critical", "/export": "low"})
    seed_tiers()
    key = make_key("pro")

    def ask(uri: str) -> int:
        if contract == "authorize":
            return forward_auth(client, key, uri=uri).status_code
        if contract == "envoy":
            return ext_authz(client, key, path=uri).status_code
        answer = auth_request(client, key, uri=uri)
        return int(answer.headers.get("X-RateLimit-Status", answer.status_code))

    held = forward_auth(client, key, uri="/export/report")  # holds the one low-priority slot
    assert held.status_code == 200
    assert ask("/export/x") == 503 and ask("/checkout/x") == 200  # critical: counted, never shed
    assert ask(sent) == 503


def test_nginx_gets_every_refusal_as_a_403_carrying_it(client: Client) -> None:
    seed_tiers()
    key = make_key("free")
    for _ in range(10):
        admitted = auth_request(client, key)
        assert admitted.status_code == 200 and release(client, admitted) == 204
    refused = auth_request(client, key)
    assert refused.status_code == 403 and refused.headers["X-RateLimit-Status"] == "429"
    body = json.loads(refused.headers["X-RateLimit-Body"])
    assert (body["error"], body["policy"]) == ("rate limit exceeded", "burst")
    assert refused.headers["Retry-After"] and parse_ietf(refused.headers["RateLimit"])["burst"]["r"] == 0
    unknown = auth_request(client, key[:-4] + "AAAA")
    assert (unknown.status_code, unknown.headers["X-RateLimit-Status"]) == (403, "401")
    assert unknown.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    unreadable = auth_request(client, key, uri="")
    assert (unreadable.status_code, unreadable.headers["X-RateLimit-Status"]) == (403, "400")
    assert "X-Original-Method and X-Original-URI" in json.loads(unreadable.headers["X-RateLimit-Body"])["error"]


def test_problem_details_travel_to_nginx_as_well(client: Client, settings: Any) -> None:
    use(settings, ERROR_FORMAT="problem")
    seed_tiers()
    refused = auth_request(client, "not-a-key")
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert json.loads(refused.headers["X-RateLimit-Body"])["detail"] == "malformed API key"


def test_a_deny_rule_is_403(client: Client) -> None:
    seed_tiers()
    ClientRule.objects.create(action="deny", network="203.0.113.0/24")
    denied = forward_auth(client, make_key("free"))
    assert denied.status_code == 403 and "refused by an access rule" in denied.json()["error"]


def test_redis_down_follows_the_fail_mode(client: Client, settings: Any) -> None:
    seed_tiers()
    key = make_key("free")
    use(settings, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", FAIL_MODE="closed", BUDGET_MS=200,
        SOCKET_CONNECT_TIMEOUT=0.1)
    closed = auth_request(client, key)
    assert (closed.status_code, closed.headers["X-RateLimit-Status"]) == (403, "503")
    assert json.loads(closed.headers["X-RateLimit-Body"])["error"] == "rate limiter unavailable"
    use(settings, FAIL_MODE="open")
    assert forward_auth(client, key).status_code == 200


def test_one_redis_command_per_decision(client: Client, settings: Any) -> None:
    """Counted with MONITOR on a private Redis: what clients send, not what runs inside the script."""
    server = start_redis()
    try:
        use(settings, REDIS_URL=server.url, METRICS_ENABLED=False)
        seed_tiers()
        add_slots("free", 2)  # a tier with a slot to give back (the seeded tiers have none)
        key = make_key("free")
        warm = forward_auth(client, key)  # loads the script, caches the key and the tier
        assert release(client, warm) == 204
        spy = redis.Redis.from_url(server.url)
        spy.ping()
        seen: list[str] = []
        with redis.Redis.from_url(server.url).monitor() as monitor:
            nginx = auth_request(client, key)
            spy.execute_command("ECHO", "between")
            assert release(client, nginx) == 204
            spy.execute_command("ECHO", "between")
            admitted = forward_auth(client, key)
            spy.execute_command("ECHO", "between")
            assert confirm(client, admitted) == 204
            spy.execute_command("ECHO", "between")
            assert release(client, admitted) == 204
            spy.execute_command("ECHO", "end-of-test")
            while True:
                # MONITOR's lines read here, not by redis-py's parser, which returned an empty command for
                # one of them under redis-py 5.0; a line is <time> [<db> <client>] "<command>" "<arg>"...
                line = monitor.connection.read_response()
                line = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                matched = re.match(r'\S+ \[\d+ (\S+)\] "([^"]*)"', line)
                assert matched is not None, line
                caller, command = matched.groups()
                if command == "ECHO" and '"end-of-test"' in line:
                    break
                if caller != "lua":
                    seen.append(command)
        # one EVALSHA decided the per-IP limit and the four limits of the tier, its slot taken (nginx: for
        # its full lease); the release gave the slot back in one more round trip. Under the authorize
        # contract one EVAL more made its lease the first lease, and the confirmation one more
        assert seen == ["EVALSHA", "ECHO", "ZREM", "ECHO", "EVALSHA", "EVAL", "ECHO", "EVAL", "ECHO", "ZREM"]
        assert parse_ietf(admitted.headers["RateLimit"]).keys() == {"ip", "burst", "minute", "concurrency", "day"}
        spy.close()
    finally:
        server.stop()


def test_an_untrusted_gateway_is_reported_once(client: Client, settings: Any, caplog: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    use(settings, TRUSTED_PROXIES=0)
    seed_tiers()
    key = make_key("free")
    monkeypatch.setattr(views, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        for _ in range(2):
            assert forward_auth(client, key).headers["X-RateLimit-Tier"] == "free"
    warnings = [r for r in caplog.records if getattr(r, "ratelimit_event", "") == "ratelimit.gateway_untrusted"]
    assert len(warnings) == 1 and warnings[0].ratelimit["gateway"] == "127.0.0.1"


# -- the first lease: a request behind a gateway with no end-of-request hook, until its service confirms it

def lease_ends_in_ms(redis_client: redis.Redis, key_prefix: str, answer: Answer, policy: str = "concurrency") -> float:
    """Milliseconds until the slot of `policy` that `answer`'s lease names ends, by Redis' clock (<= 0:
    ended, or not held)."""
    slots = slots_of(answer.headers["X-RateLimit-Lease"])
    [(identity, held)] = [(identity, held) for identity, held in slots.held if held.name == policy]
    [key] = state_keys(key_prefix, identity, (held,))
    score = redis_client.zscore(key, slots.token)
    seconds, micros = redis_client.time()
    return -1.0 if score is None else (score - (seconds * 1_000_000 + micros)) / 1000


def test_authorize_holds_the_slots_for_the_first_lease_until_the_service_confirms(
        client: Client, settings: Any, redis_client: redis.Redis, key_prefix: str) -> None:
    use(settings, GATEWAY_FIRST_LEASE=3)
    seed_tiers()
    add_slots("free", 2)
    key = make_key("free")
    caddy = forward_auth(client, key)
    assert caddy.status_code == 200
    assert 2000 < lease_ends_in_ms(redis_client, key_prefix, caddy) <= 3000
    assert confirm(client, caddy) == 204  # the request reached the service: its full lease from now
    assert 59_000 < lease_ends_in_ms(redis_client, key_prefix, caddy) <= 60_000
    assert confirm(client, caddy) == 204  # a second confirmation only renews it again
    # nginx reports every end itself (post_action): its requests hold their full lease from the start
    nginx = auth_request(client, key)
    assert nginx.status_code == 200 and 59_000 < lease_ends_in_ms(redis_client, key_prefix, nginx) <= 60_000
    assert release(client, caddy) == 204 and release(client, nginx) == 204
    # with no first lease, authorize holds the full lease too
    use(settings, GATEWAY_FIRST_LEASE=None)
    whole = forward_auth(client, key)
    assert 59_000 < lease_ends_in_ms(redis_client, key_prefix, whole) <= 60_000
    assert release(client, whole) == 204


def test_a_confirmation_after_the_first_lease_ended_is_409_and_takes_no_slot_again(
        client: Client, settings: Any, redis_client: redis.Redis, key_prefix: str) -> None:
    use(settings, GATEWAY_FIRST_LEASE=0.1, SHED_CAPACITY=100)  # each request holds a fleet slot too
    seed_tiers()
    add_slots("free", 2)
    key = make_key("free")
    gone = forward_auth(client, key)  # its client went away: the service never gets it ...
    assert gone.status_code == 200
    assert lease_ends_in_ms(redis_client, key_prefix, gone, "shed") <= 100
    while lease_ends_in_ms(redis_client, key_prefix, gone) > 0:
        pass  # Redis' clock, read until its first lease has ended
    use(settings, GATEWAY_FIRST_LEASE=5)
    held = [forward_auth(client, key) for _ in range(2)]  # ... so both slots are free for others
    assert [answer.status_code for answer in held] == [200, 200]
    assert [confirm(client, answer) for answer in held] == [204, 204]
    late = client.post("/ratelimit/confirm", headers={"X-RateLimit-Lease": gone.headers["X-RateLimit-Lease"]})
    assert late.status_code == 409 and json.loads(late.content)["error"] == "lease ended"
    assert lease_ends_in_ms(redis_client, key_prefix, gone, "shed") <= 0  # no slot of any kind taken again
    refused = forward_auth(client, key)
    assert refused.status_code == 429 and refused.json()["policy"] == "concurrency"
    assert release(client, held[0]) == 204 and forward_auth(client, key).status_code == 200


def test_a_confirmation_is_guarded_and_needs_a_lease_signed_here(client: Client) -> None:
    assert client.post("/ratelimit/confirm").status_code == 204  # no lease: nothing to confirm
    forged = client.post("/ratelimit/confirm", headers={"X-RateLimit-Lease": "eyJ0IjoiYSJ9:forged"})
    assert forged.status_code == 400
    outsider = client.post("/ratelimit/confirm", headers={"X-RateLimit-Lease": "x"}, REMOTE_ADDR="198.51.100.9")
    assert outsider.status_code == 403 and json.loads(outsider.content)["error"] == "forbidden"


def test_a_confirmation_redis_cannot_answer_is_204_and_the_slots_keep_their_first_lease(
        client: Client, settings: Any, redis_client: redis.Redis, key_prefix: str) -> None:
    use(settings, GATEWAY_FIRST_LEASE=5)
    seed_tiers()
    add_slots("free", 2)
    answer = forward_auth(client, make_key("free"))
    use(settings, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", FAIL_MODE="open")
    assert confirm(client, answer) == 204  # the service goes on; nothing to refuse it for
    assert 0 < lease_ends_in_ms(redis_client, key_prefix, answer) <= 5000


def tokens_key(slug: str) -> str:
    """A key of a tier of 100 requests and 1,000 tokens a minute (an exact sliding window)."""
    tier = make_tier(slug, [("minute", "fixed_window", 100, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="tokens", algorithm="sliding_window", limit=1000, period=60,
                             unit="tokens")
    return make_key(tier)


def release_with_usage(client: Client, answer: Answer, used: str) -> int:
    """The service's release of an admitted request, with what it used."""
    sent = {"X-RateLimit-Lease": answer.headers.get("X-RateLimit-Lease", ""), "X-RateLimit-Usage": used}
    return int(client.post("/ratelimit/release", headers=sent).status_code)


def test_an_estimate_is_reserved_at_authorization_and_settled_by_the_release(client: Client) -> None:
    key = tokens_key("gwtokens")
    statuses = []
    for _ in range(10):
        answer = forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=500"})
        statuses.append(answer.status_code)
        if answer.status_code == 200:
            assert answer.headers["X-RateLimit-Lease"]  # the reservation, though no slot was taken
            assert release_with_usage(client, answer, "tokens=100") == 204
    # as the middleware: 6 admitted (5 x 100 used and 500 reserved fit in 1,000; a 7th would need 500 more
    # than the 400 left), every reservation settled exactly at the 100 used
    assert statuses == [200] * 6 + [429] * 4
    assert forward_auth(client, key).status_code == 200  # a request without an estimate: no usage limit


def test_a_release_that_never_comes_leaves_the_estimate_charged(client: Client) -> None:
    key = tokens_key("gwunreleased")
    assert forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=500"}).status_code == 200  # never released
    answer = forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=400"})
    assert answer.status_code == 200
    assert release(client, answer) == 204  # released without a usage header: its 400 stay charged too
    assert forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=101"}).status_code == 429
    assert forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=100"}).status_code == 200


@pytest.mark.parametrize("value", ["tokens=0", "tokens=-5", "tokens=abc", "tokens", "Tokens=5", "tokens=5,tokens=6"])
def test_an_estimate_that_cannot_be_read_is_400(client: Client, value: str) -> None:
    answer = forward_auth(client, tokens_key("gwbad"), **{"X-RateLimit-Usage": value})
    assert answer.status_code == 400 and "X-RateLimit-Usage" in answer.json()["error"]


def test_a_usage_report_that_cannot_be_read_is_400_and_the_estimate_stays_charged(client: Client) -> None:
    key = tokens_key("gwbadreport")
    answer = forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=600"})
    assert release_with_usage(client, answer, "tokens=-1") == 400
    assert release_with_usage(client, answer, "tokens=0") == 204  # what it used: nothing
    assert forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=1000"}).status_code == 200


def test_a_replayed_release_settles_nothing_more(client: Client) -> None:
    key = tokens_key("gwreplay")
    answer = forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=500"})
    assert [release_with_usage(client, answer, "tokens=100") for _ in range(3)] == [204] * 3
    # 100 used (settled once: a replay would have given 400 back again); 900 more fit, then nothing
    assert forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=900"}).status_code == 200
    assert forward_auth(client, key, **{"X-RateLimit-Usage": "tokens=1"}).status_code == 429
