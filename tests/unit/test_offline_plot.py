"""`pdctl sim replay --plot`: a real PNG with the run's load, replicas and latencies drawn."""

import struct
import zlib
from pathlib import Path

import pytest
from matplotlib.image import imread

from pd_operator.api.document import parse_pddeployment
from pd_operator.core.hardware import GLM_45_FP8
from pd_tools.cli.main import main
from pd_tools.replay.example import example_document
from pd_tools.replay.offline import simulate
from pd_tools.replay.offline_plot import plot_result
from pd_tools.workloads.traces import TokenLengths, step_rate, synthetic_requests

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header, after checking every chunk's CRC."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    offset, kinds, header = 8, [], b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        header = body if kind == b"IHDR" else header
        kinds.append(kind)
        offset += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    width, height = struct.unpack(">II", header[:8])
    return width, height


def test_plot_is_a_png_with_the_run_drawn_on_it(tmp_path: Path) -> None:
    spec = parse_pddeployment(example_document()).spec
    requests = list(
        synthetic_requests(step_rate([0.5, 3.0, 0.5], 120), TokenLengths(8000, 300, 1.0, 1.0))
    )
    result = simulate(spec, requests, "pd-operator", model=GLM_45_FP8)
    image = plot_result(result, spec, tmp_path / "run.png")
    width, height = png_size(image)
    assert width >= 800 and height >= 800
    pixels = imread(image)[:, :, :3].reshape(-1, 3)
    white = (pixels > 0.99).all(axis=1).mean()
    colours = {tuple(p) for p in pixels[::7].round(2).tolist()}
    assert white < 0.97  # lines, labels and axes cover more than a sliver
    assert len(colours) > 20  # several series in colours, antialiased text
    # The four panels are stacked: every quarter of the height has something drawn.
    for quarter in range(4):
        band = imread(image)[quarter * height // 4 : (quarter + 1) * height // 4, :, :3]
        assert (band < 0.9).any(axis=2).mean() > 0.01


def test_pdctl_simulate_plot_writes_one_png_per_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "replay", "--rate", "1", "--duration", "180", "--policy", "hpa"]
    argv += ["--policy", "dynamo-sla:arima", "--plot", str(tmp_path / "plots")]
    assert main(argv) == 0
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert written == ["simulate-dynamo-sla-arima.png", "simulate-hpa.png"]
    for name in written:
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG_SIGNATURE
    assert "simulate-hpa.png" in capsys.readouterr().err
