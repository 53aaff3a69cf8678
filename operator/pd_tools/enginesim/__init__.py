"""The engine simulator: a PD deployment's engines as a discrete-event model (`engine.py`), the
same model in wall-clock time behind vLLM's and SGLang's HTTP APIs (`http_engine.py`), and their
Prometheus metrics."""
