"""Load generators and trace readers: rates, shapes, determinism, and the three trace formats."""

import itertools
import json
import math
import re
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from pd_tools.workloads.traces import (
    COPY_HASH_ID_STRIDE,
    ReplayOptions,
    Request,
    TokenLengths,
    constant_rate,
    ramp_rate,
    read_azure,
    read_mooncake,
    read_servegen,
    read_trace,
    step_rate,
    synthetic_requests,
)
from traces import real_trace

SHORT = TokenLengths(100, 10)


def gaps(requests: list[Request]) -> list[float]:
    return [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(requests)]


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def count_between(requests: list[Request], start_s: float, end_s: float) -> int:
    return sum(start_s <= r.arrival_s < end_s for r in requests)


# --- synthetic load ---------------------------------------------------------------------------


def test_poisson_load_has_the_asked_rate_and_exponential_gaps():
    requests = list(synthetic_requests(constant_rate(20, 1000), SHORT, seed=1))
    assert len(requests) / 1000 == pytest.approx(20, rel=0.03)
    assert cv(gaps(requests)) == pytest.approx(1.0, abs=0.05)
    assert all(0 <= r.arrival_s < 1000 for r in requests)
    assert requests == sorted(requests, key=lambda r: r.arrival_s)


@pytest.mark.parametrize("arrival_cv", [0.5, 2.0, 3.0])
def test_gamma_bursty_load_keeps_the_mean_rate_and_has_the_asked_cv(arrival_cv: float):
    requests = list(
        synthetic_requests(constant_rate(20, 2000), SHORT, arrival_cv=arrival_cv, seed=2)
    )
    # Count noise grows with the CV: sd of the rate ~ cv / sqrt(N) (N = 40,000).
    assert len(requests) / 2000 == pytest.approx(20, rel=0.05 * arrival_cv)
    assert cv(gaps(requests)) == pytest.approx(arrival_cv, rel=0.1)


def test_bursty_load_is_burstier_per_second_than_poisson():
    def peak_second(arrival_cv: float) -> int:
        requests = synthetic_requests(constant_rate(10, 600), SHORT, arrival_cv=arrival_cv)
        per_second = [0] * 600
        for r in requests:
            per_second[int(r.arrival_s)] += 1
        return max(per_second)

    assert peak_second(3.0) > 2 * peak_second(1.0)


def test_step_load_changes_rate_at_each_step():
    requests = list(synthetic_requests(step_rate([5, 25, 10], 400), SHORT, seed=3))
    for index, rate in enumerate([5, 25, 10]):
        observed = count_between(requests, index * 400, (index + 1) * 400) / 400
        assert observed == pytest.approx(rate, rel=0.08)


def test_ramp_load_rises_linearly():
    requests = list(synthetic_requests(ramp_rate(0, 40, 1000), SHORT, seed=4))
    # Expected counts: the integral of a line from 0 to 40 req/s over each quarter.
    for quarter in range(4):
        start, end = quarter * 250, (quarter + 1) * 250
        expected = (0.04 * start + 0.04 * end) / 2 * 250
        assert count_between(requests, start, end) == pytest.approx(expected, rel=0.1)


def test_lengths_follow_the_asked_means_and_cvs():
    lengths = TokenLengths(2000, 300, input_cv=1.0, output_cv=0.5, cached_fraction=0.25)
    requests = list(synthetic_requests(constant_rate(50, 200), lengths, seed=5))
    inputs = [r.input_tokens for r in requests]
    outputs = [r.output_tokens for r in requests]
    assert statistics.fmean(inputs) == pytest.approx(2000, rel=0.05)
    assert statistics.fmean(outputs) == pytest.approx(300, rel=0.05)
    assert cv([float(x) for x in inputs]) == pytest.approx(1.0, rel=0.1)
    assert cv([float(x) for x in outputs]) == pytest.approx(0.5, rel=0.1)
    assert all(r.cached_tokens == math.floor(0.25 * r.input_tokens) for r in requests)
    constant = next(synthetic_requests(constant_rate(1, 100), TokenLengths(512, 64)))
    assert (constant.input_tokens, constant.output_tokens) == (512, 64)


def test_generators_are_deterministic_given_a_seed():
    def draw(seed: int) -> list[Request]:
        profile = step_rate([3, 9], 50)
        return list(
            synthetic_requests(profile, TokenLengths(800, 80, 1, 1), arrival_cv=2, seed=seed)
        )

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_generators_stream_lazily():
    # A day at 1,000 req/s would be 86 million requests; the first few come at once.
    first = list(itertools.islice(synthetic_requests(constant_rate(1000, 86400), SHORT), 5))
    assert len(first) == 5
    assert first[-1].arrival_s < 1


def test_profiles_reject_nonsense():
    with pytest.raises(ValueError):
        constant_rate(-1, 10)
    with pytest.raises(ValueError):
        TokenLengths(0, 10)
    with pytest.raises(ValueError):
        next(synthetic_requests(constant_rate(1, 10), SHORT, arrival_cv=0))
    with pytest.raises(ValueError):
        Request(0.0, 10, 1, cached_tokens=11)


# --- trace readers on small synthetic files ---------------------------------------------------


def write_mooncake(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    lines = [
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
        for t, i, o, h in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


MOONCAKE_ROWS = [
    (0, 1000, 50, [0, 1]),
    (500, 600, 20, [0, 2]),
    (1500, 1200, 30, [3, 4, 5]),
    (4000, 100, 10, [6]),
]


def test_mooncake_reader_turns_milliseconds_and_blocks_into_requests(tmp_path: Path):
    path = write_mooncake(tmp_path / "m.jsonl", MOONCAKE_ROWS)
    requests = list(read_mooncake(path))
    assert [r.arrival_s for r in requests] == [0.0, 0.5, 1.5, 4.0]
    assert (requests[0].input_tokens, requests[0].output_tokens) == (1000, 50)
    assert requests[1].hash_ids == (0, 2)


def test_mooncake_window_and_time_compression(tmp_path: Path):
    path = write_mooncake(tmp_path / "m.jsonl", MOONCAKE_ROWS)
    window = list(read_mooncake(path, ReplayOptions(start_s=0.5, duration_s=3.0)))
    assert [r.arrival_s for r in window] == [0.0, 1.0]  # relative to the window start
    fast = list(read_mooncake(path, ReplayOptions(time_compression=4)))
    assert [r.arrival_s for r in fast] == [0.0, 0.125, 0.375, 1.0]


def test_rate_scaling_keeps_the_time_axis_and_scales_the_count(tmp_path: Path):
    rows = [(t * 100, 500, 20, [t]) for t in range(2000)]
    path = write_mooncake(tmp_path / "m.jsonl", rows)
    half = list(read_mooncake(path, ReplayOptions(rate_scale=0.5, seed=1)))
    assert len(half) == pytest.approx(1000, rel=0.1)
    scaled = list(read_mooncake(path, ReplayOptions(rate_scale=2.5, seed=1)))
    assert len(scaled) == pytest.approx(5000, rel=0.05)
    assert scaled == sorted(scaled, key=lambda r: r.arrival_s)
    assert scaled[-1].arrival_s <= 199.9
    # Copies are other users: their prefix blocks do not collide with the original's.
    blocks = [r.hash_ids[0] for r in scaled]
    assert len(set(blocks)) == len(blocks)
    assert {b % COPY_HASH_ID_STRIDE for b in blocks} == set(range(2000))
    assert scaled == list(read_mooncake(path, ReplayOptions(rate_scale=2.5, seed=1)))


def test_unsorted_trace_is_refused(tmp_path: Path):
    path = write_mooncake(tmp_path / "m.jsonl", [(1000, 10, 1, []), (0, 10, 1, [])])
    with pytest.raises(ValueError, match="not sorted"):
        list(read_mooncake(path))


def test_azure_reader_parses_wall_clock_with_100ns_digits(tmp_path: Path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.5000000,374,44\n"
        "2023-11-16 23:59:59.9999999,396,109\n"
        "2023-11-17 00:00:01.2500000,100,0\n"
    )
    requests = list(read_azure(path))
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.4999999, 1.75], abs=1e-9)
    assert [(r.input_tokens, r.output_tokens) for r in requests] == [
        (374, 44),
        (396, 109),
        (100, 1),  # a request always yields at least one token
    ]
    assert all(r.hash_ids == () for r in requests)


def test_azure_reader_takes_the_2024_traces_zoned_timestamps(tmp_path: Path):
    # The 2024 week-long traces write microseconds and a zone; any zone is read as UTC.
    path = tmp_path / "azure2024.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        "2024-05-10 00:00:00.009930+00:00,2048,28\r\n"
        "2024-05-10T00:00:01.5Z,100,10\r\n"
        "2024-05-10 02:00:03.009930+02:00,300,20\r\n"
        "2024-05-09 23:00:04-01:00,400,30\r\n"
    )
    requests = list(read_azure(path))
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 1.49007, 3.0, 3.99007])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:17,10,1\n",
            "line 2: TIMESTAMP '16/11/2023 18:17': want 'YYYY-MM-DD HH:MM:SS.fffffff'",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,1\n"
            "2023-11-16 18:17:04,ten,1\n",
            "line 3: ContextTokens 'ten' is not a whole number",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,-10,1\n",
            "line 2: ContextTokens '-10' is not a whole number of at least 0",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10\n", "no GeneratedTokens"),
        ("TIMESTAMP,Context,Generated\n2023-11-16 18:17:03,10,1\n", "no ContextTokens, Generated"),
    ],
)
def test_a_malformed_azure_trace_names_the_line_or_column_to_fix(
    tmp_path: Path, text: str, message: str
):
    assert_refused(read_azure, tmp_path / "bad.csv", text, message)


def assert_refused(
    reader: Callable[[Path], Iterable[object]], path: Path, text: str, message: str
) -> None:
    """Reading `text` from `path` with `reader` raises a ValueError that says `message`."""
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        list(reader(path))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 0, "input_length": ', "not JSON (Expecting value, column 33)"),
        ('{"timestamp": 0, "output_length": 5}', "no input_length; a record holds"),
        ("[0, 10, 5]", "want a JSON object with timestamp (ms), input_length"),
        ('{"timestamp": "0", "input_length": 1, "output_length": 1}', "timestamp '0' is not"),
        ('{"timestamp": 0, "input_length": -3, "output_length": 1}', "input_length -3 is not"),
        ('{"timestamp": 0, "input_length": 1.5, "output_length": 1}', "input_length 1.5 is not"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 7}', "hash_ids is"),
    ],
)
def test_a_malformed_mooncake_trace_names_the_line_and_field_to_fix(
    tmp_path: Path, line: str, message: str
):
    path = tmp_path / "bad.jsonl"
    text = '{"timestamp": 0, "input_length": 10, "output_length": 5}\n' + line + "\n"
    assert_refused(read_mooncake, path, text, f"{path}, line 2: {message}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("\n\n", "the file is empty"),
        ("time,prompt,answer\n1,2,3\n", "not a trace this reads: want Mooncake JSONL"),
    ],
)
def test_read_trace_names_a_file_of_no_known_format(tmp_path: Path, text: str, message: str):
    path = tmp_path / "t.csv"
    assert_refused(read_trace, path, text, f"{path}: {message}")


def test_read_trace_tells_the_formats_apart_by_content(tmp_path: Path):
    mooncake = write_mooncake(tmp_path / "m.txt", MOONCAKE_ROWS)  # no .jsonl suffix needed
    assert [r.input_tokens for r in read_trace(mooncake)] == [1000, 600, 1200, 100]
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,2\n")
    assert [(r.input_tokens, r.output_tokens) for r in read_trace(azure)] == [(10, 2)]


def test_a_mooncake_record_of_zero_tokens_reads_as_one(tmp_path: Path):
    path = tmp_path / "zero.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 0, "output_length": 0}\n')
    [request] = list(read_mooncake(path))
    assert (request.input_tokens, request.output_tokens, request.hash_ids) == (1, 1, ())


def write_servegen(path: Path, rows: list[tuple[int, float, str, str]]) -> Path:
    lines = [
        "window_start_s,total_rate_rps,active_clients,mean_input_tokens,mean_output_tokens,len_coverage"
    ]
    lines += [
        f"{start},{rate},5,{mean_in},{mean_out},0.5" for start, rate, mean_in, mean_out in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


SERVEGEN_ROWS = [
    (0, 1000.0, "400", "50"),
    (600, 0.0, "", ""),  # a collection gap
    (1200, 3000.0, "100", "20"),
]


def test_servegen_windows_become_gamma_arrivals_and_gaps_are_skipped(tmp_path: Path):
    path = write_servegen(tmp_path / "sg.csv", SERVEGEN_ROWS)
    # 1000 and 3000 req/s scaled to 1 and 3 req/s; the gap collapses, so 1200 s of replay.
    requests = list(read_servegen(path, ReplayOptions(rate_scale=0.001), arrival_cv=1.5))
    assert requests[-1].arrival_s < 1200
    first, second = (
        [r for r in requests if r.arrival_s < 600],
        [r for r in requests if r.arrival_s >= 600],
    )
    assert len(first) / 600 == pytest.approx(1, rel=0.2)
    assert len(second) / 600 == pytest.approx(3, rel=0.12)
    assert statistics.fmean(r.input_tokens for r in first) == pytest.approx(400, rel=0.2)
    assert statistics.fmean(r.output_tokens for r in second) == pytest.approx(20, rel=0.1)


def test_servegen_compression_keeps_the_requests_and_shortens_the_time(tmp_path: Path):
    path = write_servegen(tmp_path / "sg.csv", SERVEGEN_ROWS)
    options = ReplayOptions(rate_scale=0.001, time_compression=60, start_s=300, seed=3)
    requests = list(read_servegen(path, options))
    # 300 s of the first window and 600 s of the third, 60 times faster: 15 s of replay.
    assert requests[-1].arrival_s < 15
    assert len(requests) == pytest.approx(300 * 1 + 600 * 3, rel=0.12)
    assert requests == list(read_servegen(path, options))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("window_start_s,total_rate_rps\n0,1\n", "no mean_input_tokens, mean_output_tokens column"),
        (
            "window_start_s,total_rate_rps,mean_input_tokens,mean_output_tokens\n0,1,5,5\n"
            "600,-2,5,5\n",
            "line 3: total_rate_rps -2 is negative",
        ),
        (
            "window_start_s,total_rate_rps,mean_input_tokens,mean_output_tokens\nsoon,1,5,5\n",
            "line 2: window_start_s is not a number",
        ),
        (
            "window_start_s,total_rate_rps,mean_input_tokens,mean_output_tokens\n600,1,5,5\n"
            "0,1,5,5\n",
            "line 3: windows are not sorted by time at 0 s",
        ),
    ],
)
def test_a_malformed_servegen_trace_names_the_line_or_column_to_fix(
    tmp_path: Path, text: str, message: str
):
    assert_refused(read_servegen, tmp_path / "bad.csv", text, message)


# --- the real traces --------------------------------------------------------------------------


def test_real_mooncake_trace_reads_whole():
    requests = list(read_mooncake(real_trace("conversation_trace.jsonl")))
    assert len(requests) == 12031
    assert requests[-1].arrival_s == pytest.approx(3537, abs=1)
    assert statistics.fmean(r.input_tokens for r in requests) == pytest.approx(12035, rel=0.01)
    assert all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in requests[:100])


def test_real_azure_trace_reads_whole():
    requests = list(read_azure(real_trace("AzureLLMInferenceTrace_conv.csv")))
    assert len(requests) == 19366
    assert requests[-1].arrival_s == pytest.approx(3502, abs=1)


@pytest.mark.parametrize("name", ["servegen_m-mid_aggregate.csv", "servegen_m-small_aggregate.csv"])
def test_real_servegen_trace_rescales_to_a_target_rate(name: str):
    # Two weeks at 1/600 of the time and the mean rate brought to ~5 req/s: about 2,000 s.
    options = ReplayOptions(rate_scale=1 / 600 / 200, time_compression=600)
    requests = list(read_servegen(real_trace(name), options))
    span = requests[-1].arrival_s
    assert 1800 < span < 2016
    assert 3 < len(requests) / span < 12
