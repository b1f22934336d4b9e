"""The reference deployment in a real browser, as a Dagster and MLflow user sees it after a small demo.

Headless Chromium from Debian's packages (``/usr/bin/chromium``, ``/usr/bin/chromedriver``; `.ci/run`
installs them), driven by Selenium. A small demo (two source hours) runs through the demo's own pieces -- the
reference code location served by ``dagster dev`` (webserver and daemon) on the instance, runs of its defined
jobs. The deployment starts with ``PRIMUS_SENSORS=stopped``, so that its sensors do not launch runs of the 74
hours written while the test looks around. Over GraphQL the served location lists its assets (the four source
kinds, time-window partitions, the training asset's two checks). In the UI the test opens the asset graph and
the training asset's lineage, backfills the training partitions of the second and third days from the asset's
Materialize dialog -- both runs succeed, one after the other, the second continuing the first's model (the
asset depends on its own previous partition: the backfill daemon orders them) --, opens the trained partition
(AUC, consumed Kafka offsets, model version) and its checks (``auc_final`` is listed; its check-only job is
run by tests/dagster_defs/test_training_asset.py), the automation page and the daemons (all running), and
re-executes a Kafka source run and a training run (confirming Dagster's question for a run of a backfill)
from their pages. As ``make dev`` does, an MLflow server on the demo's store serves the code location's
tracking, so the training partition's ``mlflow_run_url`` is a link: the test clicks it and lands on that
run's page, then opens the run's loss curve and the model version. Screenshots go to
``$PRIMUS_BROWSER_ARTIFACTS`` (default: a temp dir, printed); the time each phase took is printed. The
test fails, not skips, when the browser is missing.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, DagsterRun, DagsterRunStatus, EventLogRecord
from rich.console import Console

from primus_dagster import paths
from primus_dagster.broker_discovery import KAFKA_ENV
from primus_dagster.data import SourceContext
from primus_dagster.devtools.demo import REPO, ReferenceLocation, materialize_hours
from primus_dagster.devtools.dev import serve_mlflow, wait_http
from primus_dagster.devtools.freshness import graphql
from primus_dagster.devtools.processes import stop_process_tree
from primus_dagster.spec import JobSpec, load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from tests.bounds import load_scaled

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS_ENV = "PRIMUS_BROWSER_ARTIFACTS"
SPEC = REPO / "examples" / "job.yaml"
TRAINING_PARTITION = "2026-11-02"
NEXT_PARTITION = "2026-11-03"


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get(ARTIFACTS_ENV) or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    print(f"browser screenshots in {out}")
    return out


@pytest.fixture
def browser() -> Iterator[object]:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"headless browser missing: {missing}; install it with `apt-get install -y chromium chromium-driver` "
            "(.ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1600,1000")
    # Profile and Chromium's temp files in a short directory (its singleton socket's path must fit a UNIX
    # socket's), removed after the session.
    with tempfile.TemporaryDirectory(prefix="chr-", ignore_cleanup_errors=True) as scratch:
        options.add_argument(f"--user-data-dir={scratch}/profile")
        os.mkdir(f"{scratch}/tmp")
        service = Service(str(CHROMEDRIVER), env={**os.environ, "TMPDIR": f"{scratch}/tmp"})
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()


class Page:
    """The browser on one page: wait for texts, dismiss the newsletter dialog, save a screenshot."""

    def __init__(self, driver: object, artifacts: Path) -> None:
        self.driver, self.artifacts = driver, artifacts

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return str(self.driver.find_element(By.TAG_NAME, "body").text)  # type: ignore[attr-defined]

    def open(self, url: str, shot: str, *needles: str, timeout_s: float = 60, scroll: bool = False) -> str:
        """Open ``url``, wait until every one of ``needles`` is on the page (scrolling the page's panes
        when ``scroll``: charts render when they come into view), save ``<shot>.png``; the page's text."""

        self.driver.get(url)  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            self.dismiss_dialog()
            text = self.text()
            if all(needle in text for needle in needles):
                time.sleep(1)  # let the last requests paint
                self.dismiss_dialog()
                self.driver.save_screenshot(str(self.artifacts / f"{shot}.png"))  # type: ignore[attr-defined]
                return self.text()
            if scroll:
                self.driver.execute_script(  # type: ignore[attr-defined]
                    "for (const e of document.querySelectorAll('*')) "
                    "{ if (e.scrollHeight > e.clientHeight + 10) e.scrollTop += 400; }"
                )
            time.sleep(0.5)
        self.driver.save_screenshot(str(self.artifacts / f"{shot}-timeout.png"))  # type: ignore[attr-defined]
        missing = [needle for needle in needles if needle not in text]
        raise AssertionError(f"{url}: {missing} not on the page within {timeout_s:g}s; page text:\n{text[-3000:]}")

    def wait_for(self, *needles: str, timeout_s: float = 60) -> str:
        """Wait until every one of ``needles`` is on the current page; its text."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if all(needle in text for needle in needles):
                return text
            if time.monotonic() > deadline:
                missing = [needle for needle in needles if needle not in text]
                raise AssertionError(f"{missing} not on the page within {timeout_s:g}s; page text:\n{text[-3000:]}")
            time.sleep(0.5)

    def dismiss_dialog(self) -> None:
        """Skip Dagster's "join the community" dialog if it is up (it comes some time after a page opens)."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.common.by import By

        for skip in self.driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):  # type: ignore[attr-defined]
            try:
                skip.click()
                time.sleep(0.5)
            except WebDriverException:
                pass

    def follow_link(self, href: str, shot: str, *needles: str, timeout_s: float = 90) -> str:
        """Click the link to ``href`` on the page (Dagster opens metadata links in a new tab: switch to it),
        wait for ``needles`` there, save ``<shot>.png``; the page's text."""
        from selenium.webdriver.common.by import By

        before = set(self.driver.window_handles)  # type: ignore[attr-defined]
        self.dismiss_dialog()
        self.driver.find_element(By.XPATH, f"//a[@href='{href}']").click()  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            opened = set(self.driver.window_handles) - before  # type: ignore[attr-defined]
            if opened:
                self.driver.switch_to.window(opened.pop())  # type: ignore[attr-defined]
            if self.driver.current_url.startswith(href.split("#")[0]):  # type: ignore[attr-defined]
                text = self.text()
                if all(needle in text for needle in needles):
                    time.sleep(1)
                    self.driver.save_screenshot(str(self.artifacts / f"{shot}.png"))  # type: ignore[attr-defined]
                    return self.text()
            time.sleep(0.5)
        self.driver.save_screenshot(str(self.artifacts / f"{shot}-timeout.png"))  # type: ignore[attr-defined]
        raise AssertionError(f"the link to {href} did not lead to a page with {needles} within {timeout_s:g}s")

    def click_button(self, label: str, timeout_s: float = 20) -> None:
        """Click the button whose text contains ``label`` (once no dialog covers it)."""
        from selenium.common.exceptions import ElementClickInterceptedException
        from selenium.webdriver.common.by import By

        deadline = time.monotonic() + timeout_s
        while True:
            self.dismiss_dialog()
            try:
                self.driver.find_element(By.XPATH, f"//button[contains(normalize-space(), '{label}')]").click()  # type: ignore[attr-defined]
                return
            except ElementClickInterceptedException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process_tree(proc)


class Phases:
    """How long each phase of the test took (printed at the end, and with a failure: where the time went)."""

    def __init__(self) -> None:
        self.began = self.last = time.monotonic()
        self.took: list[tuple[str, float]] = []

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.took.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in self.took)
        return f"phases ({time.monotonic() - self.began:.0f}s): {parts}"


@pytest.mark.timeout(600)  # the demo, two servers and ten pages: 1.5-4 min on 2 shared cores
def test_dagster_and_mlflow_uis_show_the_demo(
    tmp_path: Path, own_kafka_broker, browser: object, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    phases = Phases()
    home = tmp_path / "home"
    for name in ("DAGSTER_HOME", "PRIMUS_DATA_ROOT", "MLFLOW_TRACKING_URI", "PRIMUS_DEPLOYMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRIMUS_HOME", str(home))
    dagster_home = paths.dagster_home()  # as `make demo` writes it: telemetry off, a run queue for the machine
    job = load_job_spec(SPEC)
    bootstrap = own_kafka_broker.bootstrap_servers
    world = SyntheticWorld(WorldConfig(rows_per_hour=200), job.dataset.start)
    # Two days and the first hours of a third: the training partitions 2026-11-02 and -03 (their windows, the
    # lagged batch day before each, the evaluation hours after) have their data.
    write_world(job, SourceContext(str(home / "data"), bootstrap), world, range(74))
    phases.done("world")
    env = {
        **os.environ,
        "PRIMUS_HOME": str(home),
        "PRIMUS_JOB_SPEC": str(SPEC),
        KAFKA_ENV: bootstrap,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PRIMUS_SENSORS": "stopped",
        "TMPDIR": str(tmp_path / "tmp"),  # MLflow's SQLite init locks of the runs and the server stay here
    }
    (tmp_path / "tmp").mkdir()
    tracking_uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    page = Page(browser, artifacts)
    console = Console(file=sys.stdout, width=160)

    # As `make dev` serves it (devtools/dev.py): an MLflow server on the project's store, the code location
    # tracking through it, so the training partition's mlflow_run_url is a link to a page that answers.
    artifacts_root = home / "mlflow" / "artifacts"
    mlflow_proc, mlflow_url = serve_mlflow(tracking_uri, tmp_path / "mlflow.log", env, artifact_root=artifacts_root)
    try:
        wait_http(f"{mlflow_url}/health", 120, mlflow_proc, tmp_path / "mlflow.log")
        env["MLFLOW_TRACKING_URI"] = mlflow_url
        with ReferenceLocation(dagster_home, env, tmp_path / "dagster-dev.log", daemon=True) as location:
            phases.done("servers")
            _serves_the_asset_graph(location)
            _, failed = materialize_hours(job, location, 2, console)
            assert not failed, failed
            phases.done("source runs")
            _browse_dagster(page, location, job, phases)
            _browse_mlflow(page, location, mlflow_url)
            phases.done("mlflow pages")
    finally:
        _stop(mlflow_proc)
        print(phases)
    shots = sorted(p.name for p in artifacts.glob("*.png"))
    assert len(shots) >= 8, shots


ASSET_NODES_QUERY = """{ assetNodes { assetKey { path } partitionDefinition { type }
  assetChecksOrError { ... on AssetChecks { checks { name } } } } }"""


def _serves_the_asset_graph(location: ReferenceLocation) -> None:
    """The served location's assets over GraphQL: the four source kinds, time-window partitions (the live
    model excepted: one, always the newest) and the training asset's two checks."""
    nodes = graphql(location.port, ASSET_NODES_QUERY, {})["assetNodes"]
    names = {node["assetKey"]["path"][-1] for node in nodes}
    assert {"impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka"} <= names
    partitioned = {n["assetKey"]["path"][-1]: (n["partitionDefinition"] or {}).get("type") for n in nodes}
    assert partitioned.pop("ctr_demo_live_model") is None
    assert set(partitioned.values()) == {"TIME_WINDOW"}
    checks = {node["assetKey"]["path"][-1]: {c["name"] for c in node["assetChecksOrError"]["checks"]} for node in nodes}
    assert "schema_matches_spec" in checks["impressions_parquet"]
    assert checks["ctr_demo_model"] == {"auc_not_regressed", "auc_final"}


def _browse_dagster(page: Page, location: ReferenceLocation, job: JobSpec, phases: Phases) -> None:
    url, name = location.url, job.name.replace("-", "_")
    page.open(f"{url}/asset-groups", "01-asset-graph", "Global asset lineage")
    # Upstream of the training asset: its sources (long names are cut short on the nodes).
    upstream = ("impressions_delta", "events_kafka", "_parquet", "_iceberg")
    page.open(f"{url}/assets/ctr_demo_model?view=lineage", "02-training-lineage", "ctr_demo_model", *upstream)
    phases.done("graph pages")
    # The training partitions come from the UI: a backfill of two from the asset's Materialize dialog.
    backfill_runs = _backfill(page, location, (TRAINING_PARTITION, NEXT_PARTITION), "03a-training-backfill")
    phases.done("training backfill")

    record = _trained(location)
    metadata = record.asset_materialization.metadata
    auc = metadata["eval_auc"].value
    version = metadata["model_version"].value
    offsets = metadata["source_versions"].value["events_kafka"]["offsets"]
    text = page.open(
        f"{url}/assets/ctr_demo_model?view=partitions&partition={TRAINING_PARTITION}",
        "03-training-partition",
        "eval_auc",
        str(auc),
        "model_version",
        "source_versions",
        "ctr-events:0",
    )
    run_link = metadata["mlflow_run_url"]
    assert run_link.value.startswith("http://127.0.0.1:"), run_link  # a link (MetadataValue.url), not text
    page.follow_link(run_link.value, "03b-mlflow-run-from-dagster", "eval_auc", TRAINING_PARTITION)
    page.driver.switch_to.window(page.driver.window_handles[0])  # type: ignore[attr-defined]
    page.open(f"{url}/assets/ctr_demo_model?view=partitions&partition={TRAINING_PARTITION}", "03c-back", "eval_auc")
    (topic_partition, (first, last)) = next(iter(offsets.items()))
    assert re.search(rf"{re.escape(topic_partition)}\D+{first}\D+{last}", text), "consumed offsets not shown"
    assert re.search(rf"model_version\s+{version}\b", text), "model version not shown"

    # The delayed evaluation auc_final is listed beside the blocking check (its check-only job, evaluated on
    # complete labels: tests/dagster_defs/test_training_asset.py).
    checks = page.open(
        f"{url}/assets/ctr_demo_model?view=checks", "04-training-checks", "auc_not_regressed", "auc_final"
    )
    # The demo's tiny world can train a model near 0.5; examples/job.yaml's baseline_guard only warns, so a
    # WARN "Failed" is a legitimate outcome here: the check ran and shows its result.
    assert re.search(r"auc_not_regressed\s+(Succeeded|Failed)", checks), "the AUC check did not show a result"
    page.open(f"{url}/automation", "05-automation", f"{name}_batch_sensor", f"{name}_training_schedule")
    page.open(f"{url}/deployment/daemons", "05b-daemons", "Sensors", "Scheduler", "Backfill", "Running")
    phases.done("partition, checks, automation pages")

    # Re-execute a Kafka source run from its page (the stream is still there): the runs belong to the code
    # location, the UI launches new ones.
    _re_execute(page, location, _last_run_of(location, f"{name}_events_kafka_hour_job"), "06-kafka-run")
    phases.done("kafka re-execution")
    (training_run,) = [r for r in backfill_runs if r.tags["dagster/partition"] == TRAINING_PARTITION]
    _re_execute(page, location, training_run, "07-training-run", bound_s=300)
    phases.done("training re-execution")


def _trained(location: ReferenceLocation, partition: str = TRAINING_PARTITION) -> EventLogRecord:
    """The latest materialisation of the training partition ``partition``."""
    records = location.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("ctr_demo_model"), asset_partitions=[partition]), limit=1
    ).records
    assert records and records[0].asset_materialization is not None, f"{partition} was not materialised"
    return records[0]


def _last_run_of(location: ReferenceLocation, job_name: str) -> DagsterRun:
    runs = [r for r in location.instance.get_runs() if r.job_name == job_name]
    assert runs, f"no run of {job_name}"
    return runs[0]


def _backfill(page: Page, location: ReferenceLocation, partitions: tuple[str, ...], shot: str) -> list[DagsterRun]:
    """Launch a backfill of the training asset's ``partitions`` from its Materialize dialog; every run of
    it must succeed. Its runs."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url = location.url
    page.open(f"{url}/assets/ctr_demo_model?view=partitions", shot, "Materialize")
    page.click_button("Materialize")
    page.wait_for("Launch runs to materialize", "Partition selection")
    # The dialog's own partition box (the page behind it has one too), a range in Dagster's syntax.
    box = page.driver.find_element(By.XPATH, "//div[contains(@class, 'bp5-dialog')]//input[@type='text']")  # type: ignore[attr-defined]
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(f"[{partitions[0]}...{partitions[-1]}]", Keys.ENTER)
    deadline = time.monotonic() + 30
    while not re.search(rf"(?<!\d){len(partitions)} partitions", page.text()):
        assert time.monotonic() < deadline, f"the dialog did not select {partitions}: {page.text()[-1500:]}"
        time.sleep(0.5)
    page.driver.save_screenshot(str(page.artifacts / f"{shot}-dialog.png"))  # type: ignore[attr-defined]
    page.click_button("Launch backfill")
    deadline = time.monotonic() + load_scaled(300)
    while True:
        runs = [r for r in location.instance.get_runs() if "dagster/backfill" in r.tags]
        done = [r for r in runs if r.is_finished]
        if len(done) == len(partitions) and len(runs) == len(partitions):
            break
        assert time.monotonic() < deadline, (
            f"the backfill's runs did not finish: {[(r.run_id, r.status) for r in runs]}"
        )
        time.sleep(1)
    assert sorted(r.tags["dagster/partition"] for r in runs) == sorted(partitions)
    assert all(r.status == DagsterRunStatus.SUCCESS for r in runs), [(r.run_id, r.status) for r in runs]
    # In order (the asset depends on its own previous partition): each run starts once the partition before it
    # is materialised, and continues its model; the first starts fresh.
    by_partition = {r.tags["dagster/partition"]: r for r in runs}
    started = [location.instance.get_run_record_by_id(by_partition[key].run_id) for key in partitions]
    trained = [_trained(location, key) for key in partitions]
    for before, after in itertools.pairwise(zip(trained, started, strict=True)):
        (materialised, _), (record, run) = before, after
        assert run is not None and run.start_time is not None and materialised.timestamp <= run.start_time
        metadata, previous = record.asset_materialization, materialised.asset_materialization
        assert metadata is not None and previous is not None
        assert metadata.metadata["warm_started_from"].value == previous.metadata["mlflow_run_id"].value
    first = trained[0].asset_materialization
    assert first is not None and first.metadata["cold_start"].value == "first training partition"
    # Each run's blocking check: one row in the check's history, against the run's partition (issue 26 item 5).
    check = AssetCheckKey(AssetKey("ctr_demo_model"), "auc_not_regressed")
    history = location.instance.event_log_storage.get_asset_check_execution_history(check, limit=20)
    rows = sorted((h.run_id, h.partition) for h in history if h.run_id in {r.run_id for r in runs})
    assert rows == sorted((r.run_id, r.tags["dagster/partition"]) for r in runs), rows
    backfill_id = runs[0].tags["dagster/backfill"]
    page.open(f"{url}/runs/b/{backfill_id}", f"{shot}-done", *partitions)
    return runs


def _re_execute(page: Page, location: ReferenceLocation, parent: DagsterRun, shot: str, bound_s: float = 120) -> None:
    url, job_name = location.url, parent.job_name
    page.open(f"{url}/runs/{parent.run_id}", shot, "Re-execute all", "Success")
    page.click_button("Re-execute all")
    if "dagster/backfill" in parent.tags:  # Dagster asks first: the backfill's status will not change
        page.wait_for("part of a completed backfill", "Confirm")
        page.driver.save_screenshot(str(page.artifacts / f"{shot}-confirm.png"))  # type: ignore[attr-defined]
        page.click_button("Confirm")
    deadline = time.monotonic() + load_scaled(bound_s)
    child = None
    while time.monotonic() < deadline:
        children = [r for r in location.instance.get_runs() if r.parent_run_id == parent.run_id]
        child = children[0] if children else None
        if child is not None and child.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE):
            break
        time.sleep(1)
    assert child is not None, f"the UI did not re-execute the {job_name} run"
    assert child.status == DagsterRunStatus.SUCCESS and child.job_name == parent.job_name
    assert child.tags["dagster/partition"] == parent.tags["dagster/partition"]
    page.open(f"{url}/runs/{child.run_id}", f"{shot}-re-executed", "Success", parent.run_id[:8])


def _browse_mlflow(page: Page, location: ReferenceLocation, url: str) -> None:
    record = _trained(location)
    assert record.asset_materialization is not None
    metadata = record.asset_materialization.metadata
    run_id = metadata["mlflow_run_id"].value
    model, version = metadata["registered_model"].value, metadata["model_version"].value
    experiment = re.search(r"experiments/(\d+)", str(metadata["mlflow_run_url"].value))
    experiment_id = experiment.group(1) if experiment else "1"
    run_url = f"{url}/#/experiments/{experiment_id}/runs/{run_id}"
    page.open(run_url, "08-mlflow-run", "eval_auc", f"{TRAINING_PARTITION}", timeout_s=90)
    page.open(f"{run_url}/model-metrics", "09-mlflow-loss-curve", "(loss)", timeout_s=90, scroll=True)
    page.open(
        f"{url}/#/models/{model}/versions/{version}",
        "10-mlflow-model-version",
        f"Version {version}",
        "dagster.partition",
        TRAINING_PARTITION,
        timeout_s=90,
    )
