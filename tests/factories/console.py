"""The console in a real browser: Debian's chromium driven by Playwright (the system
binary through ``executable_path``; Playwright downloads nothing), against a real
``radserve serve`` started by the test."""

from __future__ import annotations

import os
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.factories.waits import WAIT_SCALE

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # WebGL2 (the NiiVue viewer) on the CPU
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
]
SIZES = {"laptop": (1280, 800), "wall": (3840, 2160)}


def ms(seconds: float) -> float:
    """A Playwright bound (milliseconds) for ``seconds`` on a quiet machine, x
    :data:`~tests.factories.waits.WAIT_SCALE` like every other wait of the tests."""
    return seconds * 1000 * WAIT_SCALE


def need_browser() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (.ci/run does)")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright (test extra)")


@contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser page that records JavaScript errors and failed console messages."""

    def __init__(self, browser_: Any, base: str, shots: Path, size: str = "laptop") -> None:
        width, height = SIZES[size]
        # device scale factor 1: a CSS pixel is a screen pixel (a 4K wall screen at 100 %)
        self.context = browser_.new_context(
            viewport={"width": width, "height": height}, device_scale_factor=1
        )
        # Playwright's own 30 s default, scaled like the tests' other waits
        self.context.set_default_timeout(ms(30))
        self.page = self.context.new_page()
        self.base = base
        self.shots = shots
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on(
            "console",
            lambda msg: (
                self.errors.append(f"console.{msg.type}: {msg.text}")
                if msg.type == "error" and not _expected(msg.text)
                else None
            ),
        )

    def goto(self, path: str = "/") -> Any:
        self.page.goto(self.base + path)
        return self.page

    def sign_in(self, key: str) -> None:
        page = self.goto("/")
        page.fill("#api-key", key)
        page.click("#signin button[type=submit]")

    def shot(self, name: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.context.close()


def lesion_bundle(models: Path, version: str, out: Path, *, name: str = "lesions-test") -> Path:
    """The test lesion bundle (``models/lesions-test/1.0.0``) as ``name`` ``version``, in a
    folder ``out/<name>/<version>`` to install from."""
    folder = out / name / version
    shutil.copytree(models / "lesions-test" / "1.0.0", folder)
    manifest = yaml.safe_load((folder / "model.yaml").read_text())
    manifest.update(name=name, version=version)
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


def lesion_bundle_zip(
    models: Path, version: str, out: Path, *, name: str = "lesions-test"
) -> bytes:
    """:func:`lesion_bundle`, zipped for ``POST /v1/models``."""
    folder = lesion_bundle(models, version, out, name=name)
    target = out / f"{name}-{version}.zip"
    with zipfile.ZipFile(target, "w") as zf:
        for path in folder.rglob("*"):
            zf.write(path, f"{name}/{version}/{path.relative_to(folder).as_posix()}")
    return target.read_bytes()


def _expected(text: str) -> bool:
    # the browser logs every non-2xx fetch; the tests provoke 401/403 on purpose and
    # check those answers themselves
    return "Failed to load resource" in text and ("401" in text or "403" in text)
