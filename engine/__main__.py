import sys

from engine.cli import main

if __name__ == "__main__":  # not when a tensor-parallel worker's spawn imports this module
    sys.exit(main())
