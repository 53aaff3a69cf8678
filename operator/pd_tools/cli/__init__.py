"""`pdctl`: the command line, one module per command group (`main.py` assembles them)."""
