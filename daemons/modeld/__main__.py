import sys

from daemons.modeld.daemon import main

sys.exit(main())
