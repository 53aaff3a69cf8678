"""Offline replay: a trace through the engine simulator with an autoscaling policy in the loop, the
baseline policies and the oracle, and the workload families the robustness benchmark draws."""
