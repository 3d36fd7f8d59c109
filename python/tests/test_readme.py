"""The README's Python section runs as written (against REDIS_URL)."""

from __future__ import annotations

import os
import subprocess
import sys

from servers import ROOT, Server, free_ports


def python_section() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```python\n")[1:]
    return "".join(block.split("```", 1)[0] for block in blocks)


def test_the_readme_python_section_runs_as_written() -> None:
    server = Server(free_ports(1, 7120)[0])
    try:
        env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{server.port}")
        out = subprocess.run(
            [sys.executable, "-c", python_section()], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert "with fence" in out.stdout
    finally:
        server.stop()
