"""`python -m pd_operator`: run the operator (the same command as `pdctl run`)."""

import sys

from pd_operator.cli.arguments import exit_status
from pd_operator.cli.run import run

if __name__ == "__main__":
    sys.exit(
        exit_status(
            lambda: run.main(
                sys.argv[1:],
                prog_name="python -m pd_operator",  # the image has no pdctl
                standalone_mode=False,
                # the same context as under pdctl: defaults shown, -h
                show_default=True,
                help_option_names=["-h", "--help"],
            )
        )
    )
