"""`make test` runs two workers with --dist loadgroup, so that the tests of a file marked xdist_group run on one worker
and its expensive fixture (the server, the wheel) is built once. pytest 9.2 under pytest-xdist 3.8 silently split the
groups (9.2 renamed Item._nodeid, where xdist writes a test's group): the server then started on both workers."""

import pytest


@pytest.mark.xdist_group("groups")
def test_a_marked_test_runs_in_its_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("checks make test's workers (pytest -n 2 --dist loadgroup)")
    assert request.node.nodeid.endswith("@groups"), request.node.nodeid
