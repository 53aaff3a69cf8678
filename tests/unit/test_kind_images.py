"""hack/kind-images.sh, read without Docker: where no registry is reachable it makes the images
with `docker import`, and what a user would notice is an image that starts differently from the
Dockerfile's (another entrypoint, user, port or PATH), or a name that the chart, the operator's
router default or the docs do not use, so that `kind load` of it leaves pods pulling."""

import json
import os
import subprocess

import pytest
import yaml

from dockerfiles import build_stages, instructions
from pd_operator.core.router import DEFAULT_IMAGES
from pdcases import ROOT

SCRIPT = ROOT / "hack" / "kind-images.sh"
OVERRIDES = (
    "OPERATOR_IMAGE",
    "ENGINE_SIM_IMAGE",
    "ROUTER_IMAGE",
    "PROMETHEUS_IMAGE",
    "PROMETHEUS_MODULE_VERSION",
)
# PYTHON_IMAGE's PATH, which the Dockerfiles' `$PATH` stands for.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def script(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in OVERRIDES}
    result = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return result.stdout.splitlines()


def split(lines: list[str]) -> list[tuple[str, str]]:
    return [(k, " ".join(rest.split())) for k, _, rest in (line.partition(" ") for line in lines)]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.engine-sim"])
def test_imported_image_config_is_the_dockerfiles_final_stage(dockerfile: str):
    final = build_stages(instructions((ROOT / dockerfile).read_text()))[-1]
    changes = split(script("changes", str(ROOT / dockerfile)))
    # PYTHON_IMAGE's own environment comes first, then the Dockerfile's, in order.
    assert changes[0] == ("ENV", f"PATH={BASE_PATH} LANG=C.UTF-8")
    for keyword in ("ENV", "LABEL", "USER", "EXPOSE", "WORKDIR"):
        want = [" ".join(rest.split()) for k, rest in final if k == keyword]
        if keyword == "ENV":
            want = [rest.replace("$PATH", BASE_PATH) for rest in want]
        got = [rest for k, rest in changes[1:] if k == keyword]
        assert got == want, keyword
    for keyword in ("ENTRYPOINT", "CMD"):  # exec form: compare the argv
        want_argv = [json.loads(rest) for k, rest in final if k == keyword]
        assert [json.loads(rest) for k, rest in changes if k == keyword] == want_argv, keyword
    assert ("USER", "65532:65532") in changes  # runAsNonRoot can verify a numeric user


def test_image_names_are_what_the_chart_the_operator_and_the_docs_use():
    operator, engine_sim, router, prometheus = script("tags")
    chart = yaml.safe_load((ROOT / "charts" / "pd-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "pd-operator" / "values.yaml").read_text())
    repository, tag = values["image"]["repository"], values["image"]["tag"] or chart["appVersion"]
    assert operator == f"{repository}:{tag}"  # helm install without --set image.*
    assert router == DEFAULT_IMAGES["VLLM"]  # a router pod starts from what kind load put there
    assert f"image: {engine_sim}" in (ROOT / "docs" / "install.md").read_text()
    # The in-cluster Prometheus of make kind-e2e starts from what kind load put there.
    manifest = yaml.safe_load_all((ROOT / "config" / "kind" / "prometheus.yaml").read_text())
    (deployment,) = [doc for doc in manifest if doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == prometheus
    # Prometheus' Go module v0.316.0 is its release 3.16.0.
    assert prometheus == "prom/prometheus:v3.16.0"
    # `latest` would default imagePullPolicy to Always, which fails for a loaded image.
    assert not any(
        ref.endswith(":latest") or ":" not in ref
        for ref in (operator, engine_sim, router, prometheus)
    )
