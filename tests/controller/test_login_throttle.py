"""Login throttling: per account and per client address, on the site's and the admin's login."""

import pytest
from django.core.cache import cache
from django.test import Client

pytestmark = pytest.mark.django_db
LOGIN = "/accounts/login/"


@pytest.fixture(autouse=True)
def fresh_counters():
    cache.clear()
    yield
    cache.clear()


def attempt(client, username, password, url=LOGIN):
    return client.post(url, {"username": username, "password": password})


def test_wrong_passwords_lock_the_account_even_for_the_right_one(alice):
    client = Client()
    answers = [attempt(client, "alice", f"wrong-{i}").status_code for i in range(30)]
    assert answers[:5] == [200] * 5  # the form again, with "enter a correct username and password"
    assert answers[5:] == [429] * 25
    locked = attempt(client, "alice", "alice-password")
    assert locked.status_code == 429
    assert b"Too many failed logins for this account" in locked.content
    assert "_auth_user_id" not in client.session


def test_one_account_locked_leaves_the_others_alone(alice, bob):
    for i in range(6):
        attempt(Client(REMOTE_ADDR="10.0.0.1"), "alice", f"wrong-{i}")
    client = Client(REMOTE_ADDR="10.0.0.2")
    assert attempt(client, "bob", "bob-password").status_code == 302
    assert client.session["_auth_user_id"] == str(bob.pk)


def test_one_address_trying_many_accounts_is_throttled(bob, settings):
    settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS = 8
    client = Client(REMOTE_ADDR="10.0.0.9")
    answers = [attempt(client, f"user{i}", "guess").status_code for i in range(10)]
    assert answers == [200] * 8 + [429] * 2
    assert b"for this address" in attempt(client, "bob", "bob-password").content
    assert attempt(Client(REMOTE_ADDR="10.0.0.10"), "bob", "bob-password").status_code == 302


def test_a_success_resets_the_account_counter(alice):
    client = Client()
    for i in range(4):
        attempt(client, "alice", f"wrong-{i}")
    assert attempt(client, "alice", "alice-password").status_code == 302
    for i in range(4):
        assert attempt(Client(), "alice", f"wrong-again-{i}").status_code == 200


def test_the_admin_login_is_throttled_too(django_user_model):
    django_user_model.objects.create_superuser("root", password="root-password")
    client = Client()
    for i in range(5):
        attempt(client, "root", f"wrong-{i}", url="/admin/login/")
    response = attempt(client, "root", "root-password", url="/admin/login/")
    assert b"Too many failed logins" in response.content
    assert "_auth_user_id" not in client.session


def test_behind_a_proxy_the_configured_header_names_the_client(bob, settings):
    settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    settings.THUNDERSYNC_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    proxy = "10.9.9.9"
    attacker = Client(REMOTE_ADDR=proxy, HTTP_X_REAL_IP="203.0.113.5")
    assert [attempt(attacker, f"user{i}", "guess").status_code for i in range(4)] == [200, 200, 200, 429]
    # Another client through the same proxy is not locked out with the attacker.
    assert attempt(Client(REMOTE_ADDR=proxy, HTTP_X_REAL_IP="198.51.100.7"), "bob", "bob-password").status_code == 302
