"""The demo's options and the settings its modules share: where things are, names, SLO."""

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "config" / "clusters" / "serving.yaml"
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
NAMESPACE, NAME = "demo", "glm-hetero"
GROUP, VERSION, PLURAL = "pdoperator.io", "v1alpha1", "pddeployments"
# Container start and model load 20x faster than the wall clock (an 82 s load takes 4 s). The
# engines serve in real time: every latency here is a wall-clock one.
TIME_SCALE = 0.05
INTERVAL_SECONDS = 5
WINDOW_SECONDS = 10  # the SLO window; also the client's window in the table
# Both targets sit on a bound of vLLM's histogram buckets, so that a reading in the bucket above
# is a certain breach (docs/autoscaling.md, "histogram buckets"). TTFT: 2.5x a median prompt's
# own prefill on one S5000, which the calm load meets and a queue soon exceeds. ITL: vLLM's
# first bucket; one H200 generates ~1,600 tokens/s within it at the decode step's contexts.
TTFT_TARGET_MS = 750
ITL_TARGET_MS = 10
WIDTH = 100  # the table fits a terminal this wide


@dataclass
class DemoOptions:
    """What `pdctl demo` runs: wall seconds of load, the load, the output folder."""

    duration_s: float = 180.0
    load: str = "auto"  # auto: the shared trace if present, else the shipped slice
    plot: bool = True
    output: Path | None = None  # None: pd-demo-<time> in the temporary folder
    refresh_s: float = 2.0
