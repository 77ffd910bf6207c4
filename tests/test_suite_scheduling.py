"""The suite's own scheduling: ``./run test`` (``--dist loadgroup``) keeps the tests that share a
module-scoped setup on one worker (tests/conftest.py marks them), so that setup runs once.
A pytest or pytest-xdist upgrade that drops the group tag splits them silently, doubling
the slow setups and putting concurrent runs side by side; this test notices."""

import os

import pytest


@pytest.fixture(scope="module")
def module_setup():
    return os.environ.get("PYTEST_XDIST_WORKER")


@pytest.mark.parametrize("member", range(2))
def test_tests_sharing_a_module_fixture_carry_their_group_tag_under_loadgroup(module_setup, member, request):
    if not getattr(request.config.option, "loadgroup", False):  # set in xdist's workers under --dist loadgroup
        pytest.skip("only ./run test's --dist loadgroup tags groups")
    assert request.node.get_closest_marker("xdist_group").args == (__name__,)
    assert request.node.nodeid.endswith(f"@{__name__}"), "pytest-xdist did not tag the group into the node id"
    assert module_setup == os.environ["PYTEST_XDIST_WORKER"]  # set up on this worker, not another
