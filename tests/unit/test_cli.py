"""`pdctl` as a user meets it: input a command cannot use is one line naming the option and
exit 2; every option says what it takes and its default; old spellings still work, with a
warning; `plan -o yaml` writes node selectors that real nodes carry."""

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from pd_operator.cli import run as run_module
from pd_tools.cli import tables
from pd_tools.cli.main import main, pdctl
from pdcases import ROOT
from traces import real_trace


def run(argv: list[str]) -> tuple[int, str, str]:
    """pdctl's exit status, stdout and stderr."""
    result = CliRunner().invoke(pdctl, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["sim", "replay", "--rate", "-1"], "--rate: want a number greater than 0, got -1"),
        (["sim", "replay", "--duration", "0"], "--duration: want a number greater than 0"),
        (["sim", "replay", "--rate-scale", "x"], "--rate-scale: want a number greater than 0"),
        (["sim", "replay", "--cache-hit", "1.5"], "--cache-hit: want a fraction from 0 to 1"),
        (["sim", "replay", "--warmup", "-1"], "--warmup: want a number of at least 0"),
        (["sim", "replay", "--input-tokens", "0.5"], "--input-tokens: want a length of at"),
        (["sim", "replay", "--model", "nope"], "--model: unknown model profile 'nope'; known: "),
        (["sim", "replay", "--policy", "hpaa"], "--policy: unknown policy 'hpaa'; choose from"),
        (["sim", "replay", "--policy", "dynamo-sla:prophet"], "only dynamo-sla:constant or"),
        (["sim", "replay", "--cluster", "h2000=2x8"], "--cluster: unknown profile in 'h2000=2x8'"),
        (["sim", "replay", "--cluster", "h200=2xq"], "want PROFILE=NODESxCARDS, e.g. h200=4x8"),
        (["sim", "replay", "--price", "h200"], "--price 'h200': want PROFILE=PRICE, PROFILE one"),
        (["sim", "replay", "--price", "h200=-3"], "the price must be a number of at least 0"),
        (["sim", "replay", "--trace", "/no/such.csv"], "--trace /no/such.csv: No such file"),
        (["sim", "replay", "--spec", "/no/such.yaml"], "--spec /no/such.yaml: No such file"),
        (["sim", "replay", "--output", "/no/such/out.json"], "--output: no folder /no/such to"),
        (["sim", "replay", "--routing", "random"], "--routing: 'random' is not one of"),
        (["plan", "--model", "nope"], "--model: unknown model profile 'nope'"),
        (["plan", "--share", "1.5"], "--share: want a share greater than 0 and at most"),
        (["plan", "--ttft-ms", "0"], "--ttft-ms: want a number greater than 0"),
        (["plan", "--candidate", "h200:cards=0"], "cards=0 is not a whole number of at least 1"),
        (["plan", "--candidate", "h200:price=abc"], "price='abc' is not a number"),
        (["plan", "--candidate", "h200:foo=1"], "unknown candidate option 'foo'; known: price"),
        (["plan", "--candidate", "b200"], "unknown hardware profile 'b200'; known:"),
        (["plan", "-o", "yaml", "--name", "Bad_Name"], "metadata.name must be a DNS label"),
        (["plan", "-o", "csv"], "--format: 'csv' is not one of 'table', 'yaml', 'json'"),
    ],
)
def test_bad_input_names_its_option_in_one_line_and_exits_2(argv: list[str], says: str) -> None:
    status, out, err = run(argv)
    assert status == 2
    assert out == ""  # nothing ran
    assert says in err
    command = " ".join(argv[:2] if argv[0] == "sim" else argv[:1])
    assert err.splitlines()[-1].startswith(f"pdctl {command}: ")
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
    tmp_path: Path, document: str, says: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(document)
    status, out, err = run(["sim", "replay", "--spec", str(spec)])
    assert (status, out) == (2, "")
    assert f"pdctl sim replay: --spec {spec}: " in err
    assert says in err


@pytest.mark.parametrize("command", [["sim", "replay"], ["plan"]])
def test_a_window_past_the_trace_end_says_where_the_trace_ends(command: list[str]) -> None:
    trace = real_trace("conversation_trace.jsonl")
    status, out, err = run([*command, "--trace", str(trace), "--start", "99999"])
    assert (status, out) == (2, "")
    assert "no request in the window --start 99999; the trace's last arrival is at 3,537 s" in err


@pytest.mark.parametrize("command", [["sim", "replay"], ["plan"]])
def test_an_empty_or_malformed_trace_is_refused_with_its_line(
    command: list[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    status, out, err = run([*command, "--trace", str(empty)])
    assert (status, out) == (2, "")
    assert f"--trace {empty}: {empty}: the file is empty" in err
    gaps = tmp_path / "gaps.csv"  # ServeGen windows that are all collection gaps
    gaps.write_text("window_start_s,total_rate_rps,mean_input_tokens,mean_output_tokens\n0,0,,\n")
    status, out, err = run([*command, "--trace", str(gaps)])
    assert (status, out) == (2, "")
    assert f"--trace {gaps}: the trace holds no request" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"timestamp": 0, "output_length": 5}\n')
    status, out, err = run([*command, "--trace", str(broken)])
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
    cluster: str, says: str
) -> None:
    argv = ["sim", "replay", "--rate", "1", "--duration", "60", "--cluster", cluster]
    status, out, err = run(argv)
    assert (status, out) == (2, "")  # not a run that serves nothing and reports 0.000
    assert "pdctl sim replay: --cluster: no node holds a replica of " in err
    assert says in err


def test_every_policy_name_is_checked_before_any_runs() -> None:
    argv = ["sim", "replay", "--rate", "1", "--duration", "60"]
    status, out, err = run([*argv, "--policy", "hpa", "--policy", "orcale"])
    assert (status, out) == (2, "")  # hpa did not run first only to be thrown away
    assert "unknown policy 'orcale'" in err


SIM_CLUSTER = ["sim", "cluster", "--profile", "p.yaml", "--load", "constant:1", "--target", "a/b"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--workers", "0"], "pdctl run: --workers: want a whole number of at least 1"),
        (["run", "--metrics-port", "70000"], "pdctl run: --metrics-port: want a port from 1 to"),
        (["run", "--resync-seconds", "-5"], "pdctl run: --resync-seconds: want a number greater"),
        (
            [*SIM_CLUSTER, "--time-scale", "0"],
            "pdctl sim cluster: --time-scale: want a number greater than 0",
        ),
        (["demo", "--duration", "-1"], "pdctl demo: --duration: want a number greater than 0"),
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
        (SIM_CLUSTER[:-2], "pdctl sim cluster: Missing option '--target'"),
        (
            [*SIM_CLUSTER, "--engine", "trt"],
            "pdctl sim cluster: --engine: 'trt' is not one of VLLM, SGLang (in any case)",
        ),
        (["run", "--kubeconfig", "/no/kubeconfig"], "pdctl run: --kubeconfig: /no/kubeconfig: no"),
        (["run", "--no-such-flag"], "pdctl run: No such option '--no-such-flag'"),
    ],
)
def test_the_other_commands_refuse_input_they_cannot_use(argv: list[str], says: str) -> None:
    status, out, err = run(argv)
    assert (status, out) == (2, "")
    assert says in err
    assert len(err.splitlines()) == 1


def test_a_broken_profile_or_kubeconfig_is_named_in_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\nnodes: 5\n")
    argv = ["sim", "cluster", "--profile", str(profile), "--load", "constant:1", "--target", "a/b"]
    status, out, err = run(argv)
    assert (status, out) == (2, "")
    assert f"--profile {profile}: nodeGroups: Field required; nodes: Extra inputs" in err
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    status, out, err = run(["run", "--kubeconfig", str(kubeconfig)])
    assert (status, out) == (2, "")
    assert err.strip() == (
        f"pdctl run: --kubeconfig: {kubeconfig}: not YAML: line 2, column 1: expected the node"
        " content, but found '<stream end>'"
    )


def test_leader_election_flags_are_checked_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "POD_NAMESPACE_FILE", tmp_path / "absent")
    status, _, err = run(["run", "--leader-election-namespace", "ops"])
    assert status == 2
    assert "--leader-election-namespace needs --leader-election" in err
    status, _, err = run(["run", "--leader-election"])
    assert status == 2
    assert "needs --leader-election-namespace NAMESPACE" in err
    # In a pod, the Lease lives in the pod's own namespace.
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("pd-operator-system\n")
    monkeypatch.setattr(run_module, "POD_NAMESPACE_FILE", namespace_file)
    assert run_module.lease_namespace(True, None) == "pd-operator-system"


def test_peering_is_gone_and_says_what_replaces_it() -> None:
    # kopf peering paused kopf's watches only; the operator's own Lease guards every write.
    status, _, err = run(["run", "--peering", "pd"])
    assert status == 2
    assert "--peering: removed" in err
    assert "--leader-election" in err


def test_main_returns_the_exit_status_for_the_entry_points(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `pdctl` (the console script) and `python -m pd_operator` call main() and exit with it.
    assert main(["run", "--workers", "0"]) == 2
    assert (
        capsys.readouterr().err
        == "pdctl run: --workers: want a whole number of at least 1, got 0\n"
    )
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("pdctl ")
    assert main(["run", "--help"]) == 0
    assert "--leader-election" in capsys.readouterr().out


def commands(
    command: click.Command, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    """Every command under `command` (itself included), each with the context it runs in."""
    yield command, ctx
    if isinstance(command, click.Group):
        for name, child in command.commands.items():
            yield from commands(child, click.Context(child, info_name=name, parent=ctx))


def every_command() -> list[tuple[click.Command, click.Context]]:
    root = click.Context(pdctl, info_name="pdctl", **pdctl.context_settings)
    return list(commands(pdctl, root))


def test_the_commands_are_run_sim_cluster_sim_replay_plan_and_demo() -> None:
    paths = {ctx.command_path for _, ctx in every_command()}
    assert paths == {
        "pdctl",
        "pdctl run",
        "pdctl sim",
        "pdctl sim cluster",
        "pdctl sim replay",
        "pdctl plan",
        "pdctl demo",
    }


def test_every_option_of_every_command_says_what_it_takes() -> None:
    for command, ctx in every_command():
        assert command.help or command.short_help, ctx.command_path
        for param in command.params:
            assert isinstance(param, click.Option), f"{ctx.command_path}: {param.name}"
            if param.hidden:  # a removed option: not in --help, but says what replaced it
                assert param.help, f"{ctx.command_path} {param.opts}: no help"
                continue
            record = param.get_help_record(ctx)
            assert record is not None and record[1], f"{ctx.command_path} {param.opts}: no help"


def test_every_default_is_shown_in_the_help() -> None:
    shown = 0
    for command, ctx in every_command():
        for param in command.params:
            assert isinstance(param, click.Option)
            default = param.get_default(ctx, call=False)
            # Flags off, repeatable options given none, and options without one show none.
            if not isinstance(default, int | float | str | tuple) or default in (False, ()):
                continue
            record = param.get_help_record(ctx)
            assert record is not None and "[default: " in record[1], (
                f"{ctx.command_path} {param.opts}: default {default!r} not shown"
            )
            shown += 1
    assert shown > 40
    _, out, _ = run(["plan", "--help"])
    words = " ".join(out.split())  # as wrapped to the terminal
    assert "[default: 6000.0]" in words and "[default: mtt-s5000, h200, h20]" in words


def test_simulate_still_runs_sim_replay_with_a_warning() -> None:
    argv = ["--rate", "1", "--duration", "120", "--policy", "hpa", "-o", "json"]
    status, out, err = run(["sim", "replay", *argv])
    assert (status, err) == (0, "")
    old_status, old_out, old_err = run(["simulate", *argv])
    assert old_status == 0
    (new,), (old,) = json.loads(out), json.loads(old_out)
    assert new.pop("wall_s") > 0 and old.pop("wall_s") > 0
    assert old == new
    assert old_err == "pdctl: simulate is deprecated; use sim replay\n"
    # Not listed: the help shows one name per command.
    _, help_out, _ = run(["--help"])
    listed = [line.split()[0] for line in help_out.split("Commands:")[1].strip().splitlines()]
    assert listed == ["demo", "plan", "run", "sim"]


def test_old_option_names_still_work_with_one_warning_line(tmp_path: Path) -> None:
    trace = tmp_path / "steady.jsonl"
    rows = [{"timestamp": k * 500, "input_length": 2000, "output_length": 50} for k in range(240)]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["sim", "replay", "--trace", str(trace), "--policy", "static-peak", "-o", "json"]
    status, out, err = run([*argv, "--trace-compression", "2"])
    assert (status, err) == (0, "")
    old_status, old_out, old_err = run([*argv, "--time-compression=2"])
    assert old_status == 0
    (new,), (old,) = json.loads(out), json.loads(old_out)
    assert new.pop("wall_s") > 0 and old.pop("wall_s") > 0
    assert old == new and new["simulated_s"] < 70  # the trace's 120 s played in 60
    assert old_err == (
        "pdctl sim replay: --time-compression is deprecated; use --trace-compression\n"
    )
    # The old name's errors are the new name's.
    status, _, err = run(["sim", "replay", "--time-compression", "0"])
    assert status == 2
    assert err.splitlines() == [
        "pdctl sim replay: --time-compression is deprecated; use --trace-compression",
        "pdctl sim replay: --trace-compression: want a number greater than 0, got 0",
    ]
    status, _, err = run(["demo", "--load", "everything"])
    assert status == 2
    assert err.splitlines()[0] == "pdctl demo: --load is deprecated; use --workload"
    assert "pdctl demo: --workload: 'everything' is not one of 'auto', 'trace'" in err
    _, help_out, _ = run(["demo", "--help"])
    assert "--workload" in help_out and "--load" not in help_out


def test_demo_load_names_the_workload(capsys: pytest.CaptureFixture[str]) -> None:
    demo = pdctl.commands["demo"]
    root = click.Context(pdctl, info_name="pdctl")
    params = demo.make_context("demo", ["--load", "slice"], parent=root).params
    assert params["workload"] == "slice"
    assert capsys.readouterr().err == "pdctl demo: --load is deprecated; use --workload\n"


@pytest.mark.parametrize(
    ("given", "engine"), [("vllm", "VLLM"), ("VLLM", "VLLM"), ("sglang", "SGLang")]
)
def test_sim_cluster_takes_the_api_s_engine_names_in_any_case(given: str, engine: str) -> None:
    cluster = pdctl.commands["sim"].commands["cluster"]
    params = cluster.make_context("cluster", [*SIM_CLUSTER[2:], "--engine", given]).params
    assert params["engine"] == engine
    _, out, _ = run(["sim", "cluster", "--help"])
    assert "[VLLM|SGLang]" in out and "[default: VLLM]" in " ".join(out.split())


def test_plan_yaml_selects_the_nodes_real_clusters_label() -> None:
    """The nodeSelector values are the vendors' gpu.product labels (NVIDIA-H200, MTT-S5000), the
    ones config/clusters and config/samples carry, not the profile names."""
    argv = ["plan", "--rate", "3", "--input-tokens", "12000", "--output-tokens", "350"]
    argv += ["--cache-hit", "0.3", "--candidate", "mtt-s5000", "--candidate", "h200", "-o", "yaml"]
    status, out, _ = run(argv)
    assert status == 0
    spec = yaml.safe_load(out)["spec"]
    selectors = {
        pool["accelerator"]["profile"]: pool["accelerator"]["nodeSelector"]
        for role in ("prefill", "decode")
        for pool in spec[role]["pools"]
    }
    assert selectors == {
        "mtt-s5000": {"mthreads.com/gpu.product": "MTT-S5000"},
        "h200": {"nvidia.com/gpu.product": "NVIDIA-H200"},
    }
    # Each selector matches the labels of the nodes that hold that profile's cards.
    groups = yaml.safe_load((ROOT / "config" / "clusters" / "articles.yaml").read_text())
    for group in groups["nodeGroups"]:
        profile = group["accelerators"][0]["profile"]
        assert selectors[profile].items() <= group["labels"].items()


def test_tables_share_one_renderer_with_numbers_aligned_right() -> None:
    table = tables.render(("name", "count"), [{"name": "a", "count": "1"}, {"name": "bb"}])
    assert table.splitlines() == [
        "| name | count |",
        "|------|------:|",
        "| a    |     1 |",
        "| bb   |       |",
    ]
    _, out, _ = run(["plan", "--rate", "0.5", "--input-tokens", "8000"])
    assert out.splitlines()[:2] == [
        "| role    | profile | replicas | cards | cost/h |",
        "|---------|---------|---------:|------:|-------:|",
    ]
    _, out, _ = run(["sim", "replay", "--rate", "1", "--duration", "60", "--policy", "hpa"])
    header, rule, row = out.splitlines()[:3]
    assert header.split("|")[1].strip() == "policy" and row.split("|")[1].strip() == "hpa"
    assert rule.startswith("|--") and rule.endswith(":|")
