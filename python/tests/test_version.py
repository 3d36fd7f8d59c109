import importlib.metadata

import warden


def test_version_is_the_installed_distributions() -> None:
    assert warden.__version__ == importlib.metadata.version("warden-redis")
    assert warden.__version__ != "0+unknown"
