"""pd-operator: prefill/decode pools on heterogeneous accelerators, scaled from SLO metrics."""

__version__ = "0.1.0"
