import sys

from daemons.dmonitoringmodeld.daemon import main

sys.exit(main())
