"""The engine-simulator image (Dockerfile.engine-sim) and the shims it runs (hack/engine-sim/).

Images cannot be built on CI's machines, so the Dockerfile is read as text, as the operator's is
(test_chart_dockerfile.py), and the shims run as processes with the image's PATH layout: the
shims first, then a `python` that is this test's interpreter (or one that records its argv).
What a user would notice: a pod's `vllm serve ...` that does not start the simulator, or that
listens where neither probes nor the router reach it; a preStop `python3 -c` that breaks; an
image that runs as root, lacks the shims or cannot be built from the context.
"""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dockerfiles import build_stages, instructions
from pd_operator.api import parse_pddeployment
from pd_operator.core.children import build_deployment
from pd_operator.core.drain import SCRIPT as DRAIN_SCRIPT
from pd_operator.core.drain import drain_command
from pd_operator.core.engine_args import engine_command, engine_port
from pd_operator.core.hardware import HARDWARE_PROFILES
from pd_operator.core.router import (
    DEFAULT_IMAGES,
    build_endpoint_service,
    build_router_deployment,
)
from pd_tools.enginesim.http_engine import parse_config
from pd_tools.enginesim.vllm_api import FILLER_TOKEN
from pdcases import ROOT, SAMPLES, load_sample

DOCKERFILE = (ROOT / "Dockerfile.engine-sim").read_text()
SHIMS = ROOT / "hack" / "engine-sim"
SHIM_NAMES = ("vllm", "python3")
SIMULATOR = ["-m", "pd_tools.enginesim.http_engine"]
HOST = "127.0.79.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
MODEL = "zai-org/GLM-4.6-FP8"
NIXL_CONSUMER = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
SIM_ENV = {"PD_SIM_HARDWARE": "h200", "PD_SIM_MODEL": "glm-4.5-fp8", "PD_SIM_LOAD_SECONDS": "0.5"}


# --- the Dockerfile, read as text -----------------------------------------------------------


INSTRUCTIONS = instructions(DOCKERFILE)


def final(keyword: str) -> list[str]:
    return [rest for k, rest in build_stages(INSTRUCTIONS)[-1] if k == keyword]


def final_path() -> list[str]:
    """The final stage's PATH, entries in order ($PATH left as written)."""
    for rest in reversed(final("ENV")):
        for assignment in shlex.split(rest):
            name, _, value = assignment.partition("=")
            if name == "PATH":
                return value.split(":")
    raise AssertionError("the final stage sets no PATH: the shims would not be found")


def shim_copy() -> tuple[list[str], list[str], str]:
    """(flags, sources, destination) of the final stage's COPY of the shims."""
    for rest in final("COPY"):
        *words, destination = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        sources = [w for w in words if not w.startswith("--")]
        if any(source.startswith("hack/engine-sim") for source in sources):
            return flags, sources, destination
    raise AssertionError("the final stage copies no shim from hack/engine-sim/")


def test_multi_stage_build_installs_the_projects_wheel_on_python_311_slim():
    args = dict(rest.partition("=")[::2] for k, rest in INSTRUCTIONS if k == "ARG" and "=" in rest)
    images = [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
        for k, rest in INSTRUCTIONS
        if k == "FROM"
    ]
    assert len(images) >= 2
    for image in images:
        name, _, tag = image.partition(":")
        assert name in ("python", "docker.io/library/python"), image
        assert tag.startswith("3.11") and "slim" in tag and "latest" not in tag, image
    build = " ".join(rest for k, rest in build_stages(INSTRUCTIONS)[0] if k == "RUN")
    assert "pip wheel" in build
    # The project's own wheel, no extra (no "[...]"), with the pinned dependencies.
    assert re.search(r"pip install --constraint \S+ /wheels/pd_operator-\*\.whl(\s|$)", build)
    assert "import pd_tools.enginesim.http_engine" in build  # the build fails without aiohttp
    # The final image gets the installed virtualenv, not sources or a compiler.
    assert not final("RUN")
    copies = [shlex.split(rest) for rest in final("COPY")]
    assert ["--from=build", "/opt/pd-operator", "/opt/pd-operator"] in copies


def test_final_stage_runs_as_a_non_root_numeric_user():
    users = final("USER")
    assert users, "the final stage sets no USER: the engine would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, users[-1]  # numeric: runAsNonRoot can verify it
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_the_shims_are_executable_and_first_on_path_before_pythons():
    flags, sources, destination = shim_copy()
    assert "--chmod=0755" in flags  # executable whatever the checkout's modes
    assert sorted(Path(s).name for s in sources) == sorted(SHIM_NAMES)
    assert all((ROOT / s).read_text().startswith("#!/bin/sh\n") for s in sources)
    path = final_path()
    shim_dir = destination.rstrip("/")
    # `vllm` and `python3` resolve to the shims; their `python` to the virtualenv's; the base
    # image's own python3 stays behind both.
    assert path.index(shim_dir) < path.index("/opt/pd-operator/bin") < path.index("$PATH")


def test_no_entrypoint_so_the_pods_command_runs_as_written_and_the_port_is_exposed():
    assert not final("ENTRYPOINT")  # Kubernetes' `command:` replaces ENTRYPOINT and CMD
    for cmd in final("CMD"):
        assert isinstance(json.loads(cmd), list)  # exec form, no shell in between
    exposed = {int(port) for rest in final("EXPOSE") for port in rest.split()}
    assert engine_port("VLLM") in exposed


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `**` spans directories, `*` and `?` do not."""
    out = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
    return re.compile(out.replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + r"\Z")


def ignored(path: str, dockerignore: str) -> bool:
    """Whether `dockerignore` keeps `path` out of the build context (last match wins; a
    matching folder takes everything below it)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for line in dockerignore.splitlines():
        pattern = line.strip()
        if pattern and not pattern.startswith("#"):
            regex = _pattern(pattern.lstrip("!").strip("/"))
            if any(regex.match(prefix) for prefix in prefixes):
                result = not pattern.startswith("!")
    return result


def test_everything_the_build_copies_is_in_the_build_context():
    # BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile before .dockerignore.
    own = ROOT / "Dockerfile.engine-sim.dockerignore"
    ignore_file = own if own.exists() else ROOT / ".dockerignore"
    sources = []
    for keyword, rest in INSTRUCTIONS:
        if keyword == "COPY" and not rest.startswith("--from="):
            sources += [w.rstrip("/") for w in shlex.split(rest)[:-1] if not w.startswith("--")]
    assert "operator" in sources and "hack/engine-sim/vllm" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source, ignore_file.read_text()), (
            f"{ignore_file.name} keeps {source} out of the build context, and the build copies"
            " it: add `!hack/engine-sim/`"
        )


# --- the shims, run as processes ------------------------------------------------------------


def image_like_path(tmp_path: Path, python: str) -> str:
    """PATH as in the image under `tmp_path`: the shims (byte-identical copies, executable as
    COPY --chmod makes them), then a folder whose `python` runs the sh line `python`."""
    shim_dir, python_dir = tmp_path / "engine-sim-bin", tmp_path / "python-bin"
    shim_dir.mkdir(parents=True)
    python_dir.mkdir(parents=True)
    for name in SHIM_NAMES:
        shutil.copyfile(SHIMS / name, shim_dir / name)
        (shim_dir / name).chmod(0o755)
    (python_dir / "python").write_text(f"#!/bin/sh\n{python}\n")
    (python_dir / "python").chmod(0o755)
    return f"{shim_dir}:{python_dir}:/usr/bin:/bin"


def clean_env(path: str) -> dict[str, str]:
    """This environment without simulator or vLLM settings (the simulator refuses unknown
    PD_SIM_* variables), with `path` as PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PD_SIM_", "VLLM_"))}
    return env | {"PATH": path}


class Recorder:
    """Shims whose `python` writes its argv as JSON instead of running."""

    def __init__(self, tmp_path: Path) -> None:
        self.record = tmp_path / "argv.json"
        code = f"import json, sys; open({str(self.record)!r}, 'w').write(json.dumps(sys.argv[1:]))"
        python = f'exec {shlex.quote(sys.executable)} -c {shlex.quote(code)} "$@"'
        self.env = clean_env(image_like_path(tmp_path / "recorder", python))

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.record.unlink(missing_ok=True)
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=30, check=False
        )

    def python_argv(self, argv: list[str]) -> list[str]:
        """The arguments the shims give `python` for the command `argv`."""
        result = self.run(argv)
        assert result.returncode == 0, result.stderr
        recorded: list[str] = json.loads(self.record.read_text())
        return recorded


@pytest.fixture
def recorder(tmp_path: Path) -> Recorder:
    return Recorder(tmp_path)


VLLM_SPECS = [
    spec
    for spec in (parse_pddeployment(load_sample(p)).spec for p in SAMPLES)
    if spec.model.engine == "VLLM"
]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pods_vllm_command_reaches_the_simulator_listening_on_every_address(recorder, role):
    spec = VLLM_SPECS[0]
    pool = spec.pools(role)[0]
    argv = engine_command(spec, role, pool)
    assert argv[:2] == ["vllm", "serve"]
    forwarded = recorder.python_argv(argv)
    assert forwarded == [*SIMULATOR, "vllm", "serve", "--host", "0.0.0.0", *argv[2:]]
    env = SIM_ENV | {"PD_SIM_HARDWARE": pool.accelerator.profile or "h200"}
    config = parse_config(forwarded[len(SIMULATOR) :], env)
    # Probes and the router dial the pod's IP, as with vLLM, whose default is every address.
    assert (config.host, config.port, config.role) == ("0.0.0.0", engine_port("VLLM"), role)
    assert config.served_names == (spec.model.name,)
    # A --host in spec.model.args (appended last) still decides.
    again = recorder.python_argv([*argv, "--host", "127.0.79.9"])
    assert parse_config(again[len(SIMULATOR) :], env).host == "127.0.79.9"


def test_arguments_pass_through_unsplit_and_unglobbed(recorder):
    odd = ['{"a": "b c"}', "*", "$HOME", "", "--x=' \"y\"'"]
    assert recorder.python_argv(["vllm", "serve", "m", *odd])[-len(odd) :] == odd


def test_python3_is_the_images_python_for_the_prestop_hook(recorder):
    hook = drain_command("VLLM", "decode", 60)
    assert hook[0] == "python3"
    assert recorder.python_argv(hook) == hook[1:]
    assert recorder.python_argv(["python3"]) == []
    assert recorder.python_argv(["python3", "-m", "json.tool", "x"]) == ["-m", "json.tool", "x"]


def test_an_sglang_pods_command_is_handed_to_the_simulator_verbatim(recorder):
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--host", "0.0.0.0"]
    assert recorder.python_argv(argv) == [*SIMULATOR, *argv]


@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "bench", "serve"],
        ["vllm"],
        ["vllm", "--version"],
        ["vllm", "Serve", "m"],
        ["python3", "-m", "sglang.bench_serving"],
        ["python3", "-m", "sglang"],
    ],
    ids=" ".join,
)
def test_a_command_the_shims_do_not_know_exits_2_saying_what_they_simulate(recorder, argv):
    result = recorder.run(argv)
    assert result.returncode == 2
    assert "engine simulator" in result.stderr and "is simulated" in result.stderr
    assert " ".join(argv[1:]) in result.stderr  # says what it was given
    assert not recorder.record.exists()  # nothing started


# --- the simulator served through the shim, as in a pod -------------------------------------


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# No proxy: an HTTP_PROXY in the environment must not take loopback requests.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(url: str, body: dict[str, object] | None = None, headers: dict[str, str] | None = None):
    """(status, body text) of a GET, or a POST of `body` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", **(headers or {})})  # fmt: skip
    try:
        with OPENER.open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Engine:
    """A simulator process started through the shim, and the image-like environment it got."""

    def __init__(
        self, popen: subprocess.Popen[bytes], log: Path, url: str, env: dict[str, str]
    ) -> None:
        self.popen, self.log, self.url, self.env = popen, log, url, env

    def tail(self) -> str:
        return f"--- engine log ---\n{self.log.read_text()[-3000:]}"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """`vllm serve ...` as a decode pod runs it, through the shim, on its own loopback address."""
    port = free_port(HOST)
    python = f'exec {shlex.quote(sys.executable)} "$@"'
    env = clean_env(image_like_path(tmp_path / "pod", python))
    argv = ["vllm", "serve", MODEL, "--port", str(port), "--host", HOST,
            "--tensor-parallel-size", "8", "--kv-transfer-config", NIXL_CONSUMER]  # fmt: skip
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, env=env | SIM_ENV, stdout=out, stderr=subprocess.STDOUT)
    served = Engine(popen, log, f"http://{HOST}:{port}", env)
    try:
        yield served
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(STOP_TIMEOUT_S)
        print(served.tail())  # captured: pytest shows it when the test fails


def wait_until_healthy(engine: Engine) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert engine.popen.poll() is None, engine.tail()
        try:
            if http(engine.url + "/health")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.1)
    raise AssertionError(f"/health was not 200 within {START_TIMEOUT_S} s\n{engine.tail()}")


def prompt_tokens_by_source(engine: Engine) -> dict[str, float]:
    status, text = http(engine.url + "/metrics")
    assert status == 200
    return {
        sample.labels["source"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:prompt_tokens_by_source_total"
    }


def test_the_shim_serves_a_decode_request_drains_and_exits_0_on_sigterm(engine):
    wait_until_healthy(engine)
    # A decode pod's request from vllm-router: the client's body plus the prefill engine's
    # kv_transfer_params (NIXL's shape, docs/engine-simulator.md), one block per 16 tokens.
    request_id = f"___prefill_addr_127.0.79.2:8000___decode_addr_{HOST}:8000_5e1f"
    words = 20
    body = {
        "model": MODEL,
        "prompt": " ".join(["word"] * words),
        "max_tokens": 5,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [0, 1],
            "remote_engine_id": "prefill-engine",
            "remote_request_id": f"cmpl-{request_id}-0",
            "remote_host": "127.0.79.2",
            "remote_port": 5600,
            "tp_size": 8,
        },
    }
    status, text = http(engine.url + "/v1/completions", body, {"X-Request-Id": request_id})
    assert status == 200, text
    answer = json.loads(text)
    assert answer["usage"]["completion_tokens"] == 5
    assert answer["choices"][0]["text"].count(FILLER_TOKEN) == 5
    # The --kv-transfer-config JSON came through the shim whole: a consumer pulls the prompt.
    assert prompt_tokens_by_source(engine) == {"external_kv_transfer": words, "local_compute": 0}

    # The pod's preStop hook, through the python3 shim, returns once the engine is idle.
    _, flag, script, _url, names, *_ = drain_command("VLLM", "decode", 60)
    assert script == DRAIN_SCRIPT
    hook = ["python3", flag, script, engine.url + "/metrics", names, "0", "0", "10"]
    started = time.monotonic()
    subprocess.run(hook, env=engine.env, check=True, timeout=30)
    assert time.monotonic() - started < 9  # idle, not the 10 s limit

    engine.popen.send_signal(signal.SIGTERM)
    assert engine.popen.wait(STOP_TIMEOUT_S) == 0, engine.tail()


# --- the install guide's example ------------------------------------------------------------


def guide_example() -> dict[str, Any]:
    """The PDDeployment of docs/install.md's section on simulated engines."""
    guide = (ROOT / "docs" / "install.md").read_text()
    section = guide.split("## Simulated engines in a real cluster (kind)\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    documents = [yaml.safe_load(block) for block in blocks]
    found = [d for d in documents if d.get("kind") == "PDDeployment"]
    assert len(found) == 1
    example: dict[str, Any] = found[0]
    return example


def test_the_guides_example_runs_the_simulator_in_every_pool_behind_the_pinned_router(recorder):
    example = guide_example()
    example["metadata"] |= {"namespace": "default", "uid": "5e1f0000-0000-4000-8000-000000000001"}
    pdd = parse_pddeployment(example)  # as the apiserver hands it to the operator
    assert not pdd.spec.model.image.endswith(":latest")  # kind-loaded: never pulled
    for role in ("prefill", "decode"):
        for pool in pdd.spec.pools(role):
            pod = build_deployment(pdd, role, pool, 1)["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            assert container["image"] == pdd.spec.model.image
            # The operator's pod, as the kubelet starts it: the command through the shims, the
            # env with the pod's IP filled in.
            forwarded = recorder.python_argv(container["command"])
            env = {var["name"]: var.get("value", "10.244.1.7") for var in container["env"]}
            config = parse_config(forwarded[len(SIMULATOR) :], env)
            assert (config.role, config.host) == (role, "0.0.0.0")
            assert config.hardware.name == HARDWARE_PROFILES[pool.accelerator.profile].name
            hook = container["lifecycle"]["preStop"]["exec"]["command"]
            assert recorder.python_argv(hook) == hook[1:]
    router = build_router_deployment(pdd)["spec"]["template"]["spec"]["containers"][0]
    assert router["image"] == DEFAULT_IMAGES["VLLM"]
    assert build_endpoint_service(pdd)["spec"]["ports"][0]["port"] == 8000  # port-forward 8000
