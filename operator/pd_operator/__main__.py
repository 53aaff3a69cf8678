"""`python -m pd_operator`: run the operator (same as `pdctl run`)."""

import sys

from pd_operator.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
