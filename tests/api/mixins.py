"""API tests every resource reuses (the NetBox pattern): refuse anonymous callers, CRUD as the
resource allows, and list queries that do not grow with the number of rows.

A subclass sets ``url`` and ``actions`` and implements ``make_rows``, ``create_data`` and
``update_data``; everything else comes from here.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from controlplane.common.permissions import OPERATORS_GROUP

ALL_ACTIONS = frozenset({"list", "retrieve", "create", "update", "delete"})


@pytest.fixture
def user(db):
    # No password: hashing one costs about a second a test on a slow CPU; browsers log in with force_login.
    user = get_user_model().objects.create_user("alice")
    # the resources' writes are an operator's
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    return user


@pytest.fixture
def api(user) -> APIClient:
    """A client authenticated the way scripts are: with a token."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def anonymous(db) -> APIClient:
    return APIClient()


def assert_error(response, status: int, *fragments: str) -> None:
    """The response is a JSON error of this status whose message contains every fragment."""
    assert response.status_code == status, response.content
    message = response.json()["error"]["message"]
    for fragment in fragments:
        assert fragment in message, message


class APIResourceTests:
    url: ClassVar[str]
    actions: ClassVar[frozenset[str]] = ALL_ACTIONS
    # Ceiling for one authenticated list request (auth + count + page + prefetches).
    max_list_queries: ClassVar[int] = 6

    def make_rows(self, n: int) -> list[Model]:
        raise NotImplementedError

    def create_data(self) -> dict[str, Any]:
        raise NotImplementedError

    def update_data(self) -> dict[str, Any]:
        raise NotImplementedError

    def detail_url(self, row: Model) -> str:
        return f"{self.url}{row.pk}/"

    def test_anonymous_requests_are_refused(self, anonymous):
        row = self.make_rows(1)[0]
        for method, url in [
            ("get", self.url), ("post", self.url), ("get", self.detail_url(row)),
            ("patch", self.detail_url(row)), ("delete", self.detail_url(row)),
        ]:
            response = getattr(anonymous, method)(url, {}, format="json")
            assert response.status_code in (401, 403), (method, url, response.status_code)
            assert "credentials were not provided" in response.json()["error"]["message"]
        assert type(row).objects.filter(pk=row.pk).exists()

    def test_list(self, api):
        rows = self.make_rows(3)
        response = api.get(self.url)
        assert response.status_code == 200
        body = response.json()
        assert body["count"] == 3
        assert {item["id"] for item in body["results"]} == {row.pk for row in rows}

    def test_list_is_paginated(self, api):
        self.make_rows(3)
        body = api.get(self.url, {"limit": 2}).json()
        assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]

    def test_retrieve(self, api):
        row = self.make_rows(1)[0]
        response = api.get(self.detail_url(row))
        assert response.status_code == 200 and response.json()["id"] == row.pk
        assert_error(api.get(f"{self.url}999999/"), 404)

    def test_create(self, api):
        data = self.create_data()
        response = api.post(self.url, data, format="json")
        if "create" not in self.actions:
            assert_error(response, 405)
            return
        assert response.status_code == 201, response.content
        self.check_created(response.json(), data)

    def check_created(self, body: dict[str, Any], data: dict[str, Any]) -> None:
        for key, value in data.items():
            assert body[key] == value, key

    def test_update(self, api):
        row = self.make_rows(1)[0]
        data = self.update_data()
        response = api.patch(self.detail_url(row), data, format="json")
        if "update" not in self.actions:
            assert_error(response, 405)
            return
        assert response.status_code == 200, response.content
        stored = api.get(self.detail_url(row)).json()
        for key, value in data.items():
            assert response.json()[key] == stored[key] == value, key

    def test_delete(self, api):
        row = self.make_rows(1)[0]
        response = api.delete(self.detail_url(row))
        if "delete" not in self.actions:
            assert_error(response, 405)
            return
        assert response.status_code == 204
        assert not type(row).objects.filter(pk=row.pk).exists()

    def test_list_queries_do_not_grow_with_rows(self, api):
        self.make_rows(2)
        with CaptureQueriesContext(connection) as few:
            assert api.get(self.url).status_code == 200
        self.make_rows(18)
        with CaptureQueriesContext(connection) as many:
            assert len(api.get(self.url).json()["results"]) == 20
        assert len(many) == len(few) <= self.max_list_queries, [q["sql"] for q in many.captured_queries]
