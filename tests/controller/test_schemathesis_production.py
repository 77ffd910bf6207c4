"""schemathesis over HTTP against the production shape, as a second user: daphne with
``controller.settings.production`` on this test run's PostgreSQL database and a private
Redis, bob logged in through the real form, alice owning every stored experiment and run.
Every documented operation with positive and negative data, each case sent twice: as
generated, and with its path ids pointed at alice's objects (they must stay 4xx).

Three phases on one server: the services up (no 5xx at all), PostgreSQL backends
terminated every 50 ms, Redis stopped. Under a fault the only 5xx allowed is the
documented outage answer: 503, ``Retry-After``, JSON ``{"errors": {"service": ...}}``
(docs/controller-faults.md, "Outages"); a 500 or a traceback in daphne's log fails the test."""

import re
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from controller.models import Experiment, Run

from .conftest import QUICKSTART, make_run, store_metrics, store_spans
from .faults import BackendTerminator, ProductionWeb, production_password
from .faults import redis_server  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
EXAMPLES = 6  # per operation, mode and phase: 14 operations x 2 modes x up to 3 sends x 3 phases
PATH_IDS = re.compile(r"\{(run_id|experiment_id)\}")


@pytest.fixture
def web(redis_server, tmp_path):  # noqa: F811
    """The production daphne without the connection pool: a connection per request, so each of
    the hundreds of requests sent while backends are terminated every 50 ms fails fast (through
    the pool each waited for a live connection: 75 s became 340 s). The pool under a flapping
    database is test_outages' and test_connections_load's."""
    server = ProductionWeb(redis_server.url, tmp_path / "runs", tmp_path / "daphne.log", env={"THUNDERSYNC_DB_POOL_MAX": "0"})
    yield server
    server.stop()


@pytest.fixture
def bob(bob):
    """bob's password hashed with a hasher production accepts (the test settings use MD5)."""
    return production_password(bob, "bob-password")


@pytest.fixture
def alices_ids(alice_run, sync_preset) -> dict[str, int]:
    """What a second user must not reach: alice's runs (one with spans and metrics) and experiments."""
    store_spans(alice_run, 40)
    store_metrics(alice_run)
    other = make_run(Experiment.objects.create(owner=alice_run.experiment.owner, name="second", config=QUICKSTART),
                     sync_preset)
    return {"run_id": alice_run.pk, "experiment_id": other.experiment_id}


@pytest.fixture
def bobs_ids(bob_run, sync_preset) -> dict[str, int]:
    """bob's own run (spans, metrics) and experiment, and a preset he may launch with: the
    paths that read and write real rows (a launch reaches the broker)."""
    store_spans(bob_run, 40)
    store_metrics(bob_run)
    return {"run_id": bob_run.pk, "experiment_id": bob_run.experiment_id, "experiment": bob_run.experiment_id,
            "schedule": sync_preset.pk}


def outage_answer(response) -> bool:
    """503 with Retry-After and the JSON reason (schemathesis' headers: lowercase keys, list values)."""
    if response.status_code != 503 or not "".join(response.headers.get("retry-after", [])).isdigit():
        return False
    try:
        return "service" in response.json()["errors"]
    except (ValueError, KeyError, TypeError):
        return False


def no_queued_runs(user) -> None:
    """Take the runs a phase queued off the queue (no worker starts them here), so the next
    phase's launches meet the queued-runs quota with room and reach the broker."""
    Run.objects.filter(experiment__owner=user, status=Run.Status.QUEUED).update(status=Run.Status.CANCELLED)


def with_ids(values: dict | None, ids: dict[str, int]) -> dict:
    """``values`` with the fields ``ids`` names set to those ids."""
    values = dict(values or {})
    return {**values, **{k: v for k, v in ids.items() if k in values}}


class Fuzzer:
    """Sends every operation's generated cases to the server in bob's session."""

    def __init__(self, web: ProductionWeb, session: requests.Session, alices_ids: dict[str, int],
                 bobs_ids: dict[str, int]):
        self.web, self.session, self.alices_ids, self.bobs_ids = web, session, alices_ids, bobs_ids
        listed = session.get(web.url + "/api/openapi.json", timeout=30)
        assert listed.status_code == 200, listed.text[-1000:]
        self.schema = schemathesis.openapi.from_dict(listed.json())

    def send(self, case) -> requests.Response:
        # the session's cookies and CSRF headers explicitly: the transport sends a case's own
        # cookies in place of the session's jar
        return case.call(base_url=self.web.url, session=self.session, cookies=self.session.cookies.get_dict(),
                         headers=dict(self.session.headers), timeout=60, allow_redirects=False)

    def phase(self, name: str, allowed) -> Counter:
        """Run every operation; ``allowed(response)`` says whether a 5xx is acceptable."""
        statuses, failures = Counter(), []
        for result in self.schema.get_all_operations():
            operation = result.ok()
            label = f"{operation.method.upper()} {operation.path}"
            probes_alice = bool(PATH_IDS.search(operation.path))
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                          suppress_health_check=list(HealthCheck))
                def check(case):
                    sends = [("generated", self.send(case))]
                    if probes_alice:
                        case.path_parameters = with_ids(case.path_parameters, self.alices_ids)
                        sends.append(("alice's ids", self.send(case)))
                        case.path_parameters = with_ids(case.path_parameters, self.bobs_ids)
                        sends.append(("bob's ids", self.send(case)))
                    elif isinstance(case.body, dict) and "experiment" in case.body:  # a launch of bob's
                        case.body = with_ids(case.body, self.bobs_ids)
                        sends.append(("bob's ids", self.send(case)))
                    for how, response in sends:
                        statuses[response.status_code] += 1
                        if response.status_code >= 500 and not allowed(response):
                            failures.append(f"{name}: {label} ({mode.value}, {how}) -> {response.status_code}: "
                                            f"{case.path_parameters} {case.query} {str(case.body)[:200]}\n"
                                            f"{response.text[-600:]}")
                        if how == "alice's ids" and response.status_code == 200 and operation.method == "get":
                            failures.append(f"{name}: {label} answered 200 to bob for alice's {case.path_parameters}")

                check()
        assert not failures, "\n\n".join(failures[:10]) + f"\n({len(failures)} failures; statuses {dict(statuses)})"
        print(f"{name}: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
        return statuses


def test_no_5xx_as_a_second_user_normally_with_a_flapping_database_and_without_redis(
        web, redis_server, bob, alices_ids, bobs_ids):
    session = web.login("bob", "bob-password")
    fuzzer = Fuzzer(web, session, alices_ids, bobs_ids)

    normal = fuzzer.phase("services up", allowed=lambda response: False)
    # bob was served (not 401s), alice's ids were refused as missing
    assert normal[200] > 20 and normal[404] > 20 and normal[401] == 0, normal

    no_queued_runs(bob)
    with BackendTerminator(0.05) as terminator:
        fuzzer.phase("database flapping", allowed=outage_answer)
    assert terminator.terminated > 0  # the fault hit daphne's connections

    no_queued_runs(bob)
    redis_server.crash()
    without_redis = fuzzer.phase("redis down", allowed=outage_answer)
    assert without_redis[503] > 0, without_redis  # launches met the broker down

    log = web.log_path.read_text()
    assert "Internal Server Error" not in log and "Traceback" not in log, log[log.find("Traceback") - 500:][:4000]
