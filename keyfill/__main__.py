import sys

from keyfill.cli import main

sys.exit(main())
