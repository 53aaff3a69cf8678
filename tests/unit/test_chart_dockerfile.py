"""The operator image's Dockerfile, read as text (images cannot be built on CI's machines).

What a user would notice: a root or `latest` image, an entrypoint that is not the operator, a
COPY of a file that .dockerignore keeps out of the context (the build breaks), or ports that do
not match the chart.
"""

import re
import shlex
import tomllib

import yaml

from dockerfiles import build_stages, instructions
from pdcases import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (ROOT / ".dockerignore").read_text()


INSTRUCTIONS = instructions(DOCKERFILE)


def build_args() -> dict[str, str]:
    args = {}
    for keyword, rest in INSTRUCTIONS:
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def base_images() -> list[str]:
    args = build_args()
    images = []
    for keyword, rest in INSTRUCTIONS:
        if keyword == "FROM":
            image = rest.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image))
    return images


def test_multi_stage_build_on_a_pinned_python_311_slim_image():
    images = base_images()
    assert len(images) >= 2
    for image in images:
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and "latest" not in image, image
        assert name in ("python", "docker.io/library/python"), image
        assert tag.startswith("3.11") and "slim" in tag, image
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"


def test_final_stage_runs_the_operator_module_as_a_non_root_numeric_user():
    final = build_stages(INSTRUCTIONS)[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the final stage sets no USER: the operator would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, users[-1]  # numeric: runAsNonRoot can verify it
    assert not gid or (gid.isdigit() and int(gid) != 0)
    entrypoint = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert len(entrypoint) == 1
    argv = yaml.safe_load(entrypoint[0])  # exec form: a JSON array, no shell in between
    assert isinstance(argv, list)
    assert argv[0].endswith("python") and argv[1:] == ["-m", "pd_operator"]
    # Nothing is built or installed in the final image: it only copies the build's virtualenv.
    assert not [rest for keyword, rest in final if keyword == "RUN"]
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies)


def test_image_exposes_the_charts_default_ports():
    values = yaml.safe_load((ROOT / "charts" / "pd-operator" / "values.yaml").read_text())
    exposed = {
        int(port)
        for keyword, rest in build_stages(INSTRUCTIONS)[-1]
        if keyword == "EXPOSE"
        for port in rest.split()
    }
    assert exposed == set(values["ports"].values())


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `**` spans directories, `*` and `?` do not."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context (last match wins; a
    matching folder takes everything below it)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for line in DOCKERIGNORE.splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        regex = _pattern(pattern.lstrip("!").strip("/"))
        if any(regex.match(prefix) for prefix in prefixes):
            result = not negate
    return result


def test_everything_the_build_copies_is_in_the_build_context():
    sources = []
    for keyword, rest in INSTRUCTIONS:
        if keyword == "COPY" and not rest.startswith("--from="):
            *paths, _destination = shlex.split(rest)
            sources += [p.rstrip("/") for p in paths if not p.startswith("--")]
    assert "operator/pd_operator" in sources and "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f".dockerignore excludes {source}, which the Dockerfile copies"
    assert not ignored("operator/pd_operator/__init__.py")


def test_build_context_leaves_out_local_state_and_secrets():
    for path in (".venv/bin/python", ".git/config", "tests/conftest.py", ".mypy_cache/x",
                 "operator/pd_operator/__pycache__/x.pyc", "operator/pd_operator.egg-info/PKG-INFO",
                 "kubeconfig"):  # fmt: skip
        assert ignored(path), path


def test_the_operator_image_carries_the_operator_package_and_not_the_tooling():
    copied = [
        path.rstrip("/")
        for keyword, rest in INSTRUCTIONS
        if keyword == "COPY" and not rest.startswith("--from=")
        for path in shlex.split(rest)[:-1]
    ]
    assert "operator/pd_operator" in copied
    assert not any(path in ("operator", "operator/pd_tools") for path in copied), copied
    # the wheel's `pdctl` script would point at pd_tools, which the image does not have
    run = " ".join(rest for keyword, rest in INSTRUCTIONS if keyword == "RUN")
    assert "rm /opt/pd-operator/bin/pdctl" in run
