"""A real Prometheus on loopback that scrapes targets listed through file-based discovery."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import yaml

from pd_tools.localcluster.processes import (
    LocalClusterError,
    ManagedProcess,
    find_binary,
    free_port,
    http_ok,
)

START_TIMEOUT_SECONDS = 30


class LocalPrometheus:
    """Prometheus with a 1 s scrape interval; `set_targets` changes what it scrapes."""

    def __init__(
        self, *, scrape_interval_seconds: int = 1, keep_dir: bool = False, retention: str = "2h"
    ) -> None:
        self.scrape_interval_seconds = scrape_interval_seconds
        self.retention = retention  # how long samples are kept (history a test backfills too)
        self.keep_dir = keep_dir
        self.dir = Path(tempfile.mkdtemp(prefix="pd-prometheus-"))
        self.targets_dir = self.dir / "targets"
        self.process: ManagedProcess | None = None
        self.port = 0
        self.startup_seconds = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LocalPrometheus":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def config(self) -> dict[str, object]:
        """The generated configuration: one job per targets file."""
        interval = f"{self.scrape_interval_seconds}s"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": "pd-file-sd",
                    "file_sd_configs": [
                        {"files": [str(self.targets_dir / "*.json")], "refresh_interval": interval}
                    ],
                }
            ],
        }

    def start(self, port: int | None = None) -> None:
        """Start Prometheus (on `port` if given, to come back where it was) and wait for ready."""
        began = time.monotonic()
        binary = find_binary("prometheus")
        self.targets_dir.mkdir(exist_ok=True)
        config_path = self.dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config()))
        self.port = port or self.port or free_port()
        self.process = ManagedProcess(
            "prometheus",
            [
                str(binary),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.tsdb.retention.time={self.retention}",
                "--log.level=warn",
            ],
            self.dir,
        )
        try:
            self.process.wait_until(
                lambda: http_ok(f"{self.url}/-/ready"), START_TIMEOUT_SECONDS, "ready"
            )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def backfill(self, openmetrics: str) -> None:
        """Write past samples (OpenMetrics text with timestamps, ending in `# EOF`) into the
        data folder as blocks, with promtool; before `start`, as Prometheus reads blocks then."""
        source = self.dir / "backfill.om"
        source.write_text(openmetrics)
        command = [str(find_binary("promtool")), "tsdb", "create-blocks-from", "openmetrics"]
        done = subprocess.run(
            [*command, str(source), str(self.dir / "data")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise LocalClusterError(f"promtool could not backfill: {done.stderr.strip()}")

    def set_targets(self, name: str, targets: list[str], labels: dict[str, str]) -> None:
        """Publish `host:port` targets with labels under `name`; replaced atomically."""
        self.targets_dir.mkdir(exist_ok=True)
        entry = [{"targets": targets, "labels": labels}] if targets else []
        temporary = self.targets_dir / f".{name}.tmp"
        temporary.write_text(json.dumps(entry))
        os.replace(temporary, self.targets_dir / f"{name}.json")

    def pause(self) -> None:
        """Stop the server but keep its data and port, to simulate an outage."""
        if self.process:
            self.process.stop()
            self.process = None

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        self.pause()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
