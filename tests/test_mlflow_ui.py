"""The MLflow UI in a real headless browser: a tiny sweep logged through a real ``mlflow server``
shows its child runs on the experiment page, and the compare view shows their ``fit/A`` and
``fit/B`` with the values MLflow's client reports.

Needs Debian's ``/usr/bin/chromium`` and the ``playwright`` Python package (never a downloaded
browser). Without them the test is skipped, or fails when ``SCALERL_REQUIRE_BROWSER=1`` (CI).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow_server import free_port, start_server, stop_server
from test_sweep import REPO, TINY_BASE, TINY_TASK, write_sweep

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A fresh profile opens the MLflow assistant panel over the page: keep it closed.
CLOSE_ASSISTANT = """
window.localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');
window.localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');
"""


def _require_browser():
    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append(f"{CHROMIUM} (apt-get install -y chromium chromium-driver, see .ci/install_system.sh)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[ui-test]')")
    if missing:
        reason = "browser test needs " + " and ".join(missing)
        if os.environ.get("SCALERL_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + " (SCALERL_REQUIRE_BROWSER=1)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` on 127.0.0.1; yields its URL."""
    port = free_port()
    proc = start_server(tmp_path, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def _metric_cells(page, name: str) -> list[str]:
    """The compare view's values of metric ``name``, one per run column (left to right).
    The metrics table is two virtualised grids (names | values) whose cells share a ``top``."""
    js = """(name) => {
      const link = [...document.querySelectorAll('a[title="Plot chart"]')]
        .find(a => a.textContent.trim() === name);
      if (!link) return null;
      const cell = link.parentElement, top = cell.style.top;
      const names = cell.closest('[role=grid]');
      let box = names.parentElement;
      while (box && box.querySelectorAll('[role=grid]').length < 2) box = box.parentElement;
      const grids = [...box.querySelectorAll('[role=grid]')];
      const values = grids[grids.indexOf(names) + 1];
      const cells = [...values.querySelectorAll('div[style]')]
        .filter(d => d.style.position === 'absolute' && d.style.top === top);
      cells.sort((a, b) => parseFloat(a.style.left) - parseFloat(b.style.left));
      return cells.map(c => c.textContent.trim());
    }"""
    for _ in range(60):  # scroll the virtualised grid until the row is rendered
        cells = page.evaluate(js, name)
        if cells:
            return cells
        page.evaluate(
            """() => document.querySelectorAll('[role=grid]').forEach(g => { g.scrollTop += 200;
                 g.dispatchEvent(new Event('scroll')); })"""
        )
        time.sleep(0.25)
    raise AssertionError(f"metric {name} not found in the compare view")


def _unclip_metrics_table(page) -> None:
    """For the screenshot only: let the metrics grids (300 px high, virtualised) show every row
    they have rendered, fit/* included, instead of scrolling them."""
    page.evaluate(
        """() => {
      const grids = [...document.querySelectorAll('[role=grid]')];
      for (const g of grids) {
        g.style.height = '720px';
        let p = g.parentElement;
        for (let i = 0; i < 2 && p; i++, p = p.parentElement) p.style.height = 'auto';
      }
      if (grids.length) grids[0].scrollIntoView({block: 'start'});
    }"""
    )
    time.sleep(0.5)


def _shown_as(text: str, value: float) -> bool:
    """The UI rounds metrics for display (3 decimals below 10, 2 below 100, 1 above)."""
    if math.isnan(value):
        return text.lower() == "nan"
    shown = float(text)
    tol = 5e-4 if abs(value) < 10 else (5e-3 if abs(value) < 100 else 0.05)
    return abs(shown - value) <= tol * (1 + 1e-9) or (
        abs(value) < 1e-3 and math.isclose(shown, value, rel_tol=1e-3)
    )


def test_child_runs_and_fit_metrics_in_the_mlflow_ui(tmp_path, mlflow_server, _cache_dir):
    _require_browser()
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    # the second variant also draws more evaluation samples, so the two columns hold different fits
    f = write_sweep(
        tmp_path / "ui.yaml",
        {"cispo": [], "dapo": ["loss=dapo", "eval.samples_per_prompt=4"]},
        name="ui_sweep",
        base=[*TINY_BASE, *TINY_TASK],
        baseline="cispo",
    )
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "sweep.py"),
            str(f),
            "--out",
            str(tmp_path / "out"),
            "--tracking-uri",
            mlflow_server,
            "launcher.max_parallel=2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert res.returncode == 0, res.stderr[-3000:]

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("ui_sweep")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("sweep.role") == "parent")
    children = sorted(
        (r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
        key=lambda r: r.info.run_name,
    )
    assert [r.info.run_name for r in children] == ["cispo", "dapo"]
    ids = [r.info.run_id for r in children]

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1000},
        )
        try:
            ctx.add_init_script(CLOSE_ASSISTANT)
            # the experiment page: the parent run, expanded, lists the sweep's child runs
            page = ctx.new_page()
            page.goto(f"{mlflow_server}/#/experiments/{exp.experiment_id}/runs")
            # (ag-grid renders each row in several column containers: pick the run-name part)
            expand = page.locator(
                f'[role=row][row-id="{parent.info.run_id}"] button[data-component-id*="runnamecellrenderer"]'
            ).first
            expand.wait_for(timeout=60_000)
            expand.click()
            for run in children:
                row = page.locator(f'[role=row][row-id="{run.info.run_id}"]').filter(
                    has=page.get_by_role("link", name=run.info.run_name, exact=True)
                )
                row.first.wait_for(timeout=30_000)
            page.screenshot(path=str(tmp_path / "experiment-page.png"))
            page.close()

            # the compare view (a new page per URL: only the part after '#' would change)
            page = ctx.new_page()
            page.goto(
                f"{mlflow_server}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([exp.experiment_id])}"
            )
            page.get_by_text("fit/A", exact=True).first.wait_for(timeout=60_000)
            body = page.inner_text("body")
            assert body.index(ids[0]) < body.index(ids[1])  # columns in the order of the URL
            for key in ("fit/A", "fit/B"):
                cells = _metric_cells(page, key)
                expected = [client.get_run(i).data.metrics[key] for i in ids]
                assert len(cells) == len(ids), (key, cells)
                for text, value in zip(cells, expected):
                    assert _shown_as(text, value), f"{key}: UI shows {text!r}, MLflow has {value!r}"
            _unclip_metrics_table(page)
            page.screenshot(path=str(tmp_path / "compare-page.png"))
        finally:
            ctx.close()


DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_verdicts_in_the_mlflow_ui(tmp_path, mlflow_server):
    """The sweep report's view of the run table (the address ``python sweep.py`` prints) shows each
    run's variant, its variant's verdict, A with its interval, B and the prediction error as the
    first columns, and the parent run's description opens with the verdict table. Synthetic curves
    (3 seeds of 3 variants) logged through a real server; ``SCALERL_DOCS_SCREENSHOTS=1`` also saves
    the screenshot the README shows (docs/mlflow-ui-verdicts.png)."""
    _require_browser()
    from playwright.sync_api import sync_playwright
    from test_sweep import log_synthetic_sweep

    from scalerl.sweep.cli import main

    sw = log_synthetic_sweep(tmp_path, mlflow_server, seeds=(0, 1, 2))
    assert main(["--report", str(sw["file"]), "--out", str(sw["out"])]) == 0
    client, parent = sw["client"], sw["parent"]
    exp_id = client.get_run(parent).info.experiment_id
    tags = {name: client.get_run(rid).data.tags for name, rid in sw["ids"].items()}
    assert (
        tags["dapo-seed0"]["2 verdict"].startswith("A lower")
        and tags["base-seed0"]["2 verdict"] == "baseline"
    )

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 820},
        )
        try:
            ctx.add_init_script(CLOSE_ASSISTANT)
            page = ctx.new_page()
            page.goto(f"{mlflow_server}/#/experiments/{exp_id}/runs?viewStateShareKey=scalerl-verdicts")
            # sorted by run name, the view lists every run (the sweep's runs and its parent) flat
            page.locator(f'[role=row][row-id="{sw["ids"]["dapo-seed0"]}"]').first.wait_for(timeout=60_000)
            headers = page.locator("[role=columnheader]").all_inner_texts()
            shown = [h.strip() for h in headers if h.strip()]
            for col in ("1 variant", "2 verdict", "3 A with CI", "4 B", "5 prediction error"):
                assert col in shown, shown
            cols = ["1 variant", "2 verdict", "3 A with CI", "4 B", "5 prediction error"]
            assert [shown.index(c) for c in cols] == sorted(shown.index(c) for c in cols), shown
            for name in ("dapo-seed0", "base-seed1"):
                row = page.locator(f'[role=row][row-id="{sw["ids"][name]}"]')
                row.first.wait_for(timeout=30_000)
                text = " ".join(row.all_inner_texts())
                assert tags[name]["1 variant"] in text and tags[name]["2 verdict"] in text, text
                assert tags[name]["3 A with CI"] in text, text
            page.screenshot(path=str(tmp_path / "verdicts-table.png"))
            if os.environ.get("SCALERL_DOCS_SCREENSHOTS") == "1":
                page.screenshot(path=str(DOCS / "mlflow-ui-verdicts.png"))
            page.close()

            # the parent run's page: its description opens with the verdict table
            page = ctx.new_page()
            page.goto(f"{mlflow_server}/#/experiments/{exp_id}/runs/{parent}")
            page.get_by_text("Verdicts per variant").first.wait_for(timeout=60_000)
            body = page.inner_text("body")
            assert body.index("Verdicts per variant") < body.index("Metrics")
            assert "A [90% CI]" in body and "A lower" in body
            page.screenshot(path=str(tmp_path / "parent-run.png"))
        finally:
            ctx.close()
