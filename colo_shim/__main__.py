import sys

from colo_shim.cli import main

sys.exit(main())
