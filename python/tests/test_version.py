"""One version for the Python package and the Rust crates: the Rust workspace's
(``[workspace.package] version`` in the repository's Cargo.toml) is the one to change, and
``model_trace.__version__`` (which pyproject.toml reads as the package's version) must equal it."""

import importlib.metadata
import os
import re

import pytest

import model_trace

CARGO_TOML = os.path.join(os.path.dirname(__file__), "..", "..", "Cargo.toml")


def workspace_version(text: str) -> str:
    """``version`` of the ``[workspace.package]`` table of a Cargo.toml."""
    table = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    assert table, "Cargo.toml has no [workspace.package] table"
    version = re.search(r'^version\s*=\s*"([^"]+)"', table.group(1), re.M)
    assert version, "[workspace.package] has no version"
    return version.group(1)


def test_the_package_has_the_crates_version():
    if not os.path.exists(CARGO_TOML):
        pytest.skip(f"no {CARGO_TOML}: these tests run outside the repository")
    with open(CARGO_TOML) as file:
        assert model_trace.__version__ == workspace_version(file.read())


def test_the_installed_distribution_has_the_modules_version():
    try:
        installed = importlib.metadata.version("model-trace")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("model-trace is not installed (imported from the source tree)")
    assert installed == model_trace.__version__


def test_workspace_version_reads_the_workspace_table():
    text = '[package]\nversion = "9.9.9"\n\n[workspace.package]\nedition = "2021"\nversion = "1.2.3"\n\n[x]\nversion = "0"\n'
    assert workspace_version(text) == "1.2.3"
