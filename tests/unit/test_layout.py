"""Repository layout rules that keep imports and layering sound."""

import ast
import operator
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "pd_operator"
IO_LIBRARIES = {"kopf", "kubernetes", "prometheus_api_client", "requests", "aiohttp", "urllib3"}


def test_import_operator_is_the_standard_library():
    # operator/ is a source folder; a package of that name would shadow the stdlib module.
    assert operator.__name__ == "operator"
    assert hasattr(operator, "itemgetter")
    assert Path(operator.__file__).parent == Path(sys.modules["os"].__file__).parent
    assert not (PACKAGE.parent / "__init__.py").exists()


def test_core_imports_no_io_library():
    offenders = []
    for path in (PACKAGE / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in IO_LIBRARIES]
    assert offenders == []
