"""`make test` runs two workers with --dist loadgroup, so that the tests of a file marked xdist_group run on one worker
and its expensive fixture (the server, the wheel) is built once. pytest 9.2 under pytest-xdist 3.8 silently split the
groups (9.2 renamed Item._nodeid, where xdist writes a test's group): the server then started on both workers."""

import pytest


@pytest.mark.xdist_group("groups")
def test_a_marked_test_runs_in_its_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("checks make test's workers (pytest -n 2 --dist loadgroup)")
    assert request.node.nodeid.endswith("@groups"), request.node.nodeid


def test_the_tests_that_read_the_shared_onnx_export_run_in_the_serve_group(request):
    """tests/conftest.py puts every test that reads `smoke_onnx` in the serve group, where the server's int8 test reads
    it too: the export is made once a session instead of once on each worker."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("checks make test's workers (pytest -n 2 --dist loadgroup)")
    readers = [item for item in request.session.items if "smoke_onnx" in item.fixturenames]
    assert len(readers) >= 4 and all(item.nodeid.endswith("@serve") for item in readers), readers
