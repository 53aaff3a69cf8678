"""pd-operator's tooling: what runs on a laptop or in CI, never in the cluster. It may import
`pd_operator`; the operator never imports it (`make lint` checks both)."""
