"""`corerl plugins` shows each plugin's contract version in its table (--json had it alone)."""

from __future__ import annotations

from corerl import cli
from corerl.hookspecs import CONTRACT_VERSION


def test_the_table_has_a_contract_column(capfd, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["plugins"]) == 0
    out = capfd.readouterr().out
    header = next(line for line in out.splitlines() if "distribution" in line)
    assert [c.strip() for c in header.strip("┃│ ").split("┃")][:5] == ["name", "distribution", "version", "contract",
                                                                      "status"]
    rows = {line.split("│")[1].strip(): line.split("│")[4].strip() for line in out.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["corerl"] == f"{CONTRACT_VERSION} (offered)" and rows["dtensor"] == CONTRACT_VERSION, rows
