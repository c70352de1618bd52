"""``python -m trainop`` is the ``trainop`` command."""

import sys

from trainop import cli

sys.exit(cli.main())
