"""`python -m dflash_tui.agent`: the agent from a checkout (the link ships the bundle instead)."""

import sys

from dflash_tui.agent.main import main

sys.exit(main())
