"""The same kit in Django's TestCase (RateLimitTestMixin), run by pytest and by Django's own test runner."""

from __future__ import annotations

from django.test import TestCase

from ratelimit_app.testing import RateLimitTestMixin, assert_limited, assert_not_limited, make_api_key


class ProductTests(RateLimitTestMixin, TestCase):
    def setUp(self):
        super().setUp()
        self.key = make_api_key("free")

    def test_the_eleventh_request_waits_for_the_bucket(self):
        for _ in range(10):
            assert_not_limited(self.client.get("/api/products", HTTP_X_API_KEY=self.key))
        assert_limited(self.client.get("/api/products", HTTP_X_API_KEY=self.key), policy="burst")
        self.ratelimit.advance(3)
        assert_not_limited(self.client.get("/api/products", HTTP_X_API_KEY=self.key))

    def test_every_test_starts_afresh(self):
        for _ in range(10):
            assert_not_limited(self.client.get("/api/products", HTTP_X_API_KEY=self.key))

    async def test_async_views_in_an_async_test(self):
        for _ in range(2):
            assert_not_limited(await self.async_client.get("/quote"))
        assert_limited(await self.async_client.get("/quote"), policy="quote")
        self.ratelimit.advance(60)
        assert_not_limited(await self.async_client.get("/quote"))
