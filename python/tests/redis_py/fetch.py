"""Fetch redis-py's own lock tests (from the source distribution of the
installed redis-py) into a scratch directory, beside this directory's
conftest files, so that they run against warden's locks:

    python tests/redis_py/fetch.py DIR && python -m pytest DIR
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
FILES = {
    "tests/test_lock.py": "test_lock.py",
    "tests/test_asyncio/test_lock.py": "test_asyncio/test_lock.py",
}


def main(root: Path) -> None:
    target = root / "tests"  # a package named as in redis-py: its modules import .conftest
    marker = root / ".redis-version"
    if marker.exists() and marker.read_text() == redis.__version__:
        return
    shutil.rmtree(root, ignore_errors=True)
    (target / "test_asyncio").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                download,
                f"redis=={redis.__version__}",
            ],
            check=True,
        )
        (sdist,) = Path(download).glob("redis-*.tar.gz")
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                inner = member.name.split("/", 1)[-1]
                if inner in FILES:
                    source = archive.extractfile(member)
                    assert source is not None
                    (target / FILES[inner]).write_bytes(source.read())
    for name in FILES.values():
        assert (target / name).exists(), f"{name} is not in redis-py {redis.__version__}'s sdist"
    shutil.copy(HERE / "conftest_sync.py", target / "conftest.py")
    shutil.copy(HERE / "conftest_asyncio.py", target / "test_asyncio" / "conftest.py")
    shutil.copy(HERE / "pytest.ini", root / "pytest.ini")
    (target / "__init__.py").write_text("")
    (target / "test_asyncio" / "__init__.py").write_text("")
    marker.write_text(redis.__version__)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
