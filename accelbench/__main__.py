"""``python -m accelbench``: the command line, as the ``accelbench`` script runs it."""

from accelbench.cli import main

raise SystemExit(main())
