"""The capacity planner: pool sizes from queueing formulas (`sizing.py`), checked by replaying the
trace (`plan_replay.py`)."""
