import sys

from ccddp.cli import main

sys.exit(main())
