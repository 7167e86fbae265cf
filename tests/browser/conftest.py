"""A real Chromium (Debian's, at /usr/bin/chromium) driven by Playwright against the
live Django server. Screenshots go to artifacts/browser/."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
# As the machine notes say: without these, Chromium tries the network at start-up.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("no chromium binary: `make test` installs Debian's chromium package")
    return path


@pytest.fixture
def browser_page(tmp_path):
    """A fresh headless Chromium page; Django's ORM stays usable in the test body while
    Playwright's sync API runs its event loop."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# Elements (by selector) whose text is laid out on more than one line: a button or a node
# name that wrapped. Lines are told apart by the tops of the text's client rects: a top 8 px
# (half a 16 px line) or more below the last one starts a new line, so an icon set a few
# pixels lower beside the text does not count as one.
WRAPPED_JS = """
(selector) => [...document.querySelectorAll(selector)].filter(el => el.getClientRects().length).map(el => {
  const range = document.createRange();
  range.selectNodeContents(el);
  const tops = [...range.getClientRects()].filter(r => r.width > 0).map(r => r.top).sort((a, b) => a - b);
  let lines = tops.length ? 1 : 0;
  for (let i = 1; i < tops.length; i++) if (tops[i] - tops[i - 1] >= 8) lines++;
  return {text: el.textContent.trim().slice(0, 60), lines};
}).filter(e => e.lines > 1)
"""
