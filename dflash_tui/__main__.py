import sys

from dflash_tui.cli import main

sys.exit(main())
