"""A simulated cluster on a real apiserver: virtual nodes from a cluster profile, the mock
scheduler, the virtual kubelet (serving pods as real processes where they must serve), and kind
mode."""
