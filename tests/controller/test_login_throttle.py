"""Login throttling: per (account, address) and per address with a cool-down, on the site's
and the admin's login; the owner is never locked out by someone else's failures, and logins
work while the cache (Redis) is down."""

import logging

import pytest
from django.core.cache import cache
from django.test import Client

from controller.limits import login_throttle

pytestmark = pytest.mark.django_db
LOGIN = "/accounts/login/"


@pytest.fixture(autouse=True)
def fresh_counters():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def clock(monkeypatch):
    """The throttle's clock, moved by the test (cool-downs of minutes, checked in no time)."""
    now = [1_000_000.0]
    monkeypatch.setattr(login_throttle.time, "time", lambda: now[0])
    return now


def attempt(client, username, password, url=LOGIN):
    return client.post(url, {"username": username, "password": password})


def test_an_attacker_is_throttled_while_the_owner_logs_in_from_her_address(alice, clock):
    attacker = Client(REMOTE_ADDR="203.0.113.5")
    answers = [attempt(attacker, "alice", f"wrong-{i}").status_code for i in range(30)]
    assert answers[:5] == [200] * 5  # the form again, with "enter a correct username and password"
    assert answers[5:] == [429] * 25  # within the cool-down: refused without checking the password
    refused = attempt(attacker, "alice", "alice-password")
    assert refused.status_code == 429 and b"Too many failed logins for this account from your address" in refused.content
    owner = Client(REMOTE_ADDR="198.51.100.7")
    assert attempt(owner, "alice", "alice-password").status_code == 302
    assert owner.session["_auth_user_id"] == str(alice.pk)


def test_the_cool_down_ends_and_doubles_with_each_further_failure(alice, clock, settings):
    client = Client(REMOTE_ADDR="203.0.113.5")
    for i in range(5):
        attempt(client, "alice", f"wrong-{i}")
    cooldown = settings.THUNDERSYNC_LOGIN_COOLDOWN_S
    clock[0] += cooldown - 1
    assert attempt(client, "alice", "wrong").status_code == 429
    clock[0] += 2
    assert attempt(client, "alice", "wrong-again").status_code == 200  # one more try, failed
    clock[0] += cooldown + 1
    assert attempt(client, "alice", "alice-password").status_code == 429  # now twice as long
    clock[0] += cooldown
    assert attempt(client, "alice", "alice-password").status_code == 302  # even the same address


def test_one_address_trying_many_accounts_is_throttled(bob, clock, settings):
    settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS = 8
    client = Client(REMOTE_ADDR="10.0.0.9")
    answers = [attempt(client, f"user{i}", "guess").status_code for i in range(10)]
    assert answers == [200] * 8 + [429] * 2
    assert b"for your address" in attempt(client, "bob", "bob-password").content
    assert attempt(Client(REMOTE_ADDR="10.0.0.10"), "bob", "bob-password").status_code == 302


def test_a_success_resets_the_pair_counter(alice, clock):
    client = Client()
    for i in range(4):
        attempt(client, "alice", f"wrong-{i}")
    assert attempt(client, "alice", "alice-password").status_code == 302
    for i in range(4):
        assert attempt(Client(), "alice", f"wrong-again-{i}").status_code == 200


def test_the_admin_login_answers_429_when_throttled(django_user_model, clock):
    django_user_model.objects.create_superuser("root", password="root-password")
    client = Client()
    for i in range(5):
        assert attempt(client, "root", f"wrong-{i}", url="/admin/login/").status_code == 200
    response = attempt(client, "root", "root-password", url="/admin/login/")
    assert response.status_code == 429 and b"Too many failed logins" in response.content
    assert "_auth_user_id" not in client.session
    assert attempt(Client(REMOTE_ADDR="10.1.1.1"), "root", "root-password", url="/admin/login/").status_code == 302


def test_behind_a_proxy_the_configured_header_names_the_client(bob, clock, settings):
    settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    settings.THUNDERSYNC_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    proxy = "10.9.9.9"
    attacker = Client(REMOTE_ADDR=proxy, HTTP_X_REAL_IP="203.0.113.5")
    assert [attempt(attacker, f"user{i}", "guess").status_code for i in range(4)] == [200, 200, 200, 429]
    # Another client through the same proxy is not locked out with the attacker.
    assert attempt(Client(REMOTE_ADDR=proxy, HTTP_X_REAL_IP="198.51.100.7"), "bob", "bob-password").status_code == 302


def test_logins_work_while_redis_is_down(alice, settings, caplog):
    """The production cache backend (Redis) pointed at a port nothing listens on: the
    throttle fails open with a warning, the right password logs in, a wrong one is a 200 form."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:9/0"}}
    with caplog.at_level(logging.WARNING, logger="controller.limits.login_throttle"):
        assert attempt(Client(), "alice", "wrong").status_code == 200
        assert attempt(Client(), "alice", "alice-password").status_code == 302
    assert "the cache is unreachable" in caplog.text
