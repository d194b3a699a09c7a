import sys

from benchmarks.compare.cli import main

sys.exit(main())
