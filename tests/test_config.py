"""One configuration module: every TORCHNEURON_* variable is parsed there, with one convention,
and docs/CONFIGURATION.md lists exactly the variables it knows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchneuron import config

REPO = Path(__file__).resolve().parent.parent


def test_configuration_doc_lists_every_setting():
    doc = (REPO / "docs" / "CONFIGURATION.md").read_text()
    documented = set(re.findall(r"^\| `(TORCHNEURON_[A-Z_]+)`", doc, flags=re.M))
    assert documented == set(config.SETTINGS)


def test_only_the_config_module_reads_torchneuron_variables():
    offenders = []
    for path in (REPO / "src" / "torchneuron").rglob("*.py"):
        if path.name == "config.py":
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?[\[(]\s*['\"]TORCHNEURON_", text):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders


@pytest.mark.parametrize("value,expected", [
    ("1", True), ("true", True), ("On", True), ("YES", True),
    ("0", False), ("false", False), ("off", False), ("no", False), ("", False),
])
def test_booleans_share_one_convention(monkeypatch, value, expected):
    monkeypatch.setenv("TORCHNEURON_STRICT", value)
    assert config.flag("TORCHNEURON_STRICT") is expected


def test_an_unknown_boolean_value_is_an_error(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_STRICT", "maybe")
    with pytest.raises(ValueError, match="TORCHNEURON_STRICT"):
        config.strict()


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path / "c"))
    assert config.cache_root() == tmp_path / "c"
    monkeypatch.delenv("TORCHNEURON_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert config.cache_root() == tmp_path / "x" / "torchneuron"
