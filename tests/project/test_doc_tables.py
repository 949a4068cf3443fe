"""The documentation's tables stay honest: what is read from each runtime, the tested clients, the
options, the diagnose verdicts and the gateway's settings each have their row on their page."""

from __future__ import annotations

from pathlib import Path

from otel_llm.config import ENV_VARS
from otel_llm.parse.runtimes import SOURCES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _page(name: str) -> str:
    return (DOCS / name).read_text()


def test_runtime_table_matches_the_adapters() -> None:
    page = _page("runtimes.md")
    for runtime, source in SOURCES.items():
        assert f"| {runtime} | {source} |" in page, runtime


def test_clients_table_is_the_client_matrix() -> None:
    """Each client the matrix test drives has its row, with the versions installed for the tests."""
    from otel_llm_testing.clients import CASES

    rows = [line for line in _page("clients.md").splitlines() if line.startswith("| ") and "|---" not in line]
    start = rows.index("| client | version tested | transport underneath | phases seen |")
    table = rows[start + 1: start + 1 + len(CASES)]
    assert table == [case.table_row() for case in CASES]


def test_every_option_and_variable_is_documented() -> None:
    page = _page("options.md")
    for option, variable in ENV_VARS.items():
        assert f"| `{option}` | `{variable}`" in page, option


def test_every_diagnose_code_is_documented() -> None:
    from otel_llm.tools.diagnose.verdicts import CODES

    page = _page("diagnose.md")
    for code in CODES:
        assert f"| `{code}` |" in page, code


def test_every_gateway_setting_is_documented() -> None:
    from otel_llm.tools.gateway.settings import ENV_VARS as GATEWAY_VARS

    page = _page("gateway.md")
    for setting, variable in GATEWAY_VARS.items():
        assert f"| `{setting}` | `{variable}`" in page, setting


def test_other_languages_table_is_what_the_tests_run() -> None:
    """curl, the openai npm package and Go's net/http, each with the version the proxy's tests use
    (a toolchain not installed yet is installed by those tests, so its row is checked once it is)."""
    from otel_llm_testing.other_clients import TABLE_HEADER, table_rows

    lines = _page("clients.md").splitlines()
    start = lines.index(TABLE_HEADER)
    expected = table_rows()
    table = lines[start + 2: start + 2 + len(expected)]
    assert lines[start + 1] == "|---|---|---|" and lines[start + 2 + len(expected)] == ""
    for row, wanted in zip(table, expected):
        assert wanted is None or row == wanted
    assert [row.split(" | ")[0] for row in table] == ["| curl", "| Node.js `openai`", "| Go `net/http`"]


def test_readme_quotes_the_proxy_cost_of_the_recorded_run() -> None:
    """The README's proxy row gives the added first byte and the ratios to nginx's from the run
    recorded on the performance page, so the two cannot drift apart."""
    import re

    run = _page("performance.md").split("### Gateway, proxy and nginx", 1)[1].split("```text", 1)[1]
    added = re.search(r"^  proxy +([\d.]+) / [\d.]+ +[\d.]+ / [\d.]+ ", run, re.M)
    ratios = re.search(r"proxy / nginx: added median TTFB non-streamed chat ([\d.]+x), streamed chat ([\d.]+x)", run)
    assert added and ratios, run[:2000]
    row = next(line for line in (DOCS.parent / "README.md").read_text().splitlines()
               if line.startswith("| `otel-llm proxy"))
    assert f"adds {float(added[1]):.2f} ms to the first byte on loopback" in row, row
    assert f"{ratios[1]} and {ratios[2]} what nginx adds" in row, row
