"""tests/hostile: every test here plays a hostile or careless user (issue 27) and is marked `hostile`.

Run them with `make test-hostile` (CI: .ci/hostile_stage). Each one reproduces a way the trainer could be
made to run foreign code, lose or mix saved work, or fail without naming the cause, and checks what a trusted
system promises instead.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/hostile/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.hostile)
