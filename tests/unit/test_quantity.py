"""Kubernetes quantities: exact values, and a clear ValueError for anything else."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from pd_operator.core.quantity import parse_quantity, same_quantity

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
digits = st.text("0123456789", min_size=1, max_size=6)


@st.composite
def quantities(draw: st.DrawFn) -> str:
    """Strings of Kubernetes' quantity grammar: a signed decimal, then an exponent or a suffix."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole, fraction = draw(digits), draw(st.one_of(st.just(""), digits))
    number = draw(st.sampled_from([whole, f"{whole}.{fraction}", f".{draw(digits)}"]))
    tail = draw(
        st.one_of(
            st.sampled_from(SUFFIXES),
            st.builds(lambda e, n: f"{e}{n}", st.sampled_from(["e", "E", "e-", "E+"]), digits),
        )
    )
    return f"{sign}{number}{tail}"


@given(quantities())
def test_every_quantity_of_the_grammar_parses_to_what_the_kubernetes_client_reads(text):
    assert parse_quantity(text) == client_parse_quantity(text)


@given(st.text("0123456789.eEkmMGKi+- x", max_size=12))
@example("1.2.3")  # a version string in an env value: once raised decimal.InvalidOperation
@example("0.11.0")
@example(".")
@example("1e")
@example("0E ")  # trailing space: once read as 0, the apiserver refuses it
@example("")
def test_anything_else_is_a_value_error_never_a_crash(text):
    try:
        value = parse_quantity(text)
    except ValueError:
        return
    assert value == client_parse_quantity(text)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("1000m", "1", True),
        ("1Gi", "1073741824", True),
        ("0.11.0", "0.11.1", False),
        (1, "1", True),
        # The apiserver stores a Quantity at milli precision, rounded up: what it returns for
        # "0.1m" is "1m", and re-applying on every reconcile would never converge.
        ("0.1m", "1m", True),
        ("1.5m", "2m", True),
        ("0.0001", "1m", True),
        ("1.5m", "1m", False),
        # A memory size keeps more precision, written back with a suffix of its own.
        ("0.0001", "100u", True),
        ("1.5m", "1500u", True),
        ("1.5m", "1501u", False),
    ],
)
def test_same_quantity_compares_values_and_never_raises(a, b, same):
    assert same_quantity(a, b) is same
