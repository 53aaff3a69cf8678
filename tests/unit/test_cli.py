"""`pdctl simulate` and `pdctl plan` on input they cannot use: one line naming the flag, exit 2."""

from pathlib import Path

import pytest

from pd_operator.cli import main as cli
from pd_operator.cli.main import main
from traces import real_trace


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """pdctl's exit status, stdout and stderr; argparse's own errors exit through SystemExit."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["simulate", "--rate", "-1"], "argument --rate: want a number greater than 0, got -1"),
        (["simulate", "--duration", "0"], "argument --duration: want a number greater than 0"),
        (["simulate", "--rate-scale", "x"], "argument --rate-scale: want a number greater than 0"),
        (["simulate", "--cache-hit", "1.5"], "argument --cache-hit: want a fraction from 0 to 1"),
        (["simulate", "--warmup", "-1"], "argument --warmup: want a number of at least 0"),
        (["simulate", "--input-tokens", "0.5"], "argument --input-tokens: want a length of at"),
        (["simulate", "--model", "nope"], "--model: unknown model profile 'nope'; known: "),
        (["simulate", "--policy", "hpaa"], "--policy: unknown policy 'hpaa'; choose from"),
        (["simulate", "--policy", "dynamo-sla:prophet"], "only dynamo-sla:constant or"),
        (["simulate", "--cluster", "h2000=2x8"], "--cluster: unknown profile in 'h2000=2x8'"),
        (["simulate", "--cluster", "h200=2xq"], "want PROFILE=NODESxCARDS, e.g. h200=4x8"),
        (["simulate", "--price", "h200"], "--price 'h200': want PROFILE=PRICE, PROFILE one of"),
        (["simulate", "--price", "h200=-3"], "the price must be a number of at least 0"),
        (["simulate", "--trace", "/no/such.csv"], "--trace /no/such.csv: No such file"),
        (["simulate", "--spec", "/no/such.yaml"], "--spec /no/such.yaml: No such file"),
        (["simulate", "--output", "/no/such/out.json"], "--output: no folder /no/such to write"),
        (["plan", "--model", "nope"], "--model: unknown model profile 'nope'"),
        (["plan", "--share", "1.5"], "argument --share: want a share greater than 0 and at most"),
        (["plan", "--ttft-ms", "0"], "argument --ttft-ms: want a number greater than 0"),
        (["plan", "--candidate", "h200:cards=0"], "cards=0 is not a whole number of at least 1"),
        (["plan", "--candidate", "h200:price=abc"], "price='abc' is not a number"),
        (["plan", "--candidate", "h200:foo=1"], "unknown candidate option 'foo'; known: price"),
        (["plan", "--candidate", "b200"], "unknown hardware profile 'b200'; known:"),
        (["plan", "-o", "yaml", "--name", "Bad_Name"], "metadata.name must be a DNS label"),
    ],
)
def test_bad_input_names_its_flag_in_one_line_and_exits_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(argv, capsys)
    assert status == 2
    assert out == ""  # nothing ran
    assert says in err
    assert err.splitlines()[-1].startswith(f"pdctl {argv[0]}: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ("just text\n", "not a PDDeployment document (want a YAML mapping)"),
        ("a: [unclosed\n", "not YAML"),
        ("kind: PDDeployment\nspec: {}\n", "spec.model"),  # the API's own message names fields
    ],
)
def test_a_spec_pdctl_cannot_use_is_named_with_what_is_wrong(
    tmp_path: Path, document: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(document)
    status, out, err = run(["simulate", "--spec", str(spec)], capsys)
    assert (status, out) == (2, "")
    assert f"pdctl simulate: --spec {spec}: " in err
    assert says in err


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_a_window_past_the_trace_end_says_where_the_trace_ends(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = real_trace("conversation_trace.jsonl")
    status, out, err = run([command, "--trace", str(trace), "--start", "99999"], capsys)
    assert (status, out) == (2, "")
    assert "no request in the window --start 99999; the trace's last arrival is at 3,537 s" in err


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_an_empty_or_malformed_trace_is_refused_with_its_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    status, out, err = run([command, "--trace", str(empty)], capsys)
    assert (status, out) == (2, "")
    assert f"--trace {empty}: {empty}: the file is empty" in err
    gaps = tmp_path / "gaps.csv"  # ServeGen windows that are all collection gaps
    gaps.write_text("window_start_s,total_rate_rps,mean_input_tokens,mean_output_tokens\n0,0,,\n")
    status, out, err = run([command, "--trace", str(gaps)], capsys)
    assert (status, out) == (2, "")
    assert f"--trace {gaps}: the trace holds no request" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"timestamp": 0, "output_length": 5}\n')
    status, out, err = run([command, "--trace", str(broken)], capsys)
    assert (status, out) == (2, "")
    assert f"{broken}, line 1: no input_length" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("cluster", "says"),
    [
        ("h200=4", "no node holds a replica of any prefill pool: s5000 (mtt-s5000, 8 cards)"),
        ("h200=0x8,mtt-s5000=2x8", "no node holds a replica of any decode pool: h200"),
        ("h200=2x4,mtt-s5000=2x8", "any decode pool: h200 (h200, 8 cards); add nodes, e.g. h200"),
    ],
)
def test_a_cluster_that_cannot_hold_a_role_is_refused_before_the_run(
    cluster: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--rate", "1", "--duration", "60", "--cluster", cluster]
    status, out, err = run(argv, capsys)
    assert (status, out) == (2, "")  # not a run that serves nothing and reports 0.000
    assert "pdctl simulate: --cluster: no node holds a replica of " in err
    assert says in err


def test_every_policy_name_is_checked_before_any_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--rate", "1", "--duration", "60", "--policy", "hpa", "--policy", "orcale"]
    status, out, err = run(argv, capsys)
    assert (status, out) == (2, "")  # hpa did not run first only to be thrown away
    assert "unknown policy 'orcale'" in err


SIM_CLUSTER = ["sim", "cluster", "--profile", "p.yaml", "--load", "constant:1", "--target", "a/b"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--workers", "0"], "pdctl run: error: argument --workers: want a whole number"),
        (["run", "--metrics-port", "70000"], "argument --metrics-port: want a port from 1 to"),
        (["run", "--resync-seconds", "-5"], "argument --resync-seconds: want a number greater"),
        (
            [*SIM_CLUSTER, "--time-scale", "0"],
            "pdctl sim cluster: error: argument --time-scale: want a number greater than 0",
        ),
        (["demo", "--duration", "-1"], "pdctl demo: error: argument --duration: want a number"),
        (
            ["sim", "cluster", "--profile", "p.yaml", "--load", "consant:1", "--target", "a/b"],
            "pdctl sim cluster: --load: bad load 'consant:1' (unknown form); expected one of",
        ),
        (
            [
                "sim",
                "cluster",
                "--profile",
                "/no/such.yaml",
                "--load",
                "constant:1",
                "--target",
                "a/b",
            ],
            "pdctl sim cluster: --profile /no/such.yaml: No such file or directory",
        ),
        (
            [*SIM_CLUSTER[:5], "trace:/no/trace.jsonl", *SIM_CLUSTER[6:]],
            "pdctl sim cluster: --load: /no/trace.jsonl: No such file or directory",
        ),
        (["run", "--kubeconfig", "/no/kubeconfig"], "pdctl run: --kubeconfig: /no/kubeconfig: no"),
    ],
)
def test_the_other_commands_refuse_numbers_they_cannot_use(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(argv, capsys)
    assert (status, out) == (2, "")
    assert says in err


def test_a_broken_profile_or_kubeconfig_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\nnodes: 5\n")
    argv = ["sim", "cluster", "--profile", str(profile), "--load", "constant:1", "--target", "a/b"]
    status, out, err = run(argv, capsys)
    assert (status, out) == (2, "")
    assert f"--profile {profile}: nodeGroups: Field required; nodes: Extra inputs" in err
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    status, out, err = run(["run", "--kubeconfig", str(kubeconfig)], capsys)
    assert (status, out) == (2, "")
    assert err.strip() == (
        f"pdctl run: --kubeconfig: {kubeconfig}: not YAML: line 2, column 1: expected the node"
        " content, but found '<stream end>'"
    )


def test_leader_election_flags_are_checked_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "POD_NAMESPACE_FILE", tmp_path / "absent")
    assert main(["run", "--leader-election-namespace", "ops"]) == 2
    assert "--leader-election-namespace needs --leader-election" in capsys.readouterr().err
    assert main(["run", "--leader-election"]) == 2
    assert "needs --leader-election-namespace NAMESPACE" in capsys.readouterr().err
    # In a pod, the Lease lives in the pod's own namespace.
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("pd-operator-system\n")
    monkeypatch.setattr(cli, "POD_NAMESPACE_FILE", namespace_file)
    args = cli.build_parser().parse_args(["run", "--leader-election"])
    assert cli._lease_namespace(args) == "pd-operator-system"
