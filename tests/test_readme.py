"""The README's API tour runs as written."""

from doc_blocks import run_python_blocks


def test_readme_python_blocks_run() -> None:
    run_python_blocks("README.md")
