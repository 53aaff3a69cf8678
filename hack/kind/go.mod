// Small programs for the offline kind node image (hack/kindenv.sh); standard library only.
module pdoperator.io/hack/kind

go 1.26.0
