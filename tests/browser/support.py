"""A real browser for page tests: Debian's Chromium driven by Playwright (no browser download).

``scripts/setup-env`` installs Playwright's Python package (the ``dev`` extra); Chromium comes from
Debian (``apt-get install chromium``; ``.ci/run`` installs it). Where either is missing the tests
that need it skip, naming what to install; with ``SWARMNODE_REQUIRE_BROWSER=1`` (CI) they fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# Flags as for any headless Chromium on a closed network: no sandbox (root in CI), no GPU, and none
# of the background connections to Google's hosts that this machine's network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


def chromium_path() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found or next((p for p in CHROMIUM_PATHS if Path(p).exists()), None)


def require_browser() -> str:
    """Chromium's path; skips (fails under ``SWARMNODE_REQUIRE_BROWSER=1``) if it cannot run here."""
    missing = []
    path = chromium_path()
    if path is None:
        missing.append("Debian's chromium (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright's Python package (scripts/setup-env installs it)")
    if missing:
        message = "browser tests need " + " and ".join(missing)
        if os.environ.get("SWARMNODE_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    assert path is not None
    return path


@contextmanager
def browser_page(viewport: dict[str, int] = DESKTOP) -> Iterator[Any]:
    """A fresh headless Chromium page (its own profile), closed on exit."""
    from playwright.sync_api import sync_playwright

    path = require_browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            # The page's Content-Security-Policy forbids eval, which Playwright's waiting predicates
            # use; bypassing it here also means the markup tests prove the page itself never turns
            # data into markup (the policy is a second line, checked in tests/node/test_api.py).
            page = browser.new_context(viewport=viewport, bypass_csp=True).new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def wait_loaded(page: Any, draws: int = 1, timeout_s: float = 30.0) -> None:
    """Until the page has drawn ``draws`` documents from /dashboard.json (``body[data-loaded]``)."""
    page.wait_for_function(
        f"Number(document.body.dataset.loaded || 0) >= {int(draws)}", timeout=timeout_s * 1000
    )


def table_rows(page: Any, table_id: str) -> list[tuple[str, list[str]]]:
    """(row class, visible cell texts) of each body row of the table ``table_id``."""
    rows: list[tuple[str, list[str]]] = page.eval_on_selector_all(
        f'[data-table="{table_id}"] tbody tr',
        "rows => rows.map(r => [r.className, [...r.cells].map(c => c.innerText)])",
    )
    return [(cls, list(cells)) for cls, cells in rows]


def chart_points(page: Any, chart_id: str) -> dict[str, int]:
    """Points drawn per series of the chart ``chart_id`` (a polyline's vertices, or one dot)."""
    drawn: dict[str, int] = page.eval_on_selector_all(
        f'[data-chart="{chart_id}"] [data-series]',
        """marks => Object.fromEntries(marks.map(m => [m.dataset.series,
            m.tagName === 'circle' ? 1 : m.getAttribute('points').trim().split(/\\s+/).length]))""",
    )
    return drawn


def overflows_horizontally(page: Any) -> bool:
    """True if the page is wider than its window (a phone user would have to scroll sideways)."""
    return bool(page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1"))
